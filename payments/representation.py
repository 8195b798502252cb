"""How a payment and a recurring payment are shown: the API's representations of them
(GET /payments/{id}, /recurring/{id}, the lists) and the ``data`` of every webhook event
about them (webhooks/payloads.py). Below the API and the webhooks, so that both render
through the same serializers and a webhook shows exactly what GET shows."""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from .fields import StrictDateTimeField, StrictDurationField, format_utc
from .models import (
    ExecutionAttempt,
    PaymentStatus,
    Payout,
    PayoutState,
    RecurringPayment,
    RecurringStatus,
    ReviewReason,
    ScheduledPayment,
)


class PayoutSerializer(serializers.ModelSerializer):
    state = serializers.ChoiceField(
        choices=PayoutState.choices,
        help_text="pending: funds reserved, the rail's answer not known yet; paid; declined (money back); voided "
        "(staff resolved it once the rail confirmed it holds no payout).",
    )
    reference = serializers.CharField(help_text="The rail's payout id once paid; empty before.")
    paid_at = StrictDateTimeField(allow_null=True, help_text="When the rail paid it (its settlement day).")

    class Meta:
        model = Payout
        fields = ["rail", "destination", "state", "reference", "paid_at", "decline_code", "submissions", "lookups"]
        read_only_fields = fields


class AttemptSerializer(serializers.ModelSerializer):
    started_at = StrictDateTimeField()
    finished_at = StrictDateTimeField()

    class Meta:
        model = ExecutionAttempt
        fields = ["attempt", "started_at", "finished_at", "outcome", "error"]
        read_only_fields = fields


class PaymentSerializer(serializers.ModelSerializer):
    payment_id = serializers.CharField(source="id")
    from_account = serializers.CharField(source="from_account_id")
    to_account = serializers.CharField(source="to_account_id", allow_null=True, help_text="null for a payout.")
    to_payee = serializers.CharField(source="to_payee_id", allow_null=True, help_text="A payout's payee; else null.")
    payout = serializers.SerializerMethodField()
    execute_at = StrictDateTimeField(help_text="When the payment is due: requested_execute_at plus the jitter drawn.")
    requested_execute_at = serializers.SerializerMethodField()
    jitter_seconds = serializers.IntegerField()
    expires_after = StrictDurationField(allow_null=True)
    executed_at = StrictDateTimeField(allow_null=True)
    cancelled_at = StrictDateTimeField(allow_null=True)
    created_at = StrictDateTimeField()
    failure_reason = serializers.SerializerMethodField()
    recurring_id = serializers.CharField(
        allow_null=True, help_text="The recurring payment that generated this one, or null."
    )
    occurrence_at = StrictDateTimeField(allow_null=True, help_text="Its occurrence in that series, or null.")
    version = serializers.IntegerField(help_text="Bumped by every change; also the ETag. Send it in If-Match.")
    next_attempt_at = serializers.SerializerMethodField()
    tries = serializers.IntegerField(
        help_text="Times a worker started this payment since it was scheduled or last re-driven, each counted "
        "once its attempt ended; DELAYPAY_MAX_ATTEMPTS of them without an outcome park it in NEEDS_REVIEW."
    )
    review_reason = serializers.SerializerMethodField()
    attempts = AttemptSerializer(many=True, read_only=True)

    class Meta:
        model = ScheduledPayment
        fields = [
            "payment_id",
            "status",
            "amount",
            "from_account",
            "to_account",
            "to_payee",
            "payout",
            "execute_at",
            "requested_execute_at",
            "jitter_seconds",
            "expires_after",
            "executed_at",
            "cancelled_at",
            "failure_reason",
            "recurring_id",
            "occurrence_at",
            "version",
            "created_at",
            "next_attempt_at",
            "tries",
            "review_reason",
            "attempts",
        ]
        read_only_fields = fields

    def get_failure_reason(self, obj) -> str | None:
        return obj.failure_reason or None

    @extend_schema_field(PayoutSerializer(allow_null=True, help_text="A payout's record at its rail once its funds "
                                          "were reserved; null for internal payments and payouts not yet run."))
    def get_payout(self, obj) -> dict | None:
        if obj.to_payee_id is None:
            return None
        try:
            payout = obj.payout  # the reverse one-to-one: cached when the query selected it
        except Payout.DoesNotExist:
            return None
        return PayoutSerializer(payout).data

    @extend_schema_field(
        StrictDateTimeField(
            allow_null=True,
            help_text="SCHEDULED only: when a retry after an error (on the DELAYPAY_RETRY_DELAYS ladder) or a "
            "re-drive with an execute_at may run; null when the payment is due at execute_at or is not waiting.",
        )
    )
    def get_next_attempt_at(self, obj) -> str | None:
        if obj.status != PaymentStatus.SCHEDULED:
            return None
        return format_utc(obj.next_attempt_at)

    @extend_schema_field(
        serializers.ChoiceField(
            choices=ReviewReason.choices,
            allow_null=True,
            help_text="NEEDS_REVIEW only: why it was parked; null otherwise.",
        )
    )
    def get_review_reason(self, obj) -> str | None:
        if obj.status != PaymentStatus.NEEDS_REVIEW:
            return None
        return obj.review_reason or None

    @extend_schema_field(StrictDateTimeField(help_text="The execute_at you asked for."))
    def get_requested_execute_at(self, obj) -> str:
        return format_utc(obj.requested_execute_at or obj.execute_at)


class RecurringPaymentSerializer(serializers.ModelSerializer):
    recurring_id = serializers.CharField(source="id")
    from_account = serializers.CharField(source="from_account_id")
    to_account = serializers.CharField(source="to_account_id", allow_null=True, help_text="null for payouts.")
    to_payee = serializers.CharField(source="to_payee_id", allow_null=True, help_text="The payee of a payout series.")
    start_at = StrictDateTimeField()
    interval = serializers.SerializerMethodField()
    cron = serializers.SerializerMethodField()
    end_at = StrictDateTimeField(allow_null=True)
    count = serializers.IntegerField(allow_null=True)
    ends_at = StrictDateTimeField(
        source="last_at",
        allow_null=True,
        help_text="The series' last possible instant, from end_at and count (whichever is first); null: open-ended.",
    )
    next_occurrence_at = serializers.SerializerMethodField()
    version = serializers.IntegerField(help_text="Bumped by every change; also the ETag. Send it in If-Match.")
    created_at = StrictDateTimeField()
    updated_at = StrictDateTimeField()

    class Meta:
        model = RecurringPayment
        fields = [
            "recurring_id",
            "status",
            "amount",
            "from_account",
            "to_account",
            "to_payee",
            "start_at",
            "interval",
            "cron",
            "timezone",
            "end_at",
            "count",
            "ends_at",
            "next_occurrence_at",
            "version",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_interval(self, obj) -> str | None:
        return obj.interval or None

    def get_cron(self, obj) -> str | None:
        return obj.cron or None

    @extend_schema_field(
        StrictDateTimeField(
            allow_null=True,
            help_text="The occurrence after the one already scheduled (see occurrences): it becomes a payment "
            "when that one falls due. null unless ACTIVE.",
        )
    )
    def get_next_occurrence_at(self, obj) -> str | None:
        if obj.status != RecurringStatus.ACTIVE:
            return None
        return format_utc(obj.next_occurrence_at)
