"""Payment reads, scoped to who may see what."""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import (
    Count,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    Max,
    Min,
    Prefetch,
    Q,
    QuerySet,
)
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now
from django.db.models.lookups import Exact, In

from common.authz import staff_may, staff_may_view
from ledger.models import Account
from rails.base import RAIL_NAMES

from . import sql_readings as sql
from .exceptions import (
    PaymentArchived,
    PaymentCancelForbidden,
    PaymentNotFound,
    PaymentReviewForbidden,
    RecurringNotFound,
    StaffActionForbidden,
)
from .models import (
    TERMINAL_STATUSES,
    ArchivedPartition,
    ExecutionAttempt,
    Heartbeat,
    PaymentLookup,
    PaymentStatus,
    RecurringPayment,
    ScheduledPayment,
)

STATUS_FIELD = ScheduledPayment._meta.get_field("status")


def _own(qs: QuerySet, user) -> QuerySet:
    """Rows (payments or recurring payments) the user created or whose source account they own.
    Payments are found through their lookup keys (PaymentLookup, decision 0011), with the
    user's accounts resolved first: one bitmap over its payer and from-account indexes,
    then the payments by primary key, O(the user's payments). A join to the accounts in
    the OR instead would hash every payment."""
    if qs.model is ScheduledPayment:
        accounts = list(Account.objects.filter(owner=user).values_list("id", flat=True))
        return qs.filter(Q(lookup__payer=user) | Q(lookup__from_account_id__in=accounts))
    return qs.filter(Q(payer=user) | Q(from_account__owner=user))


def payment_visible_to(*, user) -> QuerySet[ScheduledPayment]:
    """Payments a user may read: those they created or that debit an account they own;
    every payment for staff with ``payments.view_scheduledpayment`` (common/authz.py)."""
    qs = ScheduledPayment.objects.all()
    return qs if staff_may_view(user, ScheduledPayment) else _own(qs, user)


def _with_attempts(qs: QuerySet[ScheduledPayment], *, user) -> QuerySet[ScheduledPayment]:
    """The payments with their attempts: on someone else's payment, only for staff who
    may read attempts too (``payments.view_executionattempt``, as the admin's inline)."""
    attempts = ExecutionAttempt.objects.order_by("attempt")
    if staff_may_view(user, ScheduledPayment) and not staff_may_view(user, ExecutionAttempt):
        attempts = attempts.filter(Q(payment__payer=user) | Q(payment__from_account__owner=user))
    return qs.prefetch_related(Prefetch("attempts", queryset=attempts), "payout")  # a page's payouts in one query


def payment_get(*, user, payment_id: str) -> ScheduledPayment:
    """One payment with its attempts; PaymentNotFound when it is not the user's to see
    (not 403: existence is not revealed)."""
    payment = _with_attempts(payment_visible_to(user=user), user=user).filter(pk=payment_id).first()
    if payment is None:
        archived = archived_month_of(payment_id)
        if archived is not None:
            raise PaymentArchived(archived)
        raise PaymentNotFound()
    return payment


def archived_month_of(payment_id: str) -> str | None:
    """The month (YYYY-MM) whose archive holds ``payment_id``'s range, or None. Says
    nothing about a payment: any id in the range answers the same."""
    month = (ArchivedPartition.objects.filter(id_low__lte=payment_id, id_high__gt=payment_id)
             .values_list("month", flat=True).first())
    return f"{month:%Y-%m}" if month else None


def payment_list(*, user, status: str | None = None) -> QuerySet[ScheduledPayment]:
    """The payments ``user`` may see, with attempts, optionally in one status.
    Unordered: the caller orders and paginates."""
    qs = _with_attempts(payment_visible_to(user=user), user=user)
    return qs.filter(status=status) if status else qs


def payment_list_for_account(*, user, account_id: str, status: str | None = None) -> QuerySet[ScheduledPayment]:
    """The payments ``user`` may see that debit or credit ``account_id``. For an owner
    that is what the account pays out (incoming payments belong to their payers until
    they execute and show up as transfers); staff who read every payment see both
    directions."""
    qs = payment_list(user=user, status=status)
    return qs.filter(Q(lookup__from_account_id=account_id) | Q(lookup__to_account_id=account_id))


