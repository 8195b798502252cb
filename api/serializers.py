"""Request parsing and response rendering. No business rules here: those are in the
services; these only say what shape a request must have."""

import re

from django.conf import settings
from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from api.pagination import MAX_CURSOR_LENGTH, MAX_LIMIT
from api.schema import page_of
from ledger.models import Account, DepositRequest, Transfer
from ledger.services import MAX_REASON as MAX_STAFF_REASON
from payments.fields import (
    DisplayTextField,
    StrictCharField,
    StrictDateTimeField,
    StrictDurationField,
    StrictIntegerField,
)
from payments.models import (
    Payee,
    PaymentStatus,
    Rail,
    RecurringStatus,
    ScheduledPayment,
)
from payments.representation import (  # the payment and recurring payment as GET shows them
    PaymentSerializer,
    RecurringPaymentSerializer,
)
from payments.rules import MAX_COUNT, MAX_CRON_COUNT
from payments.services import MAX_JITTER_SECONDS, MAX_REVIEW_REASON

DESTINATION_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


class StrictSerializer(serializers.Serializer):
    """Rejects a body that is not a JSON object or that carries unknown fields."""

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["Expected a JSON object."]})
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


class StrictQuerySerializer(serializers.Serializer):
    """Query parameters: unknown or repeated ones are rejected (a typo such as
    ``?stauts=FAILED`` must not silently list everything)."""

    @classmethod
    def parse(cls, request) -> dict:
        params = request.query_params
        errors = {name: ["Unknown query parameter."] for name in params if name not in cls().fields}
        errors |= {name: ["Give this parameter once."] for name in params if len(params.getlist(name)) > 1}
        if errors:
            raise serializers.ValidationError(errors)
        query = cls(data=params.dict())
        query.is_valid(raise_exception=True)
        return query.validated_data


class PageQuerySerializer(StrictQuerySerializer):
    cursor = serializers.CharField(
        required=False, max_length=MAX_CURSOR_LENGTH, help_text="Opaque `next_cursor` of the previous page."
    )
    limit = serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_LIMIT, help_text=f"Items per page, 1-{MAX_LIMIT}; default 20."
    )


class PaymentPageQuerySerializer(PageQuerySerializer):
    status = serializers.ChoiceField(
        choices=PaymentStatus.choices, required=False, help_text="Only payments in this status."
    )


def amount_field(**kwargs):
    return StrictIntegerField(min_value=1, max_value=settings.DELAYPAY_MAX_AMOUNT, **kwargs)


class TokenRequestSerializer(StrictSerializer):
    username = StrictCharField(max_length=150)
    password = StrictCharField(max_length=1024, trim_whitespace=False, style={"input_type": "password"})


class TokenResponseSerializer(serializers.Serializer):
    token = serializers.CharField(
        help_text="Send as `Authorization: Token <token>`. Shown once: only its digest is stored."
    )
    expires_at = StrictDateTimeField(
        help_text="When the token stops working (DELAYPAY_TOKEN_TTL_HOURS after issue); then ask for a new one."
    )


class AccountCreateSerializer(StrictSerializer):
    name = DisplayTextField(max_length=100)


class AccountSerializer(serializers.ModelSerializer):
    account_id = serializers.CharField(source="id")
    owner = serializers.CharField(source="owner.username", default=None, allow_null=True)
    created_at = StrictDateTimeField()

    class Meta:
        model = Account
        fields = ["account_id", "name", "kind", "status", "balance", "owner", "created_at"]
        read_only_fields = fields


def staff_reason_field(**kwargs):
    return DisplayTextField(
        max_length=MAX_STAFF_REASON,
        help_text="Why, in a sentence: recorded with your user in the ledger's staff actions.",
        **kwargs,
    )


class DepositCreateSerializer(StrictSerializer):
    amount = amount_field(
        help_text="Whole units. At or below DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD it is deposited at once (201); "
        "above it the deposit waits for another staff member's approval (202)."
    )
    reason = staff_reason_field()


