"""Recurring payments: a schedule that generates ordinary one-shot payments.

Each occurrence is a ScheduledPayment like any other (same claim, same execution,
same guarantees), created ahead of time one at a time: the next occurrence is
generated when the previous one falls due, by the promoter's tick, under a row lock
taken with SKIP LOCKED (concurrent promoters share the work) and a partial unique
index on (recurring, occurrence_at) so a retried or duplicated generation can never
create an occurrence twice. Every transition of the schedule itself is a CAS on its
status and version.

History is kept. An occurrence cancelled on its own (``DELETE /payments/{id}``, the
admin) keeps its slot in that index, so no later generation, change or resume creates
it again. The series cancels occurrences itself only when it is paused or ended, and,
when its terms change, only those not yet due (``cancelled_by_series``: their slots are
free to be generated again); one that is due but not yet claimed runs as it is, and
the series' event says so.
"""

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import F
from django.db.models.functions import Now

from common.db import database_now
from payments import limits, metrics
from payments.exceptions import PaymentValidationError, RecurringNotFound, RecurringStateError, VersionMismatch
from payments.models import (
    PaymentEvent,
    PaymentStatus,
    RecurringEvent,
    RecurringPayment,
    RecurringStatus,
    ScheduledPayment,
    series_rule,
)
from payments.rules import (
    RuleError,
    check_rule,
    check_start,
    next_occurrence,
    nth_occurrence,
    occurrences_between,
)
from payments.services import (
    _check_amount,
    actor_label,
    check_destination,
    create_payment_row,
    payee_lock,
)
from payments.sql import SET_LOCAL_LOCK_TIMEOUT

from . import sql

logger = logging.getLogger(__name__)

SKIPPED_RECORD_LIMIT = 100
# The constraint an occurrence violates when its slot is taken (models.OccurrenceSlot).
OCCURRENCE_TAKEN = "payments_occurrenceslot_pkey"
# The promoter's tick generates due occurrences in transactions of at most this many
# series, each series in a savepoint of its own, and waits at most this long for any
# row lock: a series that cannot be generated now (a lock held elsewhere, a deadlock,
# bad data) is rolled back alone, logged, counted and tried again next tick.
GENERATION_BATCH = 50
GENERATION_LOCK_TIMEOUT = "250ms"


@dataclass(frozen=True)
class Terms:
    """The schedulable terms of a recurring payment, validated together."""

    amount: int
    start_at: datetime
    interval: str
    cron: str
    timezone: str
    end_at: datetime | None
    count: int | None


def _validated(terms: Terms, errors: dict[str, list[str]]) -> datetime | None:
    """Check the terms; return the series' last instant (from end_at and count). A
    constant amount of rule work whatever the input (payments/rules.py, "Bounded")."""
    _check_amount(terms.amount, errors)
    if bool(terms.interval) == bool(terms.cron):
        errors.setdefault("interval", []).append("Give exactly one of interval and cron.")
        return None
    try:
        check_start(terms.start_at)
    except RuleError as exc:
        errors.setdefault(exc.field, []).append(str(exc))
        if terms.start_at.tzinfo is None:
            return None
    if database_now() + timedelta(days=settings.DELAYPAY_MAX_SCHEDULE_DAYS) < terms.start_at:
        errors.setdefault("start_at", []).append(
            f"Must be at most {settings.DELAYPAY_MAX_SCHEDULE_DAYS} days ahead."
        )
    if "start_at" in errors:
        return None
    if terms.end_at is not None and terms.end_at <= terms.start_at:
        errors.setdefault("end_at", []).append("Must be after start_at.")
    rule = series_rule(terms.start_at, terms.interval, terms.cron, terms.timezone, terms.end_at)
    try:
        check_rule(rule, min_interval=settings.DELAYPAY_MIN_RECURRING_INTERVAL)
        last_at = terms.end_at
        if terms.count is not None:
            counted = nth_occurrence(rule, terms.count)
            last_at = counted if counted is not None else terms.end_at
    except RuleError as exc:
        errors.setdefault(exc.field, []).append(str(exc))
        return None
    return last_at