@dataclass(frozen=True)
class Act:
    """An act on a payment or a recurring payment through the API: the permission staff
    need to do it to someone else's (the one the admin asks for), the 403 they get
    without it, and whether the payer (or the owner of the debited account) may do it
    to their own."""

    permission: str
    forbidden: Callable[[], Exception]
    owner_may: bool = True


def _authorize_act(*, user, visible: QuerySet, pk: str, act: Act, missing: Exception) -> None:
    """The one rule for acting on a row (common/authz.py): its payer or the owner of the
    debited account may (when ``act.owner_may``); on a row the user may read, staff
    with ``act.permission`` may, anyone else gets ``act.forbidden()`` (403); a row the
    user may not read is ``missing`` (404: existence is not revealed)."""
    if act.owner_may and _own(visible, user).filter(pk=pk).exists():
        return
    if not visible.filter(pk=pk).exists():
        raise missing
    if not staff_may(user, act.permission):
        raise act.forbidden()


PAYMENT_ACTS = {
    "cancel": Act("payments.cancel_scheduledpayment", PaymentCancelForbidden),  # the support group has it
    # Cancelling is not changing: no staff group may change amounts or times.
    "change": Act(
        "payments.change_scheduledpayment", lambda: StaffActionForbidden("You may read this payment but not change it.")
    ),
    # Re-drive and resolve move money again or close a payment: a staff decision, not its creator's.
    "review": Act("payments.redrive_scheduledpayment", PaymentReviewForbidden, owner_may=False),
}


def payment_authorize(*, user, payment_id: str, act: str) -> None:
    """Raise unless ``user`` may ``act`` (a key of PAYMENT_ACTS) on the payment."""
    _authorize_act(
        user=user, visible=payment_visible_to(user=user), pk=payment_id, act=PAYMENT_ACTS[act],
        missing=PaymentNotFound(),
    )


def payment_is_own(*, user, payment_id: str) -> bool:
    """Whether ``user`` created the payment or owns the account it debits: acting on it is
    then their own business, not a staff act (which needs an author and a reason)."""
    return _own(ScheduledPayment.objects.all(), user).filter(pk=payment_id).exists()


# --- Recurring payments ----------------------------------------------------------------


def _recurring_act(permission: str, verb: str) -> Act:
    return Act(permission, lambda: StaffActionForbidden(f"You may read this recurring payment but not {verb} it."))


RECURRING_ACTS = {
    "pause": _recurring_act("payments.pause_recurringpayment", "pause or resume"),  # the support group has it
    "end": _recurring_act("payments.delete_recurringpayment", "end"),
    "change": _recurring_act("payments.change_recurringpayment", "change"),
}


def recurring_visible_to(*, user) -> QuerySet[RecurringPayment]:
    """Recurring payments a user may read: those they created or that debit an account
    they own; every one for staff with ``payments.view_recurringpayment``."""
    qs = RecurringPayment.objects.all()
    return qs if staff_may_view(user, RecurringPayment) else _own(qs, user)


def recurring_get(*, user, recurring_id: str) -> RecurringPayment:
    """One recurring payment; RecurringNotFound when it is not the user's to see."""
    rec = recurring_visible_to(user=user).filter(pk=recurring_id).first()
    if rec is None:
        raise RecurringNotFound()
    return rec


def recurring_list(*, user, status: str | None = None) -> QuerySet[RecurringPayment]:
    """The recurring payments ``user`` may see, optionally in one status. Unordered."""
    qs = recurring_visible_to(user=user)
    return qs.filter(status=status) if status else qs


def recurring_occurrences(*, user, recurring_id: str) -> QuerySet[ScheduledPayment]:
    """The payments a recurring payment generated (cancelled ones included) that ``user``
    may read: all of a series of their own; of someone else's, only for staff who may
    read payments. Unordered."""
    return payment_visible_to(user=user).filter(recurring_id=recurring_id)


def recurring_authorize(*, user, recurring_id: str, action: str) -> None:
    """Raise unless ``user`` may ``action`` (a key of RECURRING_ACTS) the recurring payment."""
    _authorize_act(
        user=user, visible=recurring_visible_to(user=user), pk=recurring_id, act=RECURRING_ACTS[action],
        missing=RecurringNotFound(),
    )


# --- Operational health: shared by the admin dashboard and the metrics endpoint -------

