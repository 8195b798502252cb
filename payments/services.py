"""Payment writes: schedule, update, cancel, and the review queue's re-drive and resolve.
Every state change is a conditional UPDATE (compare-and-set) plus its audit event, in
one transaction."""

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from common.authz import ConflictOfInterest
from common.db import database_now
from ledger.models import Account, StaffAction
from ledger.services import clean_reason, staff_action_record

from . import limits, sql
from .exceptions import (
    PaymentNotCancellable,
    PaymentNotEditable,
    PaymentNotFound,
    PaymentNotInReview,
    PaymentValidationError,
    PayoutOutcomeUnknown,
    VersionMismatch,
)
from .models import (
    FailureReason,
    Heartbeat,
    PaymentEvent,
    PaymentStatus,
    Payout,
    PayoutState,
    ScheduledPayment,
)

MAX_JITTER_SECONDS = 3600
MAX_EXPIRES_AFTER = timedelta(days=365)


def actor_label(user) -> str:
    return f"user:{user.pk}" if user is not None else "system"


def _check_amount(amount, errors: dict[str, list[str]]) -> None:
    if type(amount) is not int or not 1 <= amount <= settings.DELAYPAY_MAX_AMOUNT:
        errors.setdefault("amount", []).append(f"Must be an integer between 1 and {settings.DELAYPAY_MAX_AMOUNT}.")


def _check_execute_at(execute_at: datetime, errors: dict[str, list[str]], *, field: str = "execute_at") -> None:
    """Strictly after the database clock and at most DELAYPAY_MAX_SCHEDULE_DAYS ahead."""
    if execute_at.tzinfo is None:
        errors.setdefault(field, []).append("Must carry an explicit UTC offset.")
        return
    now = database_now()
    if execute_at <= now:
        errors.setdefault(field, []).append("Must be in the future.")
    elif execute_at > now + timedelta(days=settings.DELAYPAY_MAX_SCHEDULE_DAYS):
        errors.setdefault(field, []).append(f"Must be at most {settings.DELAYPAY_MAX_SCHEDULE_DAYS} days ahead.")


def check_accounts(*, payer, from_account_id: str, to_account_id: str, errors: dict[str, list[str]]) -> None:
    """The payer owns an active source; the target exists and is not closed."""
    if from_account_id == to_account_id:
        errors.setdefault("to_account", []).append("Must differ from from_account.")
    accounts = {a.id: a for a in Account.objects.filter(pk__in=[from_account_id, to_account_id])}
    check_source(payer=payer, source=accounts.get(from_account_id), errors=errors)
    target = accounts.get(to_account_id)
    if target is None:
        errors.setdefault("to_account", []).append("No such account.")
    elif target.status == Account.Status.CLOSED:
        errors.setdefault("to_account", []).append("The account is closed.")


def payee_lock(*, payee_id: str, owner_id: int) -> str | None:
    """The rail of ``owner_id``'s payee ``payee_id``, share-locked until the caller's
    transaction ends; None when there is no such payee of theirs or it is deleted.

    Whatever creates something that pays a payee (a payout, a series, an occurrence) takes
    this lock before inserting it, so that ``payee_delete`` and the creation are
    serialized on the payee's row (sql.LOCK_PAYEE): one of them wins, the other is
    refused. Take it before any other lock the creation needs except the series' own row
    (the per-payer limits' advisory lock comes after): a delete waits only on this row
    and holds nothing else, so no cycle runs through it."""
    if not connection.in_atomic_block:
        raise RuntimeError("payee_lock outside a transaction would release the lock at once")
    with connection.cursor() as cur:
        cur.execute(sql.LOCK_PAYEE, {"id": payee_id, "owner": owner_id})
        row = cur.fetchone()
    return row[0] if row else None


def payout_pending(payment_id: str) -> Payout | None:
    """The payout's record while its funds are reserved and its outcome unknown."""
    return Payout.objects.filter(payment_id=payment_id, state=PayoutState.PENDING).first()


