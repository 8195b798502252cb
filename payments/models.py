"""The schedule. A ScheduledPayment row *is* the scheduled job: there is no other copy.

Status moves forward only (ALLOWED_TRANSITIONS documents it; a trigger installed by
migration 0002 enforces it, and every transition in the code is a conditional UPDATE).
"""

from datetime import datetime

from django.conf import settings
from django.contrib.postgres.indexes import BrinIndex
from django.db import models
from django.db.models.functions import Now

from common.ids import new_id
from rails.base import RAIL_NAMES

from .rules import Rule


def new_payment_id() -> str:
    return new_id("pay")


class PaymentStatus(models.TextChoices):
    SCHEDULED = "SCHEDULED"
    EXECUTING = "EXECUTING"
    EXECUTED = "EXECUTED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    # Parked for staff: the retry budget is spent or the outcome is ambiguous. Moves no
    # money by itself and is not final: staff re-drive it (back to SCHEDULED) or resolve
    # it as failed; its creator may still cancel it.
    NEEDS_REVIEW = "NEEDS_REVIEW"


TERMINAL_STATUSES = frozenset({PaymentStatus.EXECUTED, PaymentStatus.FAILED, PaymentStatus.CANCELLED})

# Documentation of the state machine; the database trigger is what enforces it, and
# tests/payments/test_models.py checks that the two agree on every pair of statuses.
ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    # SCHEDULED -> SCHEDULED is a reschedule (PATCH of the amount or the due time).
    PaymentStatus.SCHEDULED: frozenset({PaymentStatus.SCHEDULED, PaymentStatus.EXECUTING, PaymentStatus.CANCELLED}),
    # EXECUTING -> EXECUTING is the re-claim of an expired lease (attempt + 1);
    # EXECUTING -> SCHEDULED a retry after an error (next_attempt_at on the ladder);
    # EXECUTING -> NEEDS_REVIEW the retry budget spent.
    PaymentStatus.EXECUTING: frozenset({
        PaymentStatus.EXECUTING, PaymentStatus.EXECUTED, PaymentStatus.FAILED,
        PaymentStatus.SCHEDULED, PaymentStatus.NEEDS_REVIEW,
    }),
    # Re-drive (-> SCHEDULED, a fresh budget), resolve as failed, or the creator's cancel.
    PaymentStatus.NEEDS_REVIEW: frozenset({
        PaymentStatus.NEEDS_REVIEW, PaymentStatus.SCHEDULED, PaymentStatus.FAILED, PaymentStatus.CANCELLED,
    }),
    PaymentStatus.EXECUTED: frozenset(),
    PaymentStatus.FAILED: frozenset(),
    PaymentStatus.CANCELLED: frozenset(),
}


class FailureReason(models.TextChoices):
    INSUFFICIENT_FUNDS = "insufficient_funds"
    ACCOUNT_FROZEN = "account_frozen"
    ACCOUNT_CLOSED = "account_closed"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    EXPIRED = "expired"  # could not start by execute_at + expires_after
    RESOLVED_BY_STAFF = "resolved_by_staff"  # a NEEDS_REVIEW payment resolved as failed (reason in its event)
    DECLINED = "declined"  # a payout the rail declined: the reserved funds went back to the payer
    # A payout whose payee was deleted before its funds were reserved (payee_delete refuses
    # that; the executor checks it all the same): nothing moved.
    PAYEE_DELETED = "payee_deleted"


class ReviewReason(models.TextChoices):
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"  # DELAYPAY_MAX_ATTEMPTS worker starts without an outcome
    # A payout whose outcome at the rail stayed unknown (timeouts, 5xx) through its budget:
    # its funds stay reserved until staff resolve it against the rail.
    OUTCOME_UNKNOWN = "outcome_unknown"