@dataclass(frozen=True)
class ScheduleHealth:
    oldest_due_age_seconds: float  # 0 when nothing SCHEDULED is overdue
    overdue: int  # SCHEDULED with execute_at <= now()
    in_flight: int  # EXECUTING with a live lease
    leases_expired: int  # EXECUTING with an expired lease (a worker died or lost its message)


def schedule_health() -> ScheduleHealth:
    """The lag numbers an operator watches, from the sweep's partial indexes."""
    with connection.cursor() as cur:
        cur.execute(sql.SCHEDULE_LAG)
        age, overdue = cur.fetchone()
        cur.execute(sql.LEASE_COUNTS)
        in_flight, expired = cur.fetchone()
    return ScheduleHealth(max(float(age), 0.0), overdue, in_flight, expired)


def stuck_payouts_by_rail(*, rails: list[str]) -> dict[str, tuple[int, int]]:
    """rail -> (overdue payouts, payouts with an expired lease) of each rail given: the
    share of the lag numbers (schedule_health) that waits on those rails."""
    if not rails:
        return {}
    with connection.cursor() as cur:
        cur.execute(sql.STUCK_PAYOUTS_BY_RAIL, [list(rails)])
        return {rail: (overdue, expired) for rail, overdue, expired in cur.fetchall()}


def due_within(*, seconds: float) -> int:
    """SCHEDULED payments falling due within the next ``seconds`` (payments_due_idx)."""
    with connection.cursor() as cur:
        cur.execute(sql.DUE_INFLOW, [seconds])
        return cur.fetchone()[0]


@dataclass(frozen=True)
class ReviewQueue:
    count: int  # payments parked in NEEDS_REVIEW
    oldest_age_seconds: float  # how long the oldest has waited since it was parked; 0 when none


def review_queue_health() -> ReviewQueue:
    """The review queue's size and age, from its partial index (payments_review_idx)."""
    with connection.cursor() as cur:
        cur.execute(sql.REVIEW_QUEUE)
        count, age = cur.fetchone()
    return ReviewQueue(count, max(float(age), 0.0))


def payment_counts_by_status() -> dict[str, int]:
    """Exact counts per status (every status present, zeros included)."""
    counts = dict.fromkeys(PaymentStatus.values, 0)
    for row in ScheduledPayment.objects.order_by().values("status").annotate(n=Count("id")):
        counts[row["status"]] = row["n"]
    return counts


def payments_due_by_minute(*, minutes: int = 60) -> list[tuple[datetime, int]]:
    """SCHEDULED payments due in each of the next ``minutes`` minutes (zeros included)."""
    with connection.cursor() as cur:
        cur.execute(sql.DUE_BY_MINUTE, [minutes])
        return [(minute, n) for minute, n in cur.fetchall()]


@dataclass(frozen=True)
class RecentOutcomes:
    executed: int
    failed: dict[str, int]  # failure_reason -> count

    @property
    def failed_total(self) -> int:
        return sum(self.failed.values())


def recent_outcomes(*, seconds: int = 3600) -> RecentOutcomes:
    """Executions and failures (by reason) in the last ``seconds``, from the event log."""
    with connection.cursor() as cur:
        cur.execute(sql.RECENT_OUTCOMES, [seconds])
        executed, failed = 0, {}
        for kind, reason, n in cur.fetchall():
            if kind == "executed":
                executed += n
            else:
                failed[reason] = failed.get(reason, 0) + n
    return RecentOutcomes(executed, failed)


@dataclass(frozen=True)
class RecentLateness:
    p50_seconds: float | None  # None: nothing executed
    p99_seconds: float | None
    max_seconds: float | None
    executed: int  # the payments measured (at most ``limit``)


def recent_lateness(*, seconds: int = 300, limit: int = 20_000) -> RecentLateness:
    """Execution lateness (executed_at - execute_at) of the payments executed in the last
    ``seconds``, the latest ``limit`` of them at most (sql.RECENT_LATENESS)."""
    with connection.cursor() as cur:
        cur.execute(sql.RECENT_LATENESS, {"seconds": seconds, "limit": limit})
        return RecentLateness(*cur.fetchone())


@dataclass(frozen=True)
class OutcomeSlot:
    start: datetime
    executed: int
    failed: int
    cancelled: int


@dataclass(frozen=True)
class LatenessSlot:
    start: datetime
    p50_seconds: float | None  # None: nothing executed in the slot
    p99_seconds: float | None
    executed: int