# Resolving a parked payout whose funds are reserved asks its rail first: payouts/apps.py
# registers payouts/payees.py's payout_resolve_failed here, so the engine calls no rail.
_parked_payout_resolvers: list[Callable[..., bool]] = []


def register_parked_payout_resolver(resolver: Callable[..., bool]) -> None:
    """``resolver(payout=, actor=, reason=)``: True when it resolved the payout as failed,
    False when it was no longer parked with a reserve; raises what the rail's answer means."""
    _parked_payout_resolvers[:] = [resolver]


def parked_payout_resolver(*, payout: Payout, actor, reason: str) -> bool:
    if not _parked_payout_resolvers:
        raise RuntimeError("no resolver of parked payouts is registered (the payouts app is not installed)")
    return _parked_payout_resolvers[0](payout=payout, actor=actor, reason=reason)


def check_payee(*, payer, to_payee_id: str, errors: dict[str, list[str]]) -> str:
    """The payee is the payer's and not deleted; returns its rail. In the caller's
    transaction, which it keeps from deleting the payee until it ends (``payee_lock``)."""
    rail = payee_lock(payee_id=to_payee_id, owner_id=payer.pk)
    if rail is None:
        errors.setdefault("to_payee", []).append("No such payee of yours.")
        return ""
    return rail


def check_destination(
    *, payer, from_account_id: str, to_account_id: str | None, to_payee_id: str | None, errors: dict[str, list[str]]
) -> str:
    """Where a payment or a series pays: exactly one of an account (both accounts checked)
    or a payee of the payer's (the source account checked, the payee locked to the end of
    the caller's transaction). Returns the payee's rail, "" for an account."""
    if to_account_id is None and to_payee_id is None:
        errors.setdefault("to_account", []).append("Required: give to_account (an account) or to_payee (a payee).")
    elif to_account_id is not None and to_payee_id is not None:
        errors.setdefault("to_payee", []).append("Give to_account or to_payee, not both.")
    elif to_payee_id is not None:
        check_source(payer=payer, source=Account.objects.filter(pk=from_account_id).first(), errors=errors)
        return check_payee(payer=payer, to_payee_id=to_payee_id, errors=errors)
    else:
        check_accounts(payer=payer, from_account_id=from_account_id, to_account_id=to_account_id, errors=errors)
    return ""


def check_source(*, payer, source: Account | None, errors: dict[str, list[str]]) -> None:
    """The payer owns the active source account (``None``: no such account)."""
    if source is None or source.owner_id != payer.pk:
        errors.setdefault("from_account", []).append("No such account of yours.")
    elif source.status != Account.Status.ACTIVE:
        errors.setdefault("from_account", []).append(f"The account is {source.status}.")


def with_jitter(requested: datetime, jitter_seconds: int) -> datetime:
    """Uniform in [requested, requested + jitter], never earlier than requested."""
    if not jitter_seconds:
        return requested
    return requested + timedelta(microseconds=random.randint(0, jitter_seconds * 1_000_000))


def create_payment_row(
    *,
    payer,
    from_account_id: str,
    to_account_id: str | None,
    amount: int,
    execute_at: datetime,
    jitter_seconds: int = 0,
    expires_after: timedelta | None = None,
    recurring_id: str | None = None,
    occurrence_at: datetime | None = None,
    actor: str | None = None,
    to_payee_id: str | None = None,
    rail: str = "",
) -> ScheduledPayment:
    """Insert a SCHEDULED payment and its ``created`` event (caller's transaction).
    No validation: callers have done it (the API) or own the terms (a recurring rule)."""
    payment = ScheduledPayment.objects.create(
        payer=payer,
        from_account_id=from_account_id,
        to_account_id=to_account_id,
        to_payee_id=to_payee_id,
        rail=rail,
        amount=amount,
        execute_at=with_jitter(execute_at, jitter_seconds),
        requested_execute_at=execute_at,
        jitter_seconds=jitter_seconds,
        expires_after=expires_after,
        recurring_id=recurring_id,
        occurrence_at=occurrence_at,
    )
    data = {"amount": amount, "execute_at": payment.execute_at.isoformat()}
    if recurring_id:
        data["recurring_id"] = recurring_id
    PaymentEvent.objects.create(
        payment=payment,
        kind=PaymentEvent.Kind.CREATED,
        to_status=PaymentStatus.SCHEDULED,
        actor=actor or actor_label(payer),
        actor_user=payer if actor is None else None,
        data=data,
    )
    return payment