class DepositRequestSerializer(serializers.ModelSerializer):
    request_id = serializers.CharField(source="id")
    account_id = serializers.CharField()
    status = serializers.ChoiceField(choices=DepositRequest.Status.choices)
    requested_by = serializers.CharField(source="requested_by.username")
    beneficiary = serializers.CharField(
        source="beneficiary.username", help_text="The account's owner: may never approve this request."
    )
    why = serializers.ChoiceField(
        choices=DepositRequest.Why.choices,
        help_text="Why it waits for a second person: above_threshold (the amount), own_account (into the "
        "requester's own account), actor_window / beneficiary_window (the requester's, or the account owner's, "
        "deposits made without a second person within DELAYPAY_DEPOSIT_APPROVAL_WINDOW_HOURS would pass "
        "DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD).",
    )
    decided_by = serializers.CharField(source="decided_by.username", default=None, allow_null=True)
    decided_at = StrictDateTimeField(allow_null=True)
    created_at = StrictDateTimeField()
    deposit_id = serializers.SerializerMethodField(
        help_text="The ledger key of the deposit (the request's id) once approved; null before."
    )

    class Meta:
        model = DepositRequest
        fields = [
            "request_id", "account_id", "amount", "reason", "status", "why", "requested_by", "beneficiary",
            "created_at", "decided_by", "decided_at", "decision_reason", "deposit_id",
        ]
        read_only_fields = fields

    def get_deposit_id(self, obj) -> str | None:
        return obj.id if obj.status == DepositRequest.Status.APPROVED else None


class DepositRequestPageQuerySerializer(PageQuerySerializer):
    status = serializers.ChoiceField(
        choices=DepositRequest.Status.choices, required=False, help_text="Only requests in this status."
    )
    account_id = serializers.CharField(required=False, max_length=40, help_text="Only requests into this account.")


class DepositDecisionSerializer(StrictSerializer):
    reason = staff_reason_field()


class PaymentCancelQuerySerializer(StrictQuerySerializer):
    reason = DisplayTextField(
        required=False,
        max_length=MAX_STAFF_REASON,
        help_text="Required when staff cancel someone else's payment: why, recorded with your user in the "
        "ledger's staff actions. Ignored on your own payment.",
    )


class DepositSerializer(serializers.Serializer):
    deposit_id = serializers.CharField()
    account_id = serializers.CharField()
    amount = serializers.IntegerField()
    balance = serializers.IntegerField(help_text="The account's balance right after the deposit.")
    created_at = StrictDateTimeField()


class TransferSerializer(serializers.ModelSerializer):
    transfer_id = serializers.IntegerField(source="id")
    key = serializers.CharField(help_text="The payment id for a payment, `dep_...` for a deposit.")
    debit_account = serializers.CharField(source="debit_account_id")
    credit_account = serializers.CharField(source="credit_account_id")
    created_at = StrictDateTimeField()

    class Meta:
        model = Transfer
        fields = ["transfer_id", "key", "debit_account", "credit_account", "amount", "created_at"]
        read_only_fields = fields


class AtLeastOneFieldSerializer(StrictSerializer):
    """A PATCH body: the fields to change, at least one of them."""

    def validate(self, attrs):
        if not attrs:
            raise serializers.ValidationError(
                {"non_field_errors": [f"Give at least one of: {', '.join(self.fields)}."]}
            )
        return attrs


# The schema of what these serializers refuse (registered with drf-spectacular when this
# module is imported, as every view imports it).
class StrictSerializerExtension(OpenApiSerializerExtension):
    """A request body read by a StrictSerializer refuses a field it does not declare, so
    its schema says ``additionalProperties: false``; a PATCH body (AtLeastOneFieldSerializer)
    refuses ``{}``, so its schema says ``minProperties: 1``. Responses are left as they are."""

    target_class = "api.serializers.StrictSerializer"
    match_subclasses = True

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        if direction == "request":
            schema["additionalProperties"] = False
            if isinstance(self.target, AtLeastOneFieldSerializer):
                schema["minProperties"] = 1
        return schema