def _history_start(*, bucket_seconds: int, slots: int) -> datetime:
    with connection.cursor() as cur:
        cur.execute(sql.HISTORY_START, {"bucket": bucket_seconds, "slots": slots})
        return cur.fetchone()[0]


def outcomes_history(*, bucket_seconds: int = 600, slots: int = 144) -> list[OutcomeSlot]:
    """Executed, failed and cancelled payments in each of the last ``slots`` slots of
    ``bucket_seconds`` (the current one included, zeros included), from the event log."""
    start = _history_start(bucket_seconds=bucket_seconds, slots=slots)
    counts: dict[tuple[int, str], int] = {}
    with connection.cursor() as cur:
        cur.execute(sql.OUTCOMES_HISTORY, {"start": start, "bucket": bucket_seconds})
        for slot, kind, n in cur.fetchall():
            counts[(slot, kind)] = n
    step = timedelta(seconds=bucket_seconds)
    return [
        OutcomeSlot(start + i * step, counts.get((i, "executed"), 0), counts.get((i, "failed"), 0),
                    counts.get((i, "cancelled"), 0))
        for i in range(slots)
    ]


def lateness_history(*, bucket_seconds: int = 60, slots: int = 1440) -> list[LatenessSlot]:
    """Execution lateness (executed_at - execute_at) p50 and p99 in each of the last
    ``slots`` slots of ``bucket_seconds``, by when the payment executed."""
    start = _history_start(bucket_seconds=bucket_seconds, slots=slots)
    with connection.cursor() as cur:
        cur.execute(sql.LATENESS_HISTORY, {"start": start, "bucket": bucket_seconds})
        found = {slot: (p50, p99, n) for slot, p50, p99, n in cur.fetchall()}
    step = timedelta(seconds=bucket_seconds)
    return [
        LatenessSlot(start + i * step, *found.get(i, (None, None, 0)))
        for i in range(slots)
    ]


@dataclass(frozen=True)
class HeartbeatReading:
    beat_at: datetime
    age_seconds: float  # on the database clock
    value: int


def heartbeat_readings() -> dict[str, HeartbeatReading]:
    """The last beat of every periodic job that has run (promoter ticks, reconcile)."""
    rows = Heartbeat.objects.annotate(age=ExpressionWrapper(Now() - F("beat_at"), output_field=DurationField()))
    return {
        hb.name: HeartbeatReading(hb.beat_at, max(hb.age.total_seconds(), 0.0), hb.value)
        for hb in rows
    }


# --- Admin filters and search (the database clock decides what is due) -----------------

def payment_overdue_condition() -> Q:
    """SCHEDULED payments past due (a retry: past its next attempt), and EXECUTING
    payments whose lease expired: the rows behind schedule_health's ``overdue`` and
    ``leases_expired`` (a retry still waiting on its ladder is not overdue).

    Written as ``id IN (a UNION ALL b UNION ALL c)`` so each arm is served by its partial
    index (payments_due_idx, payments_retry_idx, payments_lease_idx), each arm repeating
    its index's predicate; the plain OR, or an arm without ``next_attempt_at`` in it,
    makes the planner scan the whole table (180 ms at 1M payments).
    """
    rows = ScheduledPayment.objects.order_by().values("pk")
    scheduled = rows.filter(status=PaymentStatus.SCHEDULED)
    due = scheduled.filter(next_attempt_at__isnull=True, execute_at__lte=Now())
    retry_due = scheduled.filter(next_attempt_at__isnull=False, next_attempt_at__lte=Now())
    stuck = rows.filter(status=PaymentStatus.EXECUTING, lease_until__lt=Now())
    return Q(pk__in=due.union(retry_due, stuck, all=True))


FINISHED = sorted(TERMINAL_STATUSES)  # the predicate of payments_finished_idx, verbatim