class ScheduledPayment(models.Model):
    id = models.CharField(primary_key=True, max_length=40, default=new_payment_id, editable=False)
    # payer, from_account and to_account have no index on this table: each index here costs
    # every claim and every finish a new entry (two non-HOT updates a payment). Lookups by
    # them read PaymentLookup, written only when a payment is created or rescheduled
    # (docs/decisions/0011-lookup-keys-off-the-hot-path.md).
    payer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="scheduled_payments", db_index=False
    )
    from_account = models.ForeignKey(
        "ledger.Account", on_delete=models.PROTECT, related_name="outgoing_payments", db_index=False
    )
    # Exactly one of to_account (an internal transfer) and to_payee (a payout through the
    # payee's rail, which ``rail`` repeats so the claims can tell payouts apart).
    to_account = models.ForeignKey(
        "ledger.Account", null=True, blank=True, on_delete=models.PROTECT, related_name="incoming_payments",
        db_index=False,  # PaymentLookup's payments_lookup_to_idx
    )
    to_payee = models.ForeignKey(
        "Payee", null=True, blank=True, on_delete=models.PROTECT, related_name="payouts",
        db_index=False,  # payments_payee_idx, partial: internal payments stay out of it
    )
    rail = models.CharField(max_length=20, blank=True, default="", db_default="")
    amount = models.BigIntegerField()
    execute_at = models.DateTimeField()
    status = models.CharField(
        max_length=12,
        choices=PaymentStatus.choices,
        default=PaymentStatus.SCHEDULED,
        db_default=PaymentStatus.SCHEDULED,
    )
    failure_reason = models.CharField(max_length=40, blank=True, default="", db_default="")
    # The fencing token: every claim increments it; a worker holding an older
    # attempt changes nothing.
    attempt = models.IntegerField(default=0, db_default=0)
    # The retry budget counts worker starts, not claims: a claim whose message no worker
    # ever started (workers down, Redis lost it) costs nothing. ``tries`` is bumped once
    # per claim (``tried_attempt`` remembers which) when a worker starts the batch.
    tries = models.IntegerField(default=0, db_default=0)
    tried_attempt = models.IntegerField(null=True, blank=True)
    # A retry after an error waits on the ladder (DELAYPAY_RETRY_DELAYS) until then; a
    # re-drive may set it too. NULL: due at execute_at.
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    review_reason = models.CharField(max_length=40, blank=True, default="", db_default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    executed_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    version = models.IntegerField(default=1, db_default=1)
    # Opt-in jitter: execute_at was drawn uniformly in [requested, requested + jitter].
    requested_execute_at = models.DateTimeField(null=True, blank=True)
    jitter_seconds = models.IntegerField(default=0, db_default=0)
    # Overdue policy: None runs late and never drops; otherwise a payment that cannot
    # start by execute_at + expires_after ends FAILED(expired) and moves nothing.
    expires_after = models.DurationField(null=True, blank=True)
    # Set for occurrences generated by a recurring payment.
    recurring = models.ForeignKey(
        "RecurringPayment",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="occurrences",
        db_index=False,  # payments_recurring_idx, partial: one-shot payments stay out of it
    )
    occurrence_at = models.DateTimeField(null=True, blank=True)
    # Cancelled by its series (paused, changed or ended), not on its own: its occurrence
    # slot is free for the series to generate again. An occurrence cancelled on its own
    # (DELETE /payments/{id}, the admin) keeps its slot and is never generated again.
    cancelled_by_series = models.BooleanField(default=False, db_default=False)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        ordering = ["execute_at", "id"]
        permissions = [
            ("cancel_scheduledpayment", "Can cancel a scheduled payment"),
            ("redrive_scheduledpayment", "Can re-drive or resolve a payment that needs review"),
        ]
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
                condition=models.Q(jitter_seconds__gte=0, jitter_seconds__lte=3600), name="payments_jitter_range"
            ),
            # An occurrence is created at most once per slot: OccurrenceSlot (a partitioned
            # table cannot hold a unique index without its partition key, the id).
            models.CheckConstraint(
                condition=models.Q(cancelled_by_series=False) | models.Q(status="CANCELLED"),
                name="payments_series_cancel_is_cancelled",
            ),
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
            models.CheckConstraint(
                condition=~models.Q(status="NEEDS_REVIEW") | ~models.Q(review_reason=""),
                name="payments_review_has_reason",
            ),
            models.CheckConstraint(condition=models.Q(tries__gte=0), name="payments_tries_non_negative"),
            models.CheckConstraint(
                condition=(models.Q(to_account__isnull=False, to_payee__isnull=True, rail="")
                           | (models.Q(to_account__isnull=True, to_payee__isnull=False) & ~models.Q(rail=""))),
                name="payments_account_xor_payee",
            ),
        ]
        indexes = [
            # The sweep: due SCHEDULED rows, oldest first.
            models.Index(
                fields=["execute_at", "id"],
                condition=models.Q(status="SCHEDULED", next_attempt_at__isnull=True),
                name="payments_due_idx",
            ),
            # Retries waiting on the ladder (few rows), in the order they fall due again.
            models.Index(
                fields=["next_attempt_at", "id"],
                condition=models.Q(status="SCHEDULED", next_attempt_at__isnull=False),
                name="payments_retry_idx",
            ),
            # The review queue (few rows): its gauge, its age and the admin's list.
            models.Index(
                fields=["updated_at"],
                condition=models.Q(status="NEEDS_REVIEW"),
                name="payments_review_idx",
            ),
            # Crash recovery: EXECUTING rows whose lease has expired.
            models.Index(
                fields=["lease_until"],
                condition=models.Q(status="EXECUTING"),
                name="payments_lease_idx",
            ),
            # No plain (execute_at, id) index: the claim's "status = 'SCHEDULED' ORDER BY
            # execute_at, id" would be planned on it under statistics taken before a burst,
            # walking every executed row of the past (payments/0010; bench "backlog").
            # The admin's due-time views over every status (date drill-down, "today",
            # "next hour") read SCHEDULED rows from payments_due_idx, EXECUTING ones from
            # payments_lease_idx and finished ones from this one, whose predicate neither
            # of the claim's two scans can match (selectors.payment_execute_at_condition).
            models.Index(
                fields=["execute_at"],
                condition=models.Q(status__in=sorted(TERMINAL_STATUSES)),
                name="payments_finished_idx",
            ),
            # The admin's failure_reason filter; only FAILED rows, so it stays small.
            models.Index(
                fields=["failure_reason", "execute_at", "id"],
                condition=models.Q(status="FAILED"),
                name="payments_failed_idx",
            ),
            # The fair claim's hot senders (sql.CLAIM_DUE_FAIR): one sender's due internal
            # payments, oldest first, without walking its finished history or anyone
            # else's rows. Written when a payment is scheduled, never by a claim or a finish
            # (no EXECUTING or finished row matches the predicate).
            models.Index(
                fields=["from_account", "execute_at", "id"],
                condition=models.Q(status="SCHEDULED", next_attempt_at__isnull=True, rail=""),
                name="payments_sender_due_idx",
            ),
            models.Index(
                fields=["recurring", "occurrence_at"],
                condition=models.Q(recurring__isnull=False),
                name="payments_recurring_idx",
            ),
            # The payouts' claim: due SCHEDULED payouts of one rail, oldest first. Internal
            # payments are not in it (and pay nothing for it).
            models.Index(
                fields=["rail", "execute_at", "id"],
                condition=models.Q(status="SCHEDULED", next_attempt_at__isnull=True) & ~models.Q(rail=""),
                name="payments_payout_due_idx",
            ),
            models.Index(
                fields=["to_payee", "status"],
                condition=models.Q(to_payee__isnull=False),
                name="payments_payee_idx",
            ),
        ]

    def __str__(self) -> str:
        return self.id

    @property
    def is_payout(self) -> bool:
        return self.to_payee_id is not None