def payment_schedule(
    *,
    payer,
    from_account_id: str,
    to_account_id: str | None = None,
    amount: int,
    execute_at: datetime,
    jitter_seconds: int = 0,
    expires_after: timedelta | None = None,
    to_payee_id: str | None = None,
) -> ScheduledPayment:
    """Record a payment to run at ``execute_at`` (plus up to ``jitter_seconds``, drawn
    now); funds are checked at execution time.

    Raises PaymentValidationError (with per-field messages) for rules that need the
    database: account ownership and state, and ``execute_at`` against the database
    clock; then SystemAccountPayee for a system payee and a limit error when a per-user
    limit would be passed (payments/limits.py). Runs in the caller's transaction when
    there is one (an idempotency key).
    """
    errors: dict[str, list[str]] = {}
    _check_amount(amount, errors)
    if type(jitter_seconds) is not int or not 0 <= jitter_seconds <= MAX_JITTER_SECONDS:
        errors.setdefault("jitter_seconds", []).append(f"Must be an integer between 0 and {MAX_JITTER_SECONDS}.")
    if expires_after is not None and not timedelta(seconds=1) <= expires_after <= MAX_EXPIRES_AFTER:
        errors.setdefault("expires_after", []).append("Must be between 1 second and 365 days.")
    with transaction.atomic():
        rail = check_destination(
            payer=payer, from_account_id=from_account_id, to_account_id=to_account_id, to_payee_id=to_payee_id,
            errors=errors,
        )
        _check_execute_at(execute_at, errors)
        if errors:
            raise PaymentValidationError(errors)
        # No system payee, and the per-user limits, under a per-payer lock held to commit.
        limits.admit_payment(
            payer=payer, to_account_id=to_account_id, amount=amount, execute_at=execute_at,
            jitter_seconds=jitter_seconds or 0,
        )
        payment = create_payment_row(
            payer=payer,
            from_account_id=from_account_id,
            to_account_id=to_account_id,
            amount=amount,
            execute_at=execute_at,
            jitter_seconds=jitter_seconds or 0,
            expires_after=expires_after,
            to_payee_id=to_payee_id,
            rail=rail,
        )
    payment.refresh_from_db()
    return payment


def payment_update(
    *,
    payment_id: str,
    actor,
    amount: int | None = None,
    execute_at: datetime | None = None,
    expected_version: int | None = None,
) -> ScheduledPayment:
    """Change the amount and/or the due time of a SCHEDULED payment (a CAS that bumps
    ``version``). ``expected_version`` (from If-Match) makes it optimistic: a stale
    version raises VersionMismatch. Already claimed or finished: PaymentNotEditable.

    Idempotent under retries: asking for the values the payment already has changes
    nothing and succeeds, whatever the version.
    """
    errors: dict[str, list[str]] = {}
    if amount is not None:
        _check_amount(amount, errors)
    if execute_at is not None:
        _check_execute_at(execute_at, errors)
    # Without If-Match a concurrent edit between our read and our CAS is retried;
    # with it, the caller asked to fail on any change they have not seen.
    for _ in range(3):
        with transaction.atomic():
            current = ScheduledPayment.objects.filter(pk=payment_id).first()
            if current is None:
                raise PaymentNotFound()
            requested = current.requested_execute_at or current.execute_at
            if (amount is None or amount == current.amount) and (execute_at is None or execute_at == requested):
                return current  # already as asked: a retried PATCH changes nothing
            if errors:
                raise PaymentValidationError(errors)
            new_amount = amount if amount is not None else current.amount
            new_execute_at = (
                with_jitter(execute_at, current.jitter_seconds) if execute_at is not None else current.execute_at
            )
            # The daily limit on the day it would fall on; a payment the CAS below will not
            # change (claimed, finished, another version) gets that answer, not this one.
            if current.status == PaymentStatus.SCHEDULED and expected_version in (None, current.version):
                limits.admit_change(payment=current, amount=new_amount, execute_at=new_execute_at)
            with connection.cursor() as cur:
                cur.execute(
                    sql.UPDATE_SCHEDULED,
                    {
                        "id": payment_id,
                        "amount": new_amount,
                        "execute_at": new_execute_at,
                        "requested": execute_at if execute_at is not None else requested,
                        "version": expected_version if expected_version is not None else current.version,
                    },
                )
                row = cur.fetchone()
            if row is not None:
                old_amount, old_execute_at, new_version = row
                PaymentEvent.objects.create(
                    payment_id=payment_id,
                    kind=PaymentEvent.Kind.UPDATED,
                    from_status=PaymentStatus.SCHEDULED,
                    to_status=PaymentStatus.SCHEDULED,
                    attempt=current.attempt,
                    actor=actor_label(actor),
                    actor_user=actor,
                    data={
                        "old": {"amount": old_amount, "execute_at": old_execute_at.isoformat()},
                        "new": {"amount": new_amount, "execute_at": new_execute_at.isoformat()},
                        "version": new_version,
                    },
                )
                return ScheduledPayment.objects.get(pk=payment_id)
        fresh = ScheduledPayment.objects.get(pk=payment_id)
        if fresh.status != PaymentStatus.SCHEDULED:
            raise PaymentNotEditable(fresh.status)
        if expected_version is not None:
            raise VersionMismatch(fresh.version)
    raise VersionMismatch(fresh.version)