def _record(rec_id: str, kind: str, actor, data: dict | None = None, actor_name: str | None = None) -> None:
    RecurringEvent.objects.create(
        recurring_id=rec_id,
        kind=kind,
        actor=actor_name or actor_label(actor),
        actor_user=actor,
        data=data or {},
    )


def _given(reason: str) -> dict:
    """The event's ``reason`` when one was given (the API's pause and resume take none)."""
    return {"reason": reason} if reason else {}


def _generate(rec: RecurringPayment, occurrence_at: datetime) -> ScheduledPayment | None:
    """Create the occurrence at ``occurrence_at`` and move the schedule past it. The
    caller holds the schedule's row lock inside a transaction. None when that slot is
    taken already: generated before, or cancelled on its own (it stays cancelled). A
    series of payouts whose payee is deleted ends instead, generating nothing."""
    rail = ""
    if rec.to_payee_id is not None:
        # Held to the end of the transaction: the payee cannot be deleted under the new occurrence.
        rail = payee_lock(payee_id=rec.to_payee_id, owner_id=rec.payer_id)
        if rail is None:
            _end_without_payee(rec)
            return None
    payment = None
    try:
        with transaction.atomic():
            payment = create_payment_row(
                payer=rec.payer,
                from_account_id=rec.from_account_id,
                to_account_id=rec.to_account_id,
                to_payee_id=rec.to_payee_id,
                rail=rail,
                amount=rec.amount,
                execute_at=occurrence_at,
                recurring_id=rec.id,
                occurrence_at=occurrence_at,
                actor=f"recurring:{rec.id}",
            )
    except IntegrityError as exc:
        # Only "this occurrence already exists" means generating it again creates nothing;
        # any other violation is a real error (the schedule's savepoint logs and skips it).
        if getattr(getattr(exc.__cause__, "diag", None), "constraint_name", None) != OCCURRENCE_TAKEN:
            raise
    following = next_occurrence(rec.rule, after=occurrence_at)
    ended = following is None
    RecurringPayment.objects.filter(pk=rec.pk).update(
        last_occurrence_at=occurrence_at,
        next_occurrence_at=following,
        status=RecurringStatus.ENDED if ended else F("status"),
        updated_at=Now(),
    )
    if payment is not None:
        _record(rec.id, RecurringEvent.Kind.GENERATED, None, {"payment_id": payment.id,
                "occurrence_at": occurrence_at.isoformat()}, actor_name="promoter")
    if ended:
        _record(rec.id, RecurringEvent.Kind.ENDED, None, {"reason": "series complete"}, actor_name="promoter")
    return payment


def _end_without_payee(rec: RecurringPayment) -> None:
    """End a series of payouts whose payee is gone. Never expected: a payee is not deleted
    while a series to it is active or paused (payee_delete), and its creation and every
    generation hold the payee's lock; this keeps a series from ever paying a deleted one."""
    logger.warning("recurring payment ended: its payee is deleted", extra={"recurring_id": rec.id})
    RecurringPayment.objects.filter(pk=rec.pk).update(
        status=RecurringStatus.ENDED, next_occurrence_at=None, updated_at=Now()
    )
    _record(rec.id, RecurringEvent.Kind.ENDED, None, {"reason": "payee deleted"}, actor_name="promoter")


def _pending(rec_id: str):
    """The occurrences still SCHEDULED."""
    return ScheduledPayment.objects.filter(recurring_id=rec_id, status=PaymentStatus.SCHEDULED)