def _execute_at_arms(queryset: QuerySet) -> list[QuerySet]:
    """``queryset`` split by status into the sets with an index on execute_at or few rows:
    SCHEDULED and not waiting on a retry (payments_due_idx), SCHEDULED waiting on a retry
    (payments_retry_idx: few rows, read whole), EXECUTING (payments_lease_idx: few rows,
    read whole) and finished (payments_finished_idx). SCHEDULED is two arms because
    payments_due_idx holds only the rows with no ``next_attempt_at``: with one arm for
    every SCHEDULED row no index matches and the table is scanned (180 ms at 1M rows for
    the date drill-down's bounds). An arm the queryset's own status filter rules out is
    left out: PostgreSQL would not see "status = 'X' AND status IN (...)" as empty and
    would walk that arm's whole index."""
    statuses = _statuses_allowed(queryset)
    arms = []
    scheduled = queryset.filter(status=PaymentStatus.SCHEDULED)
    for wanted, arm in (
        ({PaymentStatus.SCHEDULED}, scheduled.filter(next_attempt_at__isnull=True)),
        ({PaymentStatus.SCHEDULED}, scheduled.filter(next_attempt_at__isnull=False)),
        ({PaymentStatus.EXECUTING}, queryset.filter(status=PaymentStatus.EXECUTING)),
        (set(FINISHED), queryset.filter(status__in=FINISHED)),
    ):
        if statuses is None or statuses & wanted:
            arms.append(arm)
    return arms


def payment_execute_at_condition(**lookups) -> Q:
    """``execute_at`` lookups (``execute_at__gte=...``) over payments of every status.

    Written as ``id IN (arm UNION ALL arm UNION ALL arm)``, one arm per partial index:
    no index covers execute_at for every row, because the claim must not be planned on
    one (payments/models.py).
    """
    rows = ScheduledPayment.objects.order_by().values("pk")
    first, *rest = [arm.filter(**lookups) for arm in _execute_at_arms(rows)]
    return Q(pk__in=first.union(*rest, all=True))


def payment_execute_at_bounds(queryset: QuerySet) -> dict:
    """``{"first": min(execute_at), "last": max(execute_at)}`` of ``queryset``, from the
    ends of the partial indexes (a lookup or two each, no scan of the table)."""
    bounds = [_arm_bounds(arm) for arm in _execute_at_arms(queryset)]
    firsts = [b["first"] for b in bounds if b["first"] is not None]
    lasts = [b["last"] for b in bounds if b["last"] is not None]
    return {"first": min(firsts, default=None), "last": max(lasts, default=None)}


def _arm_bounds(arm: QuerySet) -> dict:
    """One arm's min and max ``execute_at``. On the payments table alone, one aggregate,
    which PostgreSQL answers from the index's two ends. Joined to the lookup keys (a payer
    or account filter, or a search, decision 0011), an aggregate reads every row the join
    yields (1.1 s each for a payer of a million payments, 5.8 s for a search all of them
    match); the first row of each order, a walk of the index that stops at the first row
    the join keeps, does not."""
    if PaymentLookup._meta.db_table not in str(arm.query):  # neither joined nor in a subquery
        return arm.order_by().aggregate(first=Min("execute_at"), last=Max("execute_at"))
    due = arm.values_list("execute_at", flat=True)
    return {"first": due.order_by("execute_at").first(), "last": due.order_by("-execute_at").first()}


def _statuses_allowed(queryset: QuerySet) -> set[str] | None:
    """The statuses a top-level ``status`` (exact or in) filter of ``queryset`` allows;
    None when it has none."""
    where = queryset.query.where
    if where.connector != "AND" or where.negated:
        return None
    for child in where.children:
        if isinstance(child, Exact | In) and getattr(child.lhs, "target", None) is STATUS_FIELD:
            return {child.rhs} if isinstance(child, Exact) else set(child.rhs)
    return None


def payment_due_today_condition() -> Q:
    """Due on the current UTC calendar day, whatever the status."""
    start = RawSQL("date_trunc('day', now())", [], output_field=DateTimeField())
    end = RawSQL("date_trunc('day', now()) + interval '1 day'", [], output_field=DateTimeField())
    return payment_execute_at_condition(execute_at__gte=start, execute_at__lt=end)


def payment_due_next_hour_condition() -> Q:
    """Due within the coming hour (not yet due), whatever the status."""
    end = RawSQL("now() + interval '1 hour'", [], output_field=DateTimeField())
    return payment_execute_at_condition(execute_at__gt=Now(), execute_at__lte=end)


def payment_search_condition(*, terms: list[str]) -> Q:
    """What staff search terms match (any of them): a payment id, an account id (either
    side), the username owning either account, or a recurring payment id (its
    occurrences). Account ids are resolved first, in one query, so the payment scan uses
    the account indexes instead of joining users."""
    terms = [t for t in terms if t]
    return payments_matching(ids=terms, account_ids=_accounts_matching(terms),
                             recurring_ids=[t for t in terms if t.startswith("rec_")])