@dataclass(frozen=True)
class CancelOutcome:
    payment: ScheduledPayment
    cancelled_now: bool  # False: an earlier cancel had already done it


def _check_version(payment_id: str, expected_version: int | None, *, statuses: list[str]) -> None:
    """If-Match on a state change: a payment the change would apply to (one in
    ``statuses``) must be at ``expected_version``, else VersionMismatch. The row lock is
    held to the end of the caller's transaction, so the CAS that follows sees that
    version. A payment the change no longer applies to is the caller's to classify: a
    retry of a change that took effect answers 200 whatever version it names, a wrong
    status its 409."""
    if expected_version is None:
        return
    current = (
        ScheduledPayment.objects.select_for_update(no_key=True)
        .filter(pk=payment_id, status__in=statuses)
        .values_list("version", flat=True)
        .first()
    )
    if current is not None and current != expected_version:
        raise VersionMismatch(current)


def payment_cancel(*, payment_id: str, actor, expected_version: int | None = None) -> ScheduledPayment:
    """Cancel a SCHEDULED (or NEEDS_REVIEW) payment: a CAS that races the claim on the
    same precondition. ``expected_version`` (from If-Match) makes it optimistic.

    A repeated cancel returns the cancelled payment; a payment already claimed or
    finished raises PaymentNotCancellable carrying its status.
    """
    return payment_cancel_outcome(payment_id=payment_id, actor=actor, expected_version=expected_version).payment


def payment_cancel_outcome(*, payment_id: str, actor, expected_version: int | None = None) -> CancelOutcome:
    """``payment_cancel`` that also says whether this call won the CAS (the admin
    reports "cancelled" and "already cancelled" apart)."""
    with transaction.atomic(), connection.cursor() as cur:
        _check_version(payment_id, expected_version, statuses=[PaymentStatus.SCHEDULED, PaymentStatus.NEEDS_REVIEW])
        cur.execute(sql.CANCEL_PENDING, [payment_id])
        row = cur.fetchone()
        if row is not None:
            PaymentEvent.objects.create(
                payment_id=payment_id,
                kind=PaymentEvent.Kind.CANCELLED,
                from_status=row[0],
                to_status=PaymentStatus.CANCELLED,
                actor=actor_label(actor),
                actor_user=actor,
            )
    # Nothing updated means someone else won (or it never existed): answer from the real row.
    payment = ScheduledPayment.objects.filter(pk=payment_id).first()
    if payment is None:
        raise PaymentNotFound()
    if payment.status in (PaymentStatus.SCHEDULED, PaymentStatus.NEEDS_REVIEW) and payment.is_payout:
        raise PayoutOutcomeUnknown(payment.status)  # CANCEL_PENDING skips a payout with reserved funds
    if payment.status != PaymentStatus.CANCELLED:
        raise PaymentNotCancellable(payment.status)
    return CancelOutcome(payment, cancelled_now=row is not None)