def _cancel_by_series(rec_id: str, actor, *, reason: str, not_yet_due_only: bool) -> list[str]:
    """Cancel the series' occurrences still SCHEDULED (only those not yet due when
    ``not_yet_due_only``), marked ``cancelled_by_series`` so that their slots stay free;
    each a CAS that a claim may win, and then that occurrence runs as usual. Returns
    their ids, earliest occurrence first."""
    with connection.cursor() as cur:
        cur.execute(sql.CANCEL_SERIES_OCCURRENCES, {"recurring": rec_id, "not_yet_due_only": not_yet_due_only})
        cancelled = [row[0] for row in sorted(cur.fetchall(), key=lambda row: (row[1], row[0]))]
    PaymentEvent.objects.bulk_create(
        PaymentEvent(
            payment_id=payment_id,
            kind=PaymentEvent.Kind.CANCELLED,
            from_status=PaymentStatus.SCHEDULED,
            to_status=PaymentStatus.CANCELLED,
            actor=actor_label(actor),
            actor_user=actor,
            data={"by_series": reason, "recurring_id": rec_id},
        )
        for payment_id in cancelled
    )
    return cancelled


@dataclass(frozen=True)
class Start:
    """What starting a series from now did: the occurrence it generated, or the one
    already holding that slot (cancelled on its own, it stays cancelled)."""

    payment: ScheduledPayment | None = None
    kept: ScheduledPayment | None = None

    def record(self) -> dict:
        data = {"next_payment_id": self.payment.id if self.payment else None}
        if self.kept is not None and self.kept.status == PaymentStatus.CANCELLED:
            data["kept_cancelled"] = [
                {"payment_id": self.kept.id, "occurrence_at": self.kept.occurrence_at.isoformat()}
            ]
        return data


def _start_from_now(rec: RecurringPayment, actor) -> Start:
    """Generate the first occurrence after the database's now(), or end the series. An
    occurrence cancelled on its own in that slot stays cancelled: the series moves on
    and the tick generates the one after it when it falls due."""
    first = next_occurrence(rec.rule, after=database_now())
    if first is None:
        RecurringPayment.objects.filter(pk=rec.pk).update(
            status=RecurringStatus.ENDED, next_occurrence_at=None, updated_at=Now()
        )
        _record(rec.id, RecurringEvent.Kind.ENDED, actor, {"reason": "no occurrence left"})
        return Start()
    payment = _generate(rec, first)
    if payment is not None:
        return Start(payment=payment)
    holder = ScheduledPayment.objects.filter(recurring_id=rec.id, occurrence_at=first, cancelled_by_series=False)
    return Start(kept=holder.first())


def recurring_create(
    *,
    payer,
    from_account_id: str,
    to_account_id: str | None = None,
    amount: int,
    start_at: datetime,
    interval: str = "",
    cron: str = "",
    timezone: str = "UTC",
    end_at: datetime | None = None,
    count: int | None = None,
    to_payee_id: str | None = None,
) -> RecurringPayment:
    """Create an ACTIVE schedule and, in the same transaction, its first occurrence
    (the first one after now), so the caller sees it straight away."""
    errors: dict[str, list[str]] = {}
    terms = Terms(amount, start_at, interval, cron, timezone, end_at, count)
    with transaction.atomic():
        check_destination(
            payer=payer, from_account_id=from_account_id, to_account_id=to_account_id, to_payee_id=to_payee_id,
            errors=errors,
        )
        last_at = _validated(terms, errors)
        if not errors and next_occurrence(
            series_rule(start_at, interval, cron, timezone, last_at), after=database_now()
        ) is None:
            errors.setdefault("end_at" if end_at else "count", []).append("The series has no occurrence left.")
        if errors:
            raise PaymentValidationError(errors)
        limits.admit_series(payer=payer, to_account_id=to_account_id, terms=terms, last_at=last_at)
        rec = RecurringPayment.objects.create(
            payer=payer,
            from_account_id=from_account_id,
            to_account_id=to_account_id,
            to_payee_id=to_payee_id,
            amount=amount,
            start_at=start_at,
            interval=interval,
            cron=cron,
            timezone=timezone,
            end_at=end_at,
            count=count,
            last_at=last_at,
        )
        _record(rec.id, RecurringEvent.Kind.CREATED, payer, {"amount": amount})
        _start_from_now(rec, payer)
    rec.refresh_from_db()
    return rec