def payments_matching(*, ids: list[str], account_ids: list[str], recurring_ids: list[str]) -> Q:
    """Payments with one of ``ids``, debiting or crediting one of ``account_ids``, or
    occurrences of one of ``recurring_ids``: one ``id IN (...)`` over a union, so the
    planner reads each part from its own index (the lookup table's primary key and account
    indexes, payments_recurring_idx) and then the payments by primary key. An OR of the
    parts would put a subquery or a second table inside it, which no index serves."""
    by_keys = PaymentLookup.objects.filter(
        Q(payment_id__in=ids) | Q(from_account_id__in=account_ids) | Q(to_account_id__in=account_ids)
    ).order_by().values("payment_id")
    if recurring_ids:
        occurrences = ScheduledPayment.objects.filter(recurring_id__in=recurring_ids).order_by().values("id")
        by_keys = by_keys.union(occurrences, all=True)
    return Q(pk__in=by_keys)


def recurring_search_condition(*, terms: list[str]) -> Q:
    """What staff search terms match among recurring payments: a recurring payment id,
    an account id (either side), or the username owning either account."""
    terms = [t for t in terms if t]
    account_ids = _accounts_matching(terms)
    return Q(pk__in=terms) | Q(from_account_id__in=account_ids) | Q(to_account_id__in=account_ids)


def _accounts_matching(terms: list[str]) -> list[str]:
    """Ids of the accounts a search term names, by id or by owner username."""
    return list(Account.objects.filter(Q(pk__in=terms) | Q(owner__username__in=terms)).values_list("id", flat=True))


@dataclass(frozen=True)
class RailReading:
    rail: str
    breaker: str
    forced: str
    opened_at: datetime | None
    pending: int  # payouts reserved with their outcome unknown
    pending_oldest_age_seconds: float


def rail_states() -> list[RailReading]:
    """Each rail's breaker and its pending payouts (metrics, the dashboard, the admin)."""
    with connection.cursor() as cur:
        cur.execute(sql.RAIL_READINGS)
        return [RailReading(*row) for row in cur.fetchall()]


# --- Settlement reconciliation's heartbeats, as /metrics exports them ------------------

# kind -> what a mismatch means (payouts/settlement.py finds them). The order is the
# report's order; the names are stable (metric labels, alert rules, the how-to).
SETTLEMENT_MISMATCH_KINDS: dict[str, str] = {
    "paid_at_rail_not_executed": "paid by the rail that day, but our payment under its key is missing or not EXECUTED",
    "executed_not_at_rail": "EXECUTED here (payout paid that day) but absent from the rail's report",
    "amount_mismatch": "in both, with another amount at the rail",
    "payee_mismatch": "in both, paid by the rail to another destination than the payout's",
    "reference_mismatch": "in both, under another rail reference than the payout's",
}


@dataclass(frozen=True)
class LastRun:
    """A rail's last recorded settlement reconciliation, as /metrics exports it."""

    rail: str
    at: datetime
    mismatches: dict[str, int]  # kind -> count: every kind, and "unknown" when the kinds do not add up


def settlement_last_runs(beats: dict[str, HeartbeatReading]) -> list[LastRun]:
    """Each rail's last run from the heartbeats settlement reconciliation wrote
    (payouts/settlement.py, ``record``; ``beats``: heartbeat_readings()); a rail never
    reconciled has none. The total is the truth: a kind counts only when written by the
    same run (the same ``beat_at``), and what the kinds leave of the total (a run recorded
    before the kinds were) is ``unknown``, so that the alert still fires on it."""
    runs = []
    for rail in RAIL_NAMES:
        total = beats.get(Heartbeat.settlement_name(rail))
        if total is None:
            continue
        counts = dict.fromkeys(SETTLEMENT_MISMATCH_KINDS, 0)
        for kind in SETTLEMENT_MISMATCH_KINDS:
            beat = beats.get(Heartbeat.settlement_name(rail, kind))
            if beat is not None and beat.beat_at == total.beat_at:
                counts[kind] = beat.value
        if total.value > sum(counts.values()):
            counts["unknown"] = total.value - sum(counts.values())
        runs.append(LastRun(rail, total.beat_at, counts))
    return runs
