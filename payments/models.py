"""The schedule. A ScheduledPayment row *is* the scheduled job: there is no other copy.

Status moves forward only (ALLOWED_TRANSITIONS documents it; a trigger installed by
migration 0002 enforces it, and every transition in the code is a conditional UPDATE).
"""

from django.conf import settings
from django.db import models
from django.db.models.functions import Now

from delaypay.ids import new_id


def new_payment_id() -> str:
    return new_id("pay")


class PaymentStatus(models.TextChoices):
    SCHEDULED = "SCHEDULED"
    EXECUTING = "EXECUTING"
    EXECUTED = "EXECUTED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


TERMINAL_STATUSES = frozenset({PaymentStatus.EXECUTED, PaymentStatus.FAILED, PaymentStatus.CANCELLED})

# Documentation of the state machine; the database trigger is what enforces it.
ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    PaymentStatus.SCHEDULED: frozenset({PaymentStatus.EXECUTING, PaymentStatus.CANCELLED}),
    # EXECUTING -> EXECUTING is the re-claim of an expired lease (attempt + 1).
    PaymentStatus.EXECUTING: frozenset(
        {PaymentStatus.EXECUTING, PaymentStatus.EXECUTED, PaymentStatus.FAILED}
    ),
    PaymentStatus.EXECUTED: frozenset(),
    PaymentStatus.FAILED: frozenset(),
    PaymentStatus.CANCELLED: frozenset(),
}


class FailureReason(models.TextChoices):
    INSUFFICIENT_FUNDS = "insufficient_funds"
    ACCOUNT_FROZEN = "account_frozen"
    ACCOUNT_CLOSED = "account_closed"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"


class ScheduledPayment(models.Model):
    id = models.CharField(primary_key=True, max_length=40, default=new_payment_id, editable=False)
    # No single-column index: payments_payer_idx (payer, execute_at) serves every lookup
    # by payer, and each index here costs every claim and every finish (README "Benchmarks").
    payer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="scheduled_payments", db_index=False
    )
    from_account = models.ForeignKey(
        "ledger.Account", on_delete=models.PROTECT, related_name="outgoing_payments", db_index=False
    )
    to_account = models.ForeignKey(
        "ledger.Account", on_delete=models.PROTECT, related_name="incoming_payments"
    )
    amount = models.BigIntegerField()
    execute_at = models.DateTimeField()
    status = models.CharField(
        max_length=10,
        choices=PaymentStatus.choices,
        default=PaymentStatus.SCHEDULED,
        db_default=PaymentStatus.SCHEDULED,
    )
    failure_reason = models.CharField(max_length=40, blank=True, default="", db_default="")
    # The fencing token: every claim increments it; a worker holding an older
    # attempt changes nothing.
    attempt = models.IntegerField(default=0, db_default=0)
    lease_until = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    executed_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    version = models.IntegerField(default=1, db_default=1)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        ordering = ["execute_at", "id"]
        permissions = [("cancel_scheduledpayment", "Can cancel a scheduled payment")]
        constraints = [
            models.CheckConstraint(condition=models.Q(amount__gt=0), name="payments_amount_positive"),
            models.CheckConstraint(
                condition=models.Q(status__in=PaymentStatus.values), name="payments_status_valid"
            ),
            models.CheckConstraint(
                condition=~models.Q(from_account=models.F("to_account")),
                name="payments_distinct_accounts",
            ),
            models.CheckConstraint(condition=models.Q(attempt__gte=0), name="payments_attempt_non_negative"),
            models.CheckConstraint(
                condition=~models.Q(status="EXECUTING") | models.Q(lease_until__isnull=False),
                name="payments_executing_has_lease",
            ),
            models.CheckConstraint(
                condition=~models.Q(status="EXECUTED") | models.Q(executed_at__isnull=False),
                name="payments_executed_has_time",
            ),
            models.CheckConstraint(
                condition=~models.Q(status="FAILED") | ~models.Q(failure_reason=""),
                name="payments_failed_has_reason",
            ),
            models.CheckConstraint(
                condition=~models.Q(status="CANCELLED") | models.Q(cancelled_at__isnull=False),
                name="payments_cancelled_has_time",
            ),
        ]
        indexes = [
            # The sweep: due SCHEDULED rows, oldest first.
            models.Index(
                fields=["execute_at", "id"],
                condition=models.Q(status="SCHEDULED"),
                name="payments_due_idx",
            ),
            # Crash recovery: EXECUTING rows whose lease has expired.
            models.Index(
                fields=["lease_until"],
                condition=models.Q(status="EXECUTING"),
                name="payments_lease_idx",
            ),
            models.Index(fields=["from_account", "execute_at"], name="payments_from_account_idx"),
            models.Index(fields=["payer", "execute_at"], name="payments_payer_idx"),
        ]

    def __str__(self) -> str:
        return self.id

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class ExecutionAttempt(models.Model):
    """One try at executing a payment, written in the transaction that ends it."""

    class Outcome(models.TextChoices):
        EXECUTED = "executed"
        FAILED = "failed"
        ALREADY_APPLIED = "already_applied"  # a retry found the transfer and converged
        STALE = "stale"  # a message whose attempt was superseded: changed nothing
        ERROR = "error"  # unexpected error; the payment stays claimable

    # Indexed by payments_attempt_unique (payment, attempt): no second index.
    payment = models.ForeignKey(ScheduledPayment, on_delete=models.PROTECT, related_name="attempts", db_index=False)
    attempt = models.IntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(db_default=Now())
    worker = models.CharField(max_length=200, blank=True, default="")
    outcome = models.CharField(max_length=20, choices=Outcome.choices)
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["payment", "attempt"]
        constraints = [
            models.UniqueConstraint(fields=["payment", "attempt"], name="payments_attempt_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.payment_id}#{self.attempt} {self.outcome}"


class PaymentEvent(models.Model):
    """Append-only audit of every state change, written in the same transaction."""

    class Kind(models.TextChoices):
        CREATED = "created"
        CANCELLED = "cancelled"
        CLAIMED = "claimed"
        RECLAIMED = "reclaimed"  # claimed again after its lease expired
        EXECUTED = "executed"
        FAILED = "failed"

    # Indexed by payments_event_payment_idx (payment, id): no second index.
    payment = models.ForeignKey(ScheduledPayment, on_delete=models.PROTECT, related_name="events", db_index=False)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    from_status = models.CharField(max_length=10, blank=True, default="")
    to_status = models.CharField(max_length=10)
    attempt = models.IntegerField(default=0)
    actor = models.CharField(max_length=200, help_text="user:<id>, promoter, or worker:<name>")
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["payment", "id"], name="payments_event_payment_idx"),
            # Recent outcomes for the dashboard; the table is append-only, so this index
            # only ever grows at its right edge.
            models.Index(fields=["created_at"], name="payments_event_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.payment_id} {self.kind}"


class IdempotencyKey(models.Model):
    """A client's Idempotency-Key, scoped to its actor, stored with the first response.

    Inserted in the same transaction as what the request created, so a key exists
    exactly when its effect does.
    """

    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)
    response_status = models.PositiveSmallIntegerField(null=True)
    response_body = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["actor", "key"], name="payments_idempotency_unique"),
        ]
        indexes = [models.Index(fields=["created_at"], name="payments_idempotency_age_idx")]

    def __str__(self) -> str:
        return f"{self.actor_id}:{self.key}"