def _locked(rec_id: str) -> RecurringPayment:
    # NO KEY: the id never changes, so inserting occurrences and events that refer to
    # the series (KEY SHARE) never waits on this lock.
    rec = RecurringPayment.objects.select_for_update(no_key=True).filter(pk=rec_id).first()
    if rec is None:
        raise RecurringNotFound()
    return rec


def _check_version(rec: RecurringPayment, expected_version: int | None) -> None:
    """If-Match is checked only when the call would change something: a retry of a
    pause, resume, end or update that already took effect succeeds as a no-op, like
    ``payment_update``, whatever version the retry carries."""
    if expected_version is not None and rec.version != expected_version:
        raise VersionMismatch(rec.version)


def _transition(rec: RecurringPayment, to: str, **changes) -> None:
    won = RecurringPayment.objects.filter(pk=rec.pk, status=rec.status, version=rec.version).update(
        status=to, version=F("version") + 1, updated_at=Now(), **changes
    )
    if not won:  # impossible under the row lock; a zero-row CAS is never ignored
        raise RecurringStateError(rec.status)


def recurring_pause(
    *, recurring_id: str, actor, expected_version: int | None = None, reason: str = ""
) -> RecurringPayment:
    """ACTIVE -> PAUSED: no new occurrences; the pending one is cancelled (by the
    series: a resume before it is due generates it again). Pausing a paused schedule
    is a no-op. ``reason``: why (staff give one in the console); recorded on the PAUSED
    event when given."""
    with transaction.atomic():
        rec = _locked(recurring_id)
        if rec.status == RecurringStatus.PAUSED:
            return rec
        if rec.status != RecurringStatus.ACTIVE:
            raise RecurringStateError(rec.status)
        _check_version(rec, expected_version)
        _transition(rec, RecurringStatus.PAUSED)
        cancelled = _cancel_by_series(rec.id, actor, reason="paused", not_yet_due_only=False)
        _record(rec.id, RecurringEvent.Kind.PAUSED, actor, {"cancelled": cancelled, **_given(reason)})
    return RecurringPayment.objects.get(pk=recurring_id)


def _missed_after(rec: RecurringPayment) -> datetime:
    """The instant after which occurrences count as missed while paused: just before
    the earliest occurrence the pause cancelled, else the pause itself. Not the last
    paid occurrence: occurrences before the series was created, or replaced by an
    update, were never going to be paid and were not missed."""
    pause = RecurringEvent.objects.filter(recurring_id=rec.id, kind=RecurringEvent.Kind.PAUSED).order_by("-id").first()
    if pause is None:  # paused by hand in the database: fall back to the last paid occurrence
        return (
            ScheduledPayment.objects.filter(recurring_id=rec.id)
            .exclude(status=PaymentStatus.CANCELLED)
            .order_by("-occurrence_at")
            .values_list("occurrence_at", flat=True)
            .first()
        ) or rec.start_at - timedelta(microseconds=1)
    first_cancelled = (
        ScheduledPayment.objects.filter(pk__in=pause.data.get("cancelled", []))
        .order_by("occurrence_at")
        .values_list("occurrence_at", flat=True)
        .first()
    )
    return first_cancelled - timedelta(microseconds=1) if first_cancelled else pause.created_at


def recurring_resume(
    *, recurring_id: str, actor, expected_version: int | None = None, reason: str = ""
) -> RecurringPayment:
    """PAUSED -> ACTIVE: the next occurrence is the first one after now; the ones missed
    while paused are skipped (recorded on the event), not paid in a burst. Cancels
    nothing; an occurrence cancelled on its own stays cancelled (``kept_cancelled``).
    ``reason`` as for ``recurring_pause``."""
    with transaction.atomic():
        rec = _locked(recurring_id)
        if rec.status == RecurringStatus.ACTIVE:
            return rec
        if rec.status != RecurringStatus.PAUSED:
            raise RecurringStateError(rec.status)
        _check_version(rec, expected_version)
        skipped = occurrences_between(
            rec.rule, after=_missed_after(rec), until=database_now(), limit=SKIPPED_RECORD_LIMIT
        )
        _transition(rec, RecurringStatus.ACTIVE)
        rec.refresh_from_db()
        start = _start_from_now(rec, actor)
        _record(
            rec.id,
            RecurringEvent.Kind.RESUMED,
            actor,
            {
                "skipped": [m.isoformat() for m in skipped],
                "skipped_truncated": len(skipped) >= SKIPPED_RECORD_LIMIT,
                **start.record(),
                **_given(reason),
            },
        )
    return RecurringPayment.objects.get(pk=recurring_id)