def execute_at_field(**kwargs):
    return StrictDateTimeField(
        help_text="RFC 3339 with an offset, after now and at most "
        f"{settings.DELAYPAY_MAX_SCHEDULE_DAYS} days ahead.",
        **kwargs,
    )


class PaymentCreateSerializer(StrictSerializer):
    from_account = StrictCharField(max_length=40, help_text="An active account you own.")
    to_account = StrictCharField(
        required=False, max_length=40,
        help_text="Any account that is not closed: an internal transfer. Give exactly one of to_account and to_payee.",
    )
    to_payee = StrictCharField(
        required=False, max_length=40,
        help_text="One of your payees (`pye_...`): a payout through the payee's rail. Its funds are reserved when "
        "it runs and leave the ledger once the rail has paid it.",
    )
    amount = amount_field(help_text="Whole units, a JSON integer. Funds are checked at execution time, not now.")
    execute_at = execute_at_field()
    jitter_seconds = StrictIntegerField(
        required=False,
        min_value=0,
        max_value=MAX_JITTER_SECONDS,
        help_text="Opt-in spread, 0-3600 (default 0): the payment runs at an instant drawn uniformly in "
        "[execute_at, execute_at + jitter_seconds] now, never earlier than execute_at. The response gives "
        "both: requested_execute_at (yours) and execute_at (drawn).",
    )
    expires_after = StrictDurationField(
        required=False,
        help_text="Optional overdue limit, an ISO 8601 duration of 1 second to 365 days in weeks, days, hours, "
        "minutes and seconds (PT30M, P1DT12H). If no worker applies the payment by execute_at + expires_after "
        "(an outage), it ends FAILED with failure_reason `expired` and nothing moves. Without it a late payment "
        "runs late, never dropped.",
    )


class PaymentUpdateSerializer(AtLeastOneFieldSerializer):
    amount = amount_field(required=False, help_text="The new amount (a JSON integer).")
    execute_at = execute_at_field(required=False)


def review_reason_field(**kwargs):
    return DisplayTextField(
        max_length=MAX_REVIEW_REASON,
        help_text="Why, in a sentence: it goes into the payment's audit trail with your user.",
        **kwargs,
    )


class PaymentRedriveSerializer(StrictSerializer):
    reason = review_reason_field()
    execute_at = StrictDateTimeField(
        required=False,
        help_text="Optional RFC 3339 time with an offset to run it at (after now and at most "
        f"{settings.DELAYPAY_MAX_SCHEDULE_DAYS} days ahead); without it the payment is due at once.",
    )


class PaymentResolveSerializer(StrictSerializer):
    outcome = serializers.ChoiceField(
        choices=[("failed", "failed")],
        help_text='Only "failed": no money moved for a payment in review, so there is nothing else to resolve '
        "it to.",
    )
    reason = review_reason_field()


class PayeeCreateSerializer(StrictSerializer):
    name = DisplayTextField(max_length=100)
    rail = serializers.ChoiceField(choices=Rail.choices, help_text="The rail that pays this payee.")
    destination = StrictCharField(
        max_length=64, help_text="The payee's account at the rail: 1-64 of A-Z a-z 0-9 _ . : -",
    )

    def validate_destination(self, value: str) -> str:
        if not DESTINATION_RE.fullmatch(value):
            raise serializers.ValidationError("1-64 characters of A-Z a-z 0-9 _ . : -")
        return value


class PayeeSerializer(serializers.ModelSerializer):
    payee_id = serializers.CharField(source="id")
    created_at = StrictDateTimeField()

    class Meta:
        model = Payee
        fields = ["payee_id", "name", "rail", "destination", "created_at"]
        read_only_fields = fields


# --- recurring payments -----------------------------------------------------------------


class RecurringPageQuerySerializer(PageQuerySerializer):
    status = serializers.ChoiceField(
        choices=RecurringStatus.choices, required=False, help_text="Only recurring payments in this status."
    )


