"""Request parsing and response rendering. No business rules here: those are in the
services; these only say what shape a request must have."""

from django.conf import settings
from rest_framework import serializers

from ledger.models import Account, Transfer
from payments.models import ExecutionAttempt, ScheduledPayment

from .fields import StrictCharField, StrictDateTimeField, StrictIntegerField


class StrictSerializer(serializers.Serializer):
    """Rejects a body that is not a JSON object or that carries unknown fields."""

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["Expected a JSON object."]})
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


def amount_field(**kwargs):
    return StrictIntegerField(min_value=1, max_value=settings.DELAYPAY_MAX_AMOUNT, **kwargs)


class TokenRequestSerializer(StrictSerializer):
    username = StrictCharField(max_length=150)
    password = StrictCharField(max_length=1024, trim_whitespace=False, style={"input_type": "password"})


class TokenResponseSerializer(serializers.Serializer):
    token = serializers.CharField()


class AccountCreateSerializer(StrictSerializer):
    name = StrictCharField(max_length=100)


class AccountSerializer(serializers.ModelSerializer):
    account_id = serializers.CharField(source="id")
    owner = serializers.CharField(source="owner.username", default=None)
    created_at = StrictDateTimeField()

    class Meta:
        model = Account
        fields = ["account_id", "name", "kind", "status", "balance", "owner", "created_at"]


class DepositCreateSerializer(StrictSerializer):
    amount = amount_field()


class TransferSerializer(serializers.ModelSerializer):
    transfer_id = serializers.IntegerField(source="id")
    key = serializers.CharField()
    debit_account = serializers.CharField(source="debit_account_id")
    credit_account = serializers.CharField(source="credit_account_id")
    created_at = StrictDateTimeField()

    class Meta:
        model = Transfer
        fields = ["transfer_id", "key", "debit_account", "credit_account", "amount", "created_at"]


class PaymentCreateSerializer(StrictSerializer):
    from_account = StrictCharField(max_length=40)
    to_account = StrictCharField(max_length=40)
    amount = amount_field()
    execute_at = StrictDateTimeField()


class AttemptSerializer(serializers.ModelSerializer):
    started_at = StrictDateTimeField()
    finished_at = StrictDateTimeField()

    class Meta:
        model = ExecutionAttempt
        fields = ["attempt", "started_at", "finished_at", "outcome", "error"]


class PaymentSerializer(serializers.ModelSerializer):
    payment_id = serializers.CharField(source="id")
    from_account = serializers.CharField(source="from_account_id")
    to_account = serializers.CharField(source="to_account_id")
    execute_at = StrictDateTimeField()
    executed_at = StrictDateTimeField()
    cancelled_at = StrictDateTimeField()
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

    def get_failure_reason(self, obj) -> str | None:
        return obj.failure_reason or None