def payment_cancel_by_staff(
    *, payment_id: str, actor, reason: str, expected_version: int | None = None
) -> CancelOutcome:
    """A staff member cancels a payment (the admin's Cancel, or the API on someone else's
    payment): ``payment_cancel_outcome`` and a ``payment_cancel`` staff action with the
    author and ``reason``, in one transaction. The reason is required (ReasonRequired)."""
    reason = clean_reason(reason)
    with transaction.atomic():
        outcome = payment_cancel_outcome(payment_id=payment_id, actor=actor, expected_version=expected_version)
        if outcome.cancelled_now:
            staff_action_record(
                actor=actor, action=StaffAction.Kind.PAYMENT_CANCEL, reason=reason,
                account_id=outcome.payment.from_account_id, payment_id=payment_id, amount=outcome.payment.amount,
            )
    return outcome


MAX_REVIEW_REASON = 500


def _check_review_reason(reason, errors: dict[str, list[str]]) -> None:
    if not isinstance(reason, str) or not reason.strip():
        errors.setdefault("reason", []).append("Say why (it goes into the payment's audit trail).")
    elif len(reason) > MAX_REVIEW_REASON:
        errors.setdefault("reason", []).append(f"At most {MAX_REVIEW_REASON} characters.")


def _last_review_event(payment_id: str) -> PaymentEvent | None:
    review_kinds = [PaymentEvent.Kind.PARKED, PaymentEvent.Kind.REDRIVEN, PaymentEvent.Kind.FAILED]
    return PaymentEvent.objects.filter(payment_id=payment_id, kind__in=review_kinds).order_by("-id").first()


def _refuse_a_party(*, payment_id: str, actor) -> None:
    """Segregation of duties: whoever created a payment, or owns an account or payee it
    pays from or to, may not re-drive or resolve it, whatever permissions they hold
    (``ConflictOfInterest``). A payment that does not exist is left to the caller."""
    parties = (
        ScheduledPayment.objects.filter(pk=payment_id)
        .values_list("payer_id", "from_account__owner_id", "to_account__owner_id", "to_payee__owner_id")
        .first()
    )
    if parties is not None and getattr(actor, "pk", None) in parties:
        raise ConflictOfInterest(
            "You created this payment or own an account or payee it pays from or to: another staff member "
            "must re-drive or resolve it."
        )


@dataclass
class ReviewOutcome:
    payment: ScheduledPayment
    changed_now: bool  # False: an earlier identical call had already done it


def payment_redrive(
    *, payment_id: str, actor, reason: str, execute_at: datetime | None = None, expected_version: int | None = None
) -> ReviewOutcome:
    """Send a NEEDS_REVIEW payment through again: back to SCHEDULED with a fresh retry
    budget, due at once or at ``execute_at``. A CAS on NEEDS_REVIEW, audited with the
    staff actor and reason. Repeating it after it succeeded changes nothing and answers
    the payment as it is now; on a payment that is not in review it raises
    PaymentNotInReview. A party to the payment may not (``ConflictOfInterest``)."""
    errors: dict[str, list[str]] = {}
    _check_review_reason(reason, errors)
    if execute_at is not None:
        _check_execute_at(execute_at, errors)
    if errors:
        raise PaymentValidationError(errors)
    _refuse_a_party(payment_id=payment_id, actor=actor)
    with transaction.atomic(), connection.cursor() as cur:
        _check_version(payment_id, expected_version, statuses=[PaymentStatus.NEEDS_REVIEW])
        cur.execute(sql.REDRIVE, {"id": payment_id, "next_attempt_at": execute_at})
        row = cur.fetchone()
        if row is not None:
            data = {"reason": reason, **({"execute_at": execute_at.isoformat()} if execute_at else {})}
            PaymentEvent.objects.create(
                payment_id=payment_id, kind=PaymentEvent.Kind.REDRIVEN, from_status=PaymentStatus.NEEDS_REVIEW,
                to_status=PaymentStatus.SCHEDULED, attempt=row[0], actor=actor_label(actor), actor_user=actor,
                data=data,
            )
            return ReviewOutcome(ScheduledPayment.objects.get(pk=payment_id), changed_now=True)
    payment = ScheduledPayment.objects.filter(pk=payment_id).first()
    if payment is None:
        raise PaymentNotFound()
    last = _last_review_event(payment_id)
    if last is not None and last.kind == PaymentEvent.Kind.REDRIVEN:
        return ReviewOutcome(payment, changed_now=False)  # re-driven already: a retried request
    raise PaymentNotInReview(payment.status)


