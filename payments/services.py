"""Payment writes: schedule and cancel. Every state change is a conditional UPDATE
(compare-and-set) plus its audit event, in one transaction."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.db.models.functions import Now

from ledger.models import Account

from .exceptions import PaymentNotCancellable, PaymentNotFound, PaymentValidationError
from .models import Heartbeat, PaymentEvent, PaymentStatus, ScheduledPayment


def actor_label(user) -> str:
    return f"user:{user.pk}" if user is not None else "system"


def db_now() -> datetime:
    """The database clock: the only clock that decides what is due."""
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        return cur.fetchone()[0]


def payment_schedule(
    *,
    payer,
    from_account_id: str,
    to_account_id: str,
    amount: int,
    execute_at: datetime,
) -> ScheduledPayment:
    """Record a payment to run at ``execute_at``; funds are checked at execution time.

    Raises PaymentValidationError (with per-field messages) for rules that need the
    database: account ownership and state, and ``execute_at`` against the database
    clock. Must be called inside a transaction when the caller needs atomicity with
    other writes (an idempotency key); it opens its own otherwise.
    """
    errors: dict[str, list[str]] = {}
    if type(amount) is not int or not 1 <= amount <= settings.DELAYPAY_MAX_AMOUNT:
        errors.setdefault("amount", []).append(
            f"Must be an integer between 1 and {settings.DELAYPAY_MAX_AMOUNT}."
        )
    if execute_at.tzinfo is None:
        errors.setdefault("execute_at", []).append("Must carry an explicit UTC offset.")
    if from_account_id == to_account_id:
        errors.setdefault("to_account", []).append("Must differ from from_account.")

    with transaction.atomic():
        accounts = {
            a.id: a for a in Account.objects.filter(pk__in=[from_account_id, to_account_id])
        }
        source = accounts.get(from_account_id)
        if source is None or source.owner_id != payer.pk:
            errors.setdefault("from_account", []).append("No such account of yours.")
        elif source.status != Account.Status.ACTIVE:
            errors.setdefault("from_account", []).append(f"The account is {source.status}.")
        target = accounts.get(to_account_id)
        if target is None:
            errors.setdefault("to_account", []).append("No such account.")
        elif target.status == Account.Status.CLOSED:
            errors.setdefault("to_account", []).append("The account is closed.")
        if execute_at.tzinfo is not None:
            now = db_now()
            if execute_at <= now:
                errors.setdefault("execute_at", []).append("Must be in the future.")
            elif execute_at > now + timedelta(days=settings.DELAYPAY_MAX_SCHEDULE_DAYS):
                errors.setdefault("execute_at", []).append(
                    f"Must be at most {settings.DELAYPAY_MAX_SCHEDULE_DAYS} days ahead."
                )
        if errors:
            raise PaymentValidationError(errors)

        payment = ScheduledPayment.objects.create(
            payer=payer,
            from_account_id=from_account_id,
            to_account_id=to_account_id,
            amount=amount,
            execute_at=execute_at,
        )
        PaymentEvent.objects.create(
            payment=payment,
            kind=PaymentEvent.Kind.CREATED,
            to_status=PaymentStatus.SCHEDULED,
            actor=actor_label(payer),
            actor_user=payer,
            data={"amount": amount, "execute_at": execute_at.isoformat()},
        )
    payment.refresh_from_db()
    return payment


@dataclass(frozen=True)
class CancelOutcome:
    payment: ScheduledPayment
    cancelled_now: bool  # False: an earlier cancel had already done it


def payment_cancel(*, payment_id: str, actor) -> ScheduledPayment:
    """Cancel a SCHEDULED payment: a CAS that races the claim on the same precondition.

    A repeated cancel returns the cancelled payment; a payment already claimed or
    finished raises PaymentNotCancellable carrying its status.
    """
    return payment_cancel_outcome(payment_id=payment_id, actor=actor).payment


def payment_cancel_outcome(*, payment_id: str, actor) -> CancelOutcome:
    """``payment_cancel`` that also says whether this call won the CAS (the admin
    reports "cancelled" and "already cancelled" apart)."""
    with transaction.atomic():
        won = ScheduledPayment.objects.filter(pk=payment_id, status=PaymentStatus.SCHEDULED).update(
            status=PaymentStatus.CANCELLED,
            cancelled_at=Now(),
            updated_at=Now(),
            version=F("version") + 1,
        )
        if won:
            PaymentEvent.objects.create(
                payment_id=payment_id,
                kind=PaymentEvent.Kind.CANCELLED,
                from_status=PaymentStatus.SCHEDULED,
                to_status=PaymentStatus.CANCELLED,
                actor=actor_label(actor),
                actor_user=actor,
            )
    # Zero rows means someone else won (or it never existed): answer from the real row.
    payment = ScheduledPayment.objects.filter(pk=payment_id).first()
    if payment is None:
        raise PaymentNotFound()
    if payment.status != PaymentStatus.CANCELLED:
        raise PaymentNotCancellable(payment.status)
    return CancelOutcome(payment, cancelled_now=bool(won))


def heartbeat_record(*, name: str, value: int = 0) -> None:
    """Record that ``name`` ran just now (database clock), with what it reported."""
    # beat_at is left to its database default, now(), in the insert and the update alike.
    Heartbeat.objects.bulk_create(
        [Heartbeat(name=name, value=value)],
        update_conflicts=True,
        unique_fields=["name"],
        update_fields=["beat_at", "value"],
    )