class PaymentLookup(models.Model):
    """Who pays and which accounts a payment moves money between, with its due time: the
    keys staff, the API and the limits look payments up by, in a narrow table of their own
    (decision 0011). The payments table keeps the columns but not their indexes, so its
    claim and its finish (two non-HOT updates of every payment) write two index entries
    each instead of five. One row per payment, kept by triggers on the payments table
    (migration 0021): inserted with the payment, changed by a reschedule, never touched by
    the hot path, whose updates set none of these columns. Partitioned like the payments,
    archived with them; reconciliation's ``lookup_keys`` checks it against them.

    Read it through the ``lookup`` relation: ``ScheduledPayment.objects.filter(lookup__payer=user)``
    joins by primary key, and ordering by ``lookup__execute_at`` walks these indexes in order."""

    payment = models.OneToOneField(
        ScheduledPayment, primary_key=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="lookup"
    )
    payer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+"
    )
    from_account = models.ForeignKey(
        "ledger.Account", on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+"
    )
    to_account = models.ForeignKey(
        "ledger.Account", null=True, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False,
        related_name="+",
    )
    execute_at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["payer", "execute_at", "payment"], name="payments_lookup_payer_idx"),
            models.Index(fields=["from_account", "execute_at", "payment"], name="payments_lookup_from_idx"),
            models.Index(
                fields=["to_account", "execute_at", "payment"],
                condition=models.Q(to_account__isnull=False),  # payouts go to a payee
                name="payments_lookup_to_idx",
            ),
        ]

    def __str__(self) -> str:
        return self.payment_id