def count_field(**kwargs):
    return StrictIntegerField(
        min_value=1,
        max_value=MAX_COUNT,
        allow_null=True,
        help_text=f"End after this many occurrences, 1-{MAX_COUNT} (at most {MAX_CRON_COUNT} with a cron rule), "
        "counted from start_at; fixed when set, so occurrences skipped while paused still use up their place. "
        "null: no count.",
        **kwargs,
    )


def end_at_field(**kwargs):
    return StrictDateTimeField(
        allow_null=True, help_text="No occurrence after this instant (RFC 3339). null: no end.", **kwargs
    )


class RecurringCreateSerializer(StrictSerializer):
    from_account = StrictCharField(max_length=40, help_text="An active account you own.")
    to_account = StrictCharField(
        required=False, max_length=40, help_text="Any account that is not closed. Give exactly one of to_account "
        "and to_payee.",
    )
    to_payee = StrictCharField(required=False, max_length=40, help_text="One of your payees: a series of payouts.")
    amount = amount_field(help_text="Whole units per occurrence, a JSON integer.")
    start_at = StrictDateTimeField(
        help_text="The series' first instant (RFC 3339); at most "
        f"{settings.DELAYPAY_MAX_SCHEDULE_DAYS} days ahead and not before 1970-01-01T00:00:00Z. Occurrences "
        "before now are not paid."
    )
    interval = StrictCharField(
        required=False,
        max_length=40,
        help_text="ISO 8601 duration between occurrences: P1D, P1W, P1M (calendar months: the 31st becomes the "
        "last day of shorter months), PT6H. Days, weeks, months and years keep the wall-clock time in `timezone` "
        "across daylight-saving changes; hours, minutes and seconds are elapsed time. Give interval or cron.",
    )
    cron = StrictCharField(
        required=False,
        max_length=120,
        help_text="A five-field cron expression evaluated in `timezone`, e.g. `0 12 * * FRI`, that matches at least "
        "once every 366 days. Give interval or cron.",
    )
    timezone = StrictCharField(
        required=False, max_length=64, help_text="IANA time zone of the rule, e.g. Europe/Berlin; default UTC."
    )
    end_at = end_at_field(required=False)
    count = count_field(required=False)


class RecurringUpdateSerializer(AtLeastOneFieldSerializer):
    amount = amount_field(required=False, help_text="The amount of future occurrences.")
    start_at = StrictDateTimeField(required=False, help_text="A new anchor for the rule.")
    interval = StrictCharField(required=False, max_length=40, help_text="Replaces the rule (and clears cron).")
    cron = StrictCharField(required=False, max_length=120, help_text="Replaces the rule (and clears interval).")
    timezone = StrictCharField(required=False, max_length=64)
    end_at = end_at_field(required=False)
    count = count_field(required=False)


class OccurrenceSerializer(serializers.ModelSerializer):
    payment_id = serializers.CharField(source="id")
    occurrence_at = StrictDateTimeField(help_text="The occurrence of the rule this payment is for.")
    execute_at = StrictDateTimeField()
    failure_reason = serializers.SerializerMethodField()

    class Meta:
        model = ScheduledPayment
        fields = ["payment_id", "occurrence_at", "execute_at", "amount", "status", "failure_reason"]
        read_only_fields = fields

    get_failure_reason = PaymentSerializer.get_failure_reason


class RecurringPaymentDetailSerializer(RecurringPaymentSerializer):
    """The recurring payment with one page of its occurrences, newest first (context
    ``occurrences``: the page already rendered)."""

    occurrences = serializers.SerializerMethodField()

    class Meta(RecurringPaymentSerializer.Meta):
        fields = [*RecurringPaymentSerializer.Meta.fields, "occurrences"]
        read_only_fields = fields

    @extend_schema_field(page_of(OccurrenceSerializer, "OccurrencePage"))
    def get_occurrences(self, obj) -> dict:
        return self.context["occurrences"]