def payment_resolve(
    *, payment_id: str, actor, outcome: str, reason: str, expected_version: int | None = None
) -> ReviewOutcome:
    """Close a NEEDS_REVIEW payment as FAILED(resolved_by_staff): nothing moves, the
    reason and the staff actor go into its failed event. Only ``outcome="failed"`` is
    offered: a payment whose money moved is never parked (the guard converges it to
    EXECUTED), so there is nothing else to resolve it to. Idempotent like re-drive; a
    party to the payment may not (``ConflictOfInterest``)."""
    errors: dict[str, list[str]] = {}
    if outcome != "failed":
        errors.setdefault("outcome", []).append('Must be "failed".')
    _check_review_reason(reason, errors)
    if errors:
        raise PaymentValidationError(errors)
    _refuse_a_party(payment_id=payment_id, actor=actor)
    payout = payout_pending(payment_id)
    if payout is not None:
        # A parked payout with its funds reserved: its rail decides (payouts/payees.py,
        # payout_resolve_failed, registered by payouts/apps.py).
        with transaction.atomic():
            _check_version(payment_id, expected_version, statuses=[PaymentStatus.NEEDS_REVIEW])
        if parked_payout_resolver(payout=payout, actor=actor, reason=reason):
            return ReviewOutcome(ScheduledPayment.objects.get(pk=payment_id), changed_now=True)
    with transaction.atomic(), connection.cursor() as cur:
        _check_version(payment_id, expected_version, statuses=[PaymentStatus.NEEDS_REVIEW])
        cur.execute(sql.RESOLVE_FAILED, {"id": payment_id})
        row = cur.fetchone()
        if row is not None:
            PaymentEvent.objects.create(
                payment_id=payment_id, kind=PaymentEvent.Kind.FAILED, from_status=PaymentStatus.NEEDS_REVIEW,
                to_status=PaymentStatus.FAILED, attempt=row[0], actor=actor_label(actor), actor_user=actor,
                data={"outcome": "resolved", "failure_reason": FailureReason.RESOLVED_BY_STAFF.value,
                      "review_reason": row[1], "reason": reason},
            )
            return ReviewOutcome(ScheduledPayment.objects.get(pk=payment_id), changed_now=True)
    payment = ScheduledPayment.objects.filter(pk=payment_id).first()
    if payment is None:
        raise PaymentNotFound()
    if payment.status == PaymentStatus.FAILED and payment.failure_reason == FailureReason.RESOLVED_BY_STAFF:
        return ReviewOutcome(payment, changed_now=False)
    raise PaymentNotInReview(payment.status)


def heartbeat_record(*, name: str, value: int = 0) -> None:
    """Record that ``name`` ran just now (database clock), with what it reported."""
    heartbeats_record(values={name: value})


def heartbeats_record(*, values: dict[str, int]) -> None:
    """``heartbeat_record`` of several names in one statement: they share one ``beat_at``,
    which tells the readings of one run apart from those of an earlier one."""
    # beat_at is left to its database default, now(), in the insert and the update alike.
    Heartbeat.objects.bulk_create(
        [Heartbeat(name=name, value=value) for name, value in values.items()],
        update_conflicts=True,
        unique_fields=["name"],
        update_fields=["beat_at", "value"],
    )