class RecurringStatus(models.TextChoices):
    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    ENDED = "ENDED"


RECURRING_TRANSITIONS: dict[str, frozenset[str]] = {
    RecurringStatus.ACTIVE: frozenset({RecurringStatus.ACTIVE, RecurringStatus.PAUSED, RecurringStatus.ENDED}),
    RecurringStatus.PAUSED: frozenset({RecurringStatus.PAUSED, RecurringStatus.ACTIVE, RecurringStatus.ENDED}),
    RecurringStatus.ENDED: frozenset(),
}


def new_recurring_id() -> str:
    return new_id("rec")


class RecurringPayment(models.Model):
    """A schedule that generates ordinary one-shot ScheduledPayments, one at a time.

    Exactly one of ``interval`` (ISO 8601 duration; calendar units are applied in
    ``timezone``) and ``cron`` (five fields, evaluated in ``timezone``) is set; see
    payments/rules.py. ``next_occurrence_at`` is the next occurrence not yet
    generated; the promoter tick generates it once the previous one is due
    (``last_occurrence_at <= now()``), so at most one occurrence waits ahead of time.
    """

    id = models.CharField(primary_key=True, max_length=40, default=new_recurring_id, editable=False)
    payer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="recurring_payments")
    from_account = models.ForeignKey("ledger.Account", on_delete=models.PROTECT, related_name="+")
    # Exactly one of the two, as on its occurrences.
    to_account = models.ForeignKey("ledger.Account", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    to_payee = models.ForeignKey("Payee", null=True, blank=True, on_delete=models.PROTECT, related_name="series")
    amount = models.BigIntegerField()
    start_at = models.DateTimeField()
    interval = models.CharField(max_length=40, blank=True, default="")
    cron = models.CharField(max_length=120, blank=True, default="")
    timezone = models.CharField(max_length=64, default="UTC")
    # The series ends after end_at or after its count-th occurrence, whichever is
    # first; ``last_at`` is that final instant, computed once from both.
    end_at = models.DateTimeField(null=True, blank=True)
    count = models.PositiveIntegerField(null=True, blank=True)
    last_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=10, choices=RecurringStatus.choices, default=RecurringStatus.ACTIVE)
    next_occurrence_at = models.DateTimeField(null=True, blank=True)
    last_occurrence_at = models.DateTimeField(null=True, blank=True)
    version = models.IntegerField(default=1)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        ordering = ["created_at", "id"]
        permissions = [("pause_recurringpayment", "Can pause and resume a recurring payment")]
        constraints = [
            models.CheckConstraint(condition=models.Q(amount__gt=0), name="recurring_amount_positive"),
            models.CheckConstraint(
                condition=models.Q(status__in=RecurringStatus.values), name="recurring_status_valid"
            ),
            models.CheckConstraint(
                condition=(models.Q(interval="") & ~models.Q(cron="")) | (~models.Q(interval="") & models.Q(cron="")),
                name="recurring_interval_xor_cron",
            ),
            models.CheckConstraint(
                condition=~models.Q(from_account=models.F("to_account")), name="recurring_distinct_accounts"
            ),
            models.CheckConstraint(
                condition=(models.Q(to_account__isnull=False, to_payee__isnull=True)
                           | models.Q(to_account__isnull=True, to_payee__isnull=False)),
                name="recurring_account_xor_payee",
            ),
        ]
        indexes = [
            # The generator's sweep: active schedules whose previous occurrence is due.
            models.Index(
                fields=["last_occurrence_at"],
                condition=models.Q(status="ACTIVE", next_occurrence_at__isnull=False),
                name="recurring_generate_idx",
            ),
            models.Index(fields=["payer", "created_at"], name="recurring_payer_idx"),
        ]

    def __str__(self) -> str:
        return self.id

    @property
    def rule(self) -> Rule:
        """The series' rule as it generates: what the series, its limits and its forecasts
        all read."""
        return series_rule(self.start_at, self.interval, self.cron, self.timezone, self.last_at)


