"""Recurring payments: a schedule that generates ordinary one-shot payments.

Each occurrence is a ScheduledPayment like any other (same claim, same execution,
same guarantees), created ahead of time one at a time: the next occurrence is
generated when the previous one falls due, by the promoter's tick, under a row lock
taken with SKIP LOCKED (concurrent promoters share the work) and a partial unique
index on (recurring, occurrence_at) so a retried or duplicated generation can never
create an occurrence twice. Every transition of the schedule itself is a CAS on its
status and version.
"""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, InterfaceError, OperationalError, connection, transaction
from django.db.models import F
from django.db.models.functions import Now

from . import sql
from .exceptions import (
    PaymentNotCancellable,
    PaymentValidationError,
    RecurringNotFound,
    RecurringStateError,
    VersionMismatch,
)
from .models import PaymentStatus, RecurringEvent, RecurringPayment, RecurringStatus, ScheduledPayment
from .rules import Rule, RuleError, next_occurrence, nth_occurrence, occurrences_between, shortest_interval_seconds
from .services import _check_amount, actor_label, check_accounts, create_payment_row, db_now, payment_cancel

logger = logging.getLogger(__name__)

SKIPPED_RECORD_LIMIT = 100


def rule_of(rec: RecurringPayment) -> Rule:
    return Rule(
        start_at=rec.start_at, interval=rec.interval, cron=rec.cron, timezone=rec.timezone, end_at=rec.last_at
    )


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
    """Check the terms; return the series' last instant (from end_at and count)."""
    _check_amount(terms.amount, errors)
    if bool(terms.interval) == bool(terms.cron):
        errors.setdefault("interval", []).append("Give exactly one of interval and cron.")
        return None
    if terms.start_at.tzinfo is None:
        errors.setdefault("start_at", []).append("Must carry an explicit UTC offset.")
        return None
    if terms.end_at is not None and terms.end_at <= terms.start_at:
        errors.setdefault("end_at", []).append("Must be after start_at.")
    if db_now() + timedelta(days=settings.DELAYPAY_MAX_SCHEDULE_DAYS) < terms.start_at:
        errors.setdefault("start_at", []).append(
            f"Must be at most {settings.DELAYPAY_MAX_SCHEDULE_DAYS} days ahead."
        )
    rule = Rule(terms.start_at, terms.interval, terms.cron, terms.timezone, terms.end_at)
    try:
        rule.zone  # noqa: B018 - validates the time zone name
        shortest = shortest_interval_seconds(rule)
        if shortest < settings.DELAYPAY_MIN_RECURRING_INTERVAL:
            errors.setdefault("interval" if terms.interval else "cron", []).append(
                f"Occurrences must be at least {settings.DELAYPAY_MIN_RECURRING_INTERVAL} seconds apart."
            )
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


def _generate(rec: RecurringPayment, occurrence_at: datetime) -> ScheduledPayment | None:
    """Create the occurrence at ``occurrence_at`` and move the schedule past it. The
    caller holds the schedule's row lock inside a transaction."""
    payment = None
    try:
        with transaction.atomic():
            payment = create_payment_row(
                payer=rec.payer,
                from_account_id=rec.from_account_id,
                to_account_id=rec.to_account_id,
                amount=rec.amount,
                execute_at=occurrence_at,
                recurring_id=rec.id,
                occurrence_at=occurrence_at,
                actor=f"recurring:{rec.id}",
            )
    except IntegrityError as exc:
        # Only "this occurrence already exists" means generating it again creates nothing;
        # any other violation is a real error (the schedule's savepoint logs and skips it).
        if getattr(getattr(exc.__cause__, "diag", None), "constraint_name", None) != "payments_occurrence_unique":
            raise
    following = next_occurrence(rule_of(rec), after=occurrence_at)
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


def _pending(rec_id: str):
    """The occurrences still SCHEDULED."""
    return ScheduledPayment.objects.filter(recurring_id=rec_id, status=PaymentStatus.SCHEDULED)


def _cancel_pending(rec_id: str, actor) -> list[str]:
    """Cancel the occurrences still SCHEDULED; one already claimed runs as usual."""
    cancelled = []
    for payment_id in _pending(rec_id).values_list("id", flat=True):
        try:
            payment_cancel(payment_id=payment_id, actor=actor)
            cancelled.append(payment_id)
        except PaymentNotCancellable:
            pass
    return cancelled


def _start_from_now(rec: RecurringPayment, actor) -> ScheduledPayment | None:
    """Generate the first occurrence after the database's now(), or end the series."""
    first = next_occurrence(rule_of(rec), after=db_now())
    if first is None:
        RecurringPayment.objects.filter(pk=rec.pk).update(
            status=RecurringStatus.ENDED, next_occurrence_at=None, updated_at=Now()
        )
        _record(rec.id, RecurringEvent.Kind.ENDED, actor, {"reason": "no occurrence left"})
        return None
    return _generate(rec, first)


