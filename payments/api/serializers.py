"""Request parsing and response rendering. No business rules here: those are in the
services; these only say what shape a request must have."""

from django.conf import settings
from rest_framework import serializers

from ledger.models import Account, Transfer
from payments.models import ExecutionAttempt, PaymentStatus, ScheduledPayment

from .fields import StrictCharField, StrictDateTimeField, StrictIntegerField
from .pagination import MAX_CURSOR_LENGTH, MAX_LIMIT


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
    token = serializers.CharField(help_text="Send as `Authorization: Token <token>`.")


class AccountCreateSerializer(StrictSerializer):
    name = StrictCharField(max_length=100)


class AccountSerializer(serializers.ModelSerializer):
    account_id = serializers.CharField(source="id")
    owner = serializers.CharField(source="owner.username", default=None, allow_null=True)
    created_at = StrictDateTimeField()

    class Meta:
        model = Account
        fields = ["account_id", "name", "kind", "status", "balance", "owner", "created_at"]
        read_only_fields = fields


class DepositCreateSerializer(StrictSerializer):
    amount = amount_field()


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


class PaymentCreateSerializer(StrictSerializer):
    from_account = StrictCharField(max_length=40, help_text="An active account you own.")
    to_account = StrictCharField(max_length=40, help_text="Any account that is not closed.")
    amount = amount_field(help_text="Whole units, a JSON integer. Funds are checked at execution time, not now.")
    execute_at = StrictDateTimeField(
        help_text="RFC 3339 with an offset, after now and at most "
        f"{settings.DELAYPAY_MAX_SCHEDULE_DAYS} days ahead."
    )


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
    to_account = serializers.CharField(source="to_account_id")
    execute_at = StrictDateTimeField()
    executed_at = StrictDateTimeField(allow_null=True)
    cancelled_at = StrictDateTimeField(allow_null=True)
    created_at = StrictDateTimeField()
    failure_reason = serializers.SerializerMethodField()
    attempts = AttemptSerializer(many=True, read_only=True)

    class Meta:
        model = ScheduledPayment
        fields = [
            "payment_id",
            "status",
            "amount",
            "from_account",
            "to_account",
            "execute_at",
            "executed_at",
            "cancelled_at",
            "failure_reason",
            "version",
            "created_at",
            "attempts",
        ]
        read_only_fields = fields

    def get_failure_reason(self, obj) -> str | None:
        return obj.failure_reason or None