def series_rule(start_at: datetime, interval: str, cron: str, timezone: str, end_at: datetime | None) -> Rule:
    """A stored series' rule: no two occurrences closer than DELAYPAY_MIN_RECURRING_INTERVAL
    (payments/rules.py, ``min_gap``)."""
    return Rule(
        start_at=start_at, interval=interval, cron=cron, timezone=timezone, end_at=end_at,
        min_gap=settings.DELAYPAY_MIN_RECURRING_INTERVAL,
    )


class RecurringEvent(models.Model):
    """Append-only audit of a recurring payment's changes, including skipped occurrences."""

    class Kind(models.TextChoices):
        CREATED = "created"
        GENERATED = "generated"  # an occurrence became a ScheduledPayment
        PAUSED = "paused"
        RESUMED = "resumed"  # data.skipped lists the occurrences missed while paused
        UPDATED = "updated"
        ENDED = "ended"

    recurring = models.ForeignKey(RecurringPayment, on_delete=models.PROTECT, related_name="events")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    actor = models.CharField(max_length=200)
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["recurring", "id"], name="recurring_event_idx")]

    def __str__(self) -> str:
        return f"{self.recurring_id} {self.kind}"


class ExecutionAttempt(models.Model):
    """One try at executing a payment, written in the transaction that ends it."""

    class Outcome(models.TextChoices):
        EXECUTED = "executed"
        FAILED = "failed"
        ALREADY_APPLIED = "already_applied"  # a retry found the transfer and converged
        STALE = "stale"  # a message whose attempt was superseded: changed nothing
        ERROR = "error"  # unexpected error; the payment retries on the ladder or is parked
        PARKED = "parked"  # started past its budget: moved to NEEDS_REVIEW without an apply
        # A payout whose rail call ended ambiguously (timeout, 5xx): it stays EXECUTING and
        # the next attempt looks the payout up at the rail by its key.
        UNKNOWN = "unknown"

    # Indexed by payments_attempt_unique (payment, attempt): no second index. No foreign key
    # constraint (migration 0019): written only with its payment, in the same transaction;
    # reconciliation's orphan_history finds one without (decision 0009).
    payment = models.ForeignKey(ScheduledPayment, on_delete=models.PROTECT, related_name="attempts", db_index=False,
                                db_constraint=False)
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
        RECLAIMED = "reclaimed"  # claimed again: its lease expired, a retry, or a re-drive
        EXECUTED = "executed"
        FAILED = "failed"
        RETRY_SCHEDULED = "retry_scheduled"  # EXECUTING -> SCHEDULED after an error (next_attempt_at in data)
        PARKED = "parked"  # -> NEEDS_REVIEW (review_reason in data)
        REDRIVEN = "redriven"  # NEEDS_REVIEW -> SCHEDULED by staff (reason in data)
        UPDATED = "updated"  # amount / execute_at edited while SCHEDULED (old and new in data)
        # A payout's rail call ended ambiguously; it stays EXECUTING until a lookup by key
        # (at lease_until, in data) resolves it.
        OUTCOME_UNKNOWN = "outcome_unknown"

    # Indexed by payments_event_payment_idx (payment, id): no second index. No foreign key
    # constraint, as for attempts (migration 0019).
    payment = models.ForeignKey(ScheduledPayment, on_delete=models.PROTECT, related_name="events", db_index=False,
                                db_constraint=False)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    from_status = models.CharField(max_length=12, blank=True, default="")
    to_status = models.CharField(max_length=12)
    attempt = models.IntegerField(default=0)
    actor = models.CharField(max_length=200, help_text="user:<id>, promoter, or worker:<name>")
    # Staff actions only; indexed by payments_event_actor_idx, which leaves out the NULL of
    # every event the promoter and the workers write.
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["id"]
        # Two events a payment are the hot path's most written rows: every index here is
        # an insert per event (docs/explanation/performance.md).
        indexes = [
            models.Index(fields=["payment", "id"], name="payments_event_payment_idx"),
            models.Index(fields=["actor_user"], name="payments_event_actor_idx",
                         condition=models.Q(actor_user__isnull=False)),
            # Recent outcomes for the dashboard: a window at the end of an append-only
            # log, which a block-range index finds at almost no cost per insert (a
            # B-tree on created_at was two entries a payment).
            BrinIndex(fields=["created_at"], name="payments_event_created_brin", autosummarize=True),
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


class StartMarker(models.Model):
    """A worker started this (payment, attempt): the executor's start marker (sql.MARK_STARTED,
    docs/decisions/0008-start-markers-off-the-row.md). Counted in the payment's ``tries``
    when the attempt ends or its lease expires; deleted by the purge once no attempt
    needs it. An UNLOGGED table (migration 0017): a PostgreSQL crash empties it. Written
    and read by raw SQL only; the model is here so the schema and tests know the table."""

    pk = models.CompositePrimaryKey("payment_id", "attempt")
    payment_id = models.CharField(max_length=40)
    attempt = models.IntegerField()
    started_at = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return f"{self.payment_id} attempt {self.attempt} started at {self.started_at}"


class OccurrenceSlot(models.Model):
    """The recurring occurrence that holds each (series, occurrence time) slot. A retried
    or duplicated generation can never create an occurrence twice, and an occurrence
    cancelled on its own keeps its slot: it is never generated again. Only one its series
    cancelled (paused, changed, ended) frees its slot for the series (a resume before it
    was due brings it back). Kept by triggers on the payments table (migration 0018); its
    primary key is the uniqueness the payments' partitioned table cannot hold. Never
    archived: a slot is three columns and must outlive its payment's partition."""

    pk = models.CompositePrimaryKey("recurring_id", "occurrence_at")
    recurring_id = models.CharField(max_length=40)
    occurrence_at = models.DateTimeField()
    payment_id = models.CharField(max_length=40)

    def __str__(self) -> str:
        return f"{self.recurring_id} at {self.occurrence_at}: {self.payment_id}"


class ArchivedPartition(models.Model):
    """A month of the schedule that left the database (partitions.archive_month): its
    payments, events, attempts and payouts were exported to ``location`` (gzipped CSV and a
    manifest with each file's SHA-256), checked, detached and dropped. Reconciliation reads
    this to tell an archived payment from a missing one, and checks the ledger's transfers
    keyed in the range against the executed totals recorded here."""

    month = models.DateField(primary_key=True)
    id_low = models.CharField(max_length=40)
    id_high = models.CharField(max_length=40)
    payments = models.BigIntegerField()
    executed_count = models.BigIntegerField()
    executed_amount = models.BigIntegerField()
    location = models.TextField()
    manifest = models.JSONField()
    archived_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        ordering = ["month"]

    def __str__(self) -> str:
        return f"{self.month:%Y-%m} ({self.payments} payments)"


class Heartbeat(models.Model):
    """The last time a periodic job ran and what it reported, shared by every host.

    ``promoter`` is written by every promoter tick (readiness and the stalled-promoter
    alert read it), and ``promoter:shard:K`` by every tick of claim shard K when the claim
    is sharded (the stalled-shard alert reads those); ``reconcile`` by the reconcile
    command (``value`` = violations found); ``settlement:<rail>`` by each settlement
    reconciliation of a rail (``value`` = mismatches found) and, in the same statement,
    ``stl:<rail>:<kind>`` with that run's count of each kind (payouts/settlement.py; the
    short prefix keeps the name within 40 characters); ``process:<type>`` by the
    ``process_heartbeat`` task beat sends to the ``worker``, ``payouts`` and ``webhooks``
    processes' queues (the dashboard's Processes panel: payments/tasks.py).
    Times come from the database clock, so hosts' clocks never disagree about an age.
    """

    PROMOTER = "promoter"
    RECONCILE = "reconcile"
    PROMOTER_SHARD = "promoter:shard:"  # + the shard's index: its ticks, when DELAYPAY_CLAIM_SHARDS > 1
    SETTLEMENT = "settlement:"  # + a rail: its last settlement reconciliation
    SETTLEMENT_KIND = "stl:"  # + rail:kind: that run's mismatches of one kind
    PROCESS = "process:"  # + a process type (worker, payouts, webhooks): it took a message from its queue

    name = models.CharField(primary_key=True, max_length=40)
    beat_at = models.DateTimeField(db_default=Now())
    value = models.BigIntegerField(default=0, db_default=0)

    def __str__(self) -> str:
        return f"{self.name} at {self.beat_at}"

    @classmethod
    def shard_name(cls, index: int) -> str:
        return f"{cls.PROMOTER_SHARD}{index}"

    @classmethod
    def process_name(cls, process: str) -> str:
        return f"{cls.PROCESS}{process}"

    @classmethod
    def settlement_name(cls, rail: str, kind: str | None = None) -> str:
        return f"{cls.SETTLEMENT}{rail}" if kind is None else f"{cls.SETTLEMENT_KIND}{rail}:{kind}"


# --- Payouts: money that leaves the ledger through a payment rail (docs/reference/payouts.md)


# The rails a payee may use: rails/base.py's RAIL_NAMES, the one list (a rail is added
# there and in rails/registry.py; the CHECK below then needs a migration, which
# makemigrations writes). "sandbox" is the sandbox gateway shipped with the project.
Rail = models.TextChoices("Rail", [(name.upper(), name) for name in RAIL_NAMES])


def new_payee_id() -> str:
    return new_id("pye")


class Payee(models.Model):
    """Someone outside the ledger a user pays through a rail: ``destination`` is the rail's
    reference of their account. Owned by its creator. Deleting one only hides it
    (``deleted_at``): the payouts made to it keep pointing at it."""

    id = models.CharField(primary_key=True, max_length=40, default=new_payee_id, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="payees")
    name = models.CharField(max_length=100)
    rail = models.CharField(max_length=20, choices=Rail.choices)
    destination = models.CharField(max_length=64)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.CheckConstraint(condition=models.Q(rail__in=Rail.values), name="payments_payee_rail_valid"),
            models.CheckConstraint(
                condition=models.Q(destination__regex=r"^[A-Za-z0-9_.:-]{1,64}$"),
                name="payments_payee_destination_valid",
            ),
        ]
        indexes = [models.Index(fields=["owner", "created_at"], name="payments_payee_owner_idx")]

    def __str__(self) -> str:
        return f"{self.id} ({self.name})"