def recurring_end(
    *, recurring_id: str, actor, expected_version: int | None = None, reason: str = ""
) -> RecurringPayment:
    """End the schedule for good and cancel its pending occurrence. Idempotent. ``reason``:
    why (staff give one in the console); recorded on the ENDED event."""
    with transaction.atomic():
        rec = _locked(recurring_id)
        if rec.status == RecurringStatus.ENDED and not _pending(rec.id).exists():
            return rec
        _check_version(rec, expected_version)
        cancelled = _cancel_by_series(rec.id, actor, reason="ended", not_yet_due_only=False)
        if rec.status != RecurringStatus.ENDED:
            _transition(rec, RecurringStatus.ENDED, next_occurrence_at=None)
            detail = {"reason": reason or "ended by user", "cancelled": cancelled}
            _record(rec.id, RecurringEvent.Kind.ENDED, actor, detail)
    return RecurringPayment.objects.get(pk=recurring_id)


def recurring_update(
    *,
    recurring_id: str,
    actor,
    expected_version: int | None = None,
    **changes,
) -> RecurringPayment:
    """Change the amount and/or the schedule for future occurrences. A pending
    occurrence not yet due is replaced by the first occurrence after now under the new
    terms; one already due (not yet claimed) runs as it is (``left_to_run`` on the
    event), and one cancelled on its own stays cancelled (``kept_cancelled``)."""
    allowed = {"amount", "start_at", "interval", "cron", "timezone", "end_at", "count"}
    unknown = set(changes) - allowed
    if unknown:
        raise PaymentValidationError({name: ["Unknown field."] for name in sorted(unknown)})
    with transaction.atomic():
        rec = _locked(recurring_id)
        if rec.status == RecurringStatus.ENDED:
            raise RecurringStateError(rec.status)
        merged = {f: getattr(rec, f) for f in allowed} | changes
        if changes.get("interval"):
            merged["cron"] = ""
        if changes.get("cron"):
            merged["interval"] = ""
        if all(getattr(rec, f) == merged[f] for f in allowed):
            return rec  # nothing changes: a retried PATCH is a no-op
        _check_version(rec, expected_version)
        errors: dict[str, list[str]] = {}
        last_at = _validated(Terms(**merged), errors)
        if errors:
            raise PaymentValidationError(errors)
        if rec.to_payee_id is not None:
            # The payee's lock before the limits' (payee_lock); _start_from_now needs it.
            payee_lock(payee_id=rec.to_payee_id, owner_id=rec.payer_id)
        limits.admit_series(payer=rec.payer, to_account_id=rec.to_account_id, terms=Terms(**merged), last_at=last_at,
                            replacing=rec.id)
        old = {f: _jsonable(getattr(rec, f)) for f in allowed}
        _transition(rec, rec.status, last_at=last_at, **merged)
        rec.refresh_from_db()
        cancelled = _cancel_by_series(rec.id, actor, reason="updated", not_yet_due_only=True)
        left_to_run = list(_pending(rec.id).order_by("occurrence_at", "id").values_list("id", flat=True))
        # A paused schedule gets its next occurrence when it is resumed.
        start = _start_from_now(rec, actor) if rec.status == RecurringStatus.ACTIVE else Start()
        _record(
            rec.id,
            RecurringEvent.Kind.UPDATED,
            actor,
            {"old": old, "new": {f: _jsonable(v) for f, v in merged.items()}, "cancelled": cancelled,
             "left_to_run": left_to_run, **start.record()},
        )
    return RecurringPayment.objects.get(pk=recurring_id)