def recurring_create(
    *,
    payer,
    from_account_id: str,
    to_account_id: str,
    amount: int,
    start_at: datetime,
    interval: str = "",
    cron: str = "",
    timezone: str = "UTC",
    end_at: datetime | None = None,
    count: int | None = None,
) -> RecurringPayment:
    """Create an ACTIVE schedule and, in the same transaction, its first occurrence
    (the first one after now), so the caller sees it straight away."""
    errors: dict[str, list[str]] = {}
    terms = Terms(amount, start_at, interval, cron, timezone, end_at, count)
    with transaction.atomic():
        check_accounts(payer=payer, from_account_id=from_account_id, to_account_id=to_account_id, errors=errors)
        last_at = _validated(terms, errors)
        if not errors and next_occurrence(Rule(start_at, interval, cron, timezone, last_at), after=db_now()) is None:
            errors.setdefault("end_at" if end_at else "count", []).append("The series has no occurrence left.")
        if errors:
            raise PaymentValidationError(errors)
        rec = RecurringPayment.objects.create(
            payer=payer,
            from_account_id=from_account_id,
            to_account_id=to_account_id,
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
    rec = RecurringPayment.objects.select_for_update().filter(pk=rec_id).first()
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


def recurring_pause(*, recurring_id: str, actor, expected_version: int | None = None) -> RecurringPayment:
    """ACTIVE -> PAUSED: no new occurrences; the pending one is cancelled. Pausing a
    paused schedule is a no-op."""
    with transaction.atomic():
        rec = _locked(recurring_id)
        if rec.status == RecurringStatus.PAUSED:
            return rec
        if rec.status != RecurringStatus.ACTIVE:
            raise RecurringStateError(rec.status)
        _check_version(rec, expected_version)
        _transition(rec, RecurringStatus.PAUSED)
        cancelled = _cancel_pending(rec.id, actor)
        _record(rec.id, RecurringEvent.Kind.PAUSED, actor, {"cancelled": cancelled})
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


def recurring_resume(*, recurring_id: str, actor, expected_version: int | None = None) -> RecurringPayment:
    """PAUSED -> ACTIVE: the next occurrence is the first one after now; the ones missed
    while paused are skipped (recorded on the event), not paid in a burst."""
    with transaction.atomic():
        rec = _locked(recurring_id)
        if rec.status == RecurringStatus.ACTIVE:
            return rec
        if rec.status != RecurringStatus.PAUSED:
            raise RecurringStateError(rec.status)
        _check_version(rec, expected_version)
        skipped = occurrences_between(
            rule_of(rec), after=_missed_after(rec), until=db_now(), limit=SKIPPED_RECORD_LIMIT
        )
        _transition(rec, RecurringStatus.ACTIVE)
        rec.refresh_from_db()
        payment = _start_from_now(rec, actor)
        _record(
            rec.id,
            RecurringEvent.Kind.RESUMED,
            actor,
            {
                "skipped": [m.isoformat() for m in skipped],
                "skipped_truncated": len(skipped) >= SKIPPED_RECORD_LIMIT,
                "next_payment_id": payment.id if payment else None,
            },
        )
    return RecurringPayment.objects.get(pk=recurring_id)


def recurring_end(*, recurring_id: str, actor, expected_version: int | None = None) -> RecurringPayment:
    """End the schedule for good and cancel its pending occurrence. Idempotent."""
    with transaction.atomic():
        rec = _locked(recurring_id)
        if rec.status == RecurringStatus.ENDED and not _pending(rec.id).exists():
            return rec
        _check_version(rec, expected_version)
        cancelled = _cancel_pending(rec.id, actor)
        if rec.status != RecurringStatus.ENDED:
            _transition(rec, RecurringStatus.ENDED, next_occurrence_at=None)
            _record(rec.id, RecurringEvent.Kind.ENDED, actor, {"reason": "ended by user", "cancelled": cancelled})
    return RecurringPayment.objects.get(pk=recurring_id)


def recurring_update(
    *,
    recurring_id: str,
    actor,
    expected_version: int | None = None,
    **changes,
) -> RecurringPayment:
    """Change the amount and/or the schedule for future occurrences. The pending
    occurrence is replaced by the first occurrence after now under the new terms."""
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
        old = {f: _jsonable(getattr(rec, f)) for f in allowed}
        _transition(rec, rec.status, last_at=last_at, **merged)
        rec.refresh_from_db()
        cancelled = _cancel_pending(rec.id, actor)
        # A paused schedule gets its next occurrence when it is resumed.
        payment = _start_from_now(rec, actor) if rec.status == RecurringStatus.ACTIVE else None
        _record(
            rec.id,
            RecurringEvent.Kind.UPDATED,
            actor,
            {"old": old, "new": {f: _jsonable(v) for f, v in merged.items()}, "cancelled": cancelled,
             "next_payment_id": payment.id if payment else None},
        )
    return RecurringPayment.objects.get(pk=recurring_id)


def _jsonable(value):
    return value.isoformat() if isinstance(value, datetime) else value


def recurring_generate_due(*, limit: int = 500) -> int:
    """Generate the next occurrence of every active schedule whose previous occurrence
    is due. Safe to run concurrently and repeatedly. Returns how many were created.

    Each schedule is generated in its own savepoint: one that fails (bad data, a bug)
    is logged and left as it was, and neither the others nor the promoter's claim that
    follows in the same tick are held up by it."""
    created = 0
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(sql.RECURRING_DUE, [limit])
            ids = [row[0] for row in cur.fetchall()]
        for rec in RecurringPayment.objects.filter(pk__in=ids).select_related("payer").order_by("next_occurrence_at"):
            try:
                with transaction.atomic():
                    if _generate(rec, rec.next_occurrence_at) is not None:
                        created += 1
            except (OperationalError, InterfaceError):
                raise  # the connection is at fault, not this schedule
            except Exception:
                logger.exception("recurring occurrence not generated", extra={"recurring_id": rec.id})
    return created