class PayoutState(models.TextChoices):
    PENDING = "pending"  # funds reserved; the rail's answer is not known yet
    PAID = "paid"  # the rail paid it: the reserve was posted to the rail's settlement account
    DECLINED = "declined"  # the rail declined it: the reserve was voided (money back to the payer)
    VOIDED = "voided"  # staff resolved it as failed once the rail confirmed it holds no payout


class Payout(models.Model):
    """A payout's record at its rail: written when its funds are reserved (the ledger's
    pending transfer, keyed by the payment id) and finished in the transaction that posts
    or voids that reserve and ends the payment."""

    payment = models.OneToOneField(ScheduledPayment, primary_key=True, on_delete=models.PROTECT,
                                   related_name="payout")
    rail = models.CharField(max_length=20, choices=Rail.choices)
    destination = models.CharField(max_length=64)  # the payee's, when the funds were reserved
    amount = models.BigIntegerField()
    state = models.CharField(max_length=10, choices=PayoutState.choices, default=PayoutState.PENDING)
    reference = models.CharField(max_length=100, blank=True, default="")  # the rail's payout id
    paid_at = models.DateTimeField(null=True, blank=True)  # the rail's time (its settlement day)
    decline_code = models.CharField(max_length=60, blank=True, default="")
    submissions = models.IntegerField(default=0)
    lookups = models.IntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(state__in=PayoutState.values), name="payments_payout_state_valid"
            ),
            models.CheckConstraint(
                condition=~models.Q(state="paid") | (~models.Q(reference="") & models.Q(paid_at__isnull=False)),
                name="payments_payout_paid_has_reference",
            ),
        ]
        indexes = [
            # Settlement reconciliation: the payouts the rail paid on one day.
            models.Index(
                fields=["rail", "paid_at"], condition=models.Q(state="paid"), name="payments_payout_paid_idx"
            ),
            models.Index(
                fields=["created_at"], condition=models.Q(state="pending"), name="payments_payout_pending_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.payment_id} {self.state}"


class BreakerState(models.TextChoices):
    CLOSED = "closed"  # payouts flow
    OPEN = "open"  # failing: payouts of the rail are not claimed (they wait, SCHEDULED)
    HALF_OPEN = "half_open"  # after the cool-down: a few probe payouts go through


class RailState(models.Model):
    """Per rail, shared by every promoter and worker of the fleet: the circuit breaker and
    the token bucket that paces submissions. One row per rail, locked for each claim and
    each recorded batch of rail calls."""

    rail = models.CharField(primary_key=True, max_length=20, choices=Rail.choices)
    breaker = models.CharField(max_length=10, choices=BreakerState.choices, default=BreakerState.CLOSED)
    # Staff override: "open" or "closed" holds the breaker there until cleared ("").
    forced = models.CharField(max_length=10, blank=True, default="")
    forced_by = models.CharField(max_length=150, blank=True, default="")
    forced_reason = models.TextField(blank=True, default="")
    opened_at = models.DateTimeField(null=True, blank=True)
    consecutive_failures = models.IntegerField(default=0)
    window_started_at = models.DateTimeField(db_default=Now())
    window_calls = models.IntegerField(default=0)
    window_failures = models.IntegerField(default=0)
    probes_claimed = models.IntegerField(default=0)
    tokens = models.FloatField(default=0.0)
    refilled_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        verbose_name = "rail"
        verbose_name_plural = "rails"
        permissions = [("force_breaker", "Can force a rail's circuit breaker open or closed")]
        constraints = [
            models.CheckConstraint(condition=models.Q(breaker__in=BreakerState.values),
                                   name="payments_railstate_breaker_valid"),
            models.CheckConstraint(condition=models.Q(forced__in=["", "open", "closed"]),
                                   name="payments_railstate_forced_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.rail}: {self.forced or self.breaker}"