def _jsonable(value):
    return value.isoformat() if isinstance(value, datetime) else value


# --- the promoter's tick ---------------------------------------------------------------------


def recurring_generate_due(
    *, limit: int = 500, batch: int = GENERATION_BATCH, budget_seconds: float | None = None
) -> int:
    """Generate the next occurrence of every active schedule whose previous occurrence
    is due: at most ``limit`` schedules, one occurrence each, and no new schedule once
    ``budget_seconds`` (DELAYPAY_PROMOTER_BUDGET_SECONDS) are spent; the rest wait for
    the next tick. Safe to run concurrently and repeatedly, and never raises. Returns how
    many occurrences were created.

    Bounded transactions: batches of at most ``batch`` schedules, locked FOR NO KEY
    UPDATE SKIP LOCKED (a schedule locked elsewhere waits for the next tick), with a
    lock timeout; each schedule in a savepoint of its own. A schedule that fails (a
    lock timeout, a deadlock, bad data, a bug) is rolled back alone, logged without
    its data, counted in ``delaypay_recurring_generation_failures_total`` and tried
    again next tick; neither the other schedules nor the promoter's claim that follows
    in the same tick are held up by it."""
    budget = settings.DELAYPAY_PROMOTER_BUDGET_SECONDS if budget_seconds is None else budget_seconds
    deadline = time.monotonic() + budget
    created = 0
    seen: list[str] = []
    while len(seen) < limit and time.monotonic() < deadline:
        made = 0
        try:
            with transaction.atomic():
                with connection.cursor() as cur:
                    cur.execute(SET_LOCAL_LOCK_TIMEOUT, [GENERATION_LOCK_TIMEOUT])
                    cur.execute(sql.CONSTRAINTS_IMMEDIATE)
                    cur.execute(sql.RECURRING_DUE, {"batch": min(batch, limit - len(seen)), "seen": seen})
                    ids = [row[0] for row in cur.fetchall()]
                if not ids:
                    break
                seen += ids
                due = RecurringPayment.objects.filter(pk__in=ids).select_related("payer").order_by("next_occurrence_at")
                for rec in due:
                    if time.monotonic() >= deadline:
                        break  # left as they are: the next tick generates them
                    try:
                        with transaction.atomic():
                            if _generate(rec, rec.next_occurrence_at) is not None:
                                made += 1
                    except Exception as exc:
                        if not connection.is_usable():
                            raise  # the connection is gone: the batch fails as a whole, below
                        _generation_failed(rec.id, exc)
        except Exception as exc:
            # The batch itself failed (its query, its commit, the connection): nothing of
            # it is kept; its schedules are tried again next tick, the claim goes ahead.
            _generation_failed(None, exc)
            if not connection.in_atomic_block and connection.connection is not None and not connection.is_usable():
                connection.close()  # the claim that follows reconnects
            break
        created += made
    return created


def _generation_failed(recurring_id: str | None, exc: Exception) -> None:
    """Log (the schedule, the kind of failure, never the row's data) and count it."""
    reason = _failure_reason(exc)
    metrics.record_recurring_generation_failure(reason)
    extra = {"recurring_id": recurring_id, "reason": reason, "error": type(exc).__name__,
             "sqlstate": getattr(exc.__cause__, "sqlstate", None)}
    # A database error's text may quote the row; its class and SQLSTATE say enough.
    logger.warning("recurring occurrence not generated", extra=extra,
                   exc_info=not isinstance(exc, DatabaseError | RuleError))


_SQLSTATE_REASONS = {"55P03": "lock_timeout", "40P01": "deadlock", "40001": "serialization", "57014": "timeout"}


def _failure_reason(exc: Exception) -> str:
    if isinstance(exc, RuleError):
        return "rule"
    if isinstance(exc, DatabaseError):
        return _SQLSTATE_REASONS.get(getattr(exc.__cause__, "sqlstate", None), "database")
    return "error"
