"""Payees (someone outside the ledger, reached through a rail) and the staff's resolution
of a parked payout against its rail. Reads are scoped like payments: a payee is its
owner's; staff with ``payments.view_payee`` read every one."""

from django.db import connection, models, transaction
from django.db.models import Func, QuerySet
from django.db.models.functions import Now

from common.authz import staff_may_view
from ledger.services import ledger_resolve_pending
from payments import sql
from payments.exceptions import (
    PayeeDeleteForbidden,
    PayeeInUse,
    PayeeNotFound,
    PaymentValidationError,
    PayoutPaidAtRail,
)
from payments.exceptions import RailUnavailable as RailUnavailableError
from payments.models import (
    FailureReason,
    Payee,
    PaymentEvent,
    PaymentStatus,
    Payout,
    PayoutState,
    Rail,
    RecurringStatus,
    ScheduledPayment,
)
from rails.base import Declined, NotFound, Paid
from rails.registry import get_rail

PENDING_STATUSES = (PaymentStatus.SCHEDULED, PaymentStatus.EXECUTING, PaymentStatus.NEEDS_REVIEW)


def payee_visible_to(*, user) -> QuerySet[Payee]:
    qs = Payee.objects.filter(deleted_at__isnull=True)
    return qs if staff_may_view(user, Payee) else qs.filter(owner=user)


def payee_get(*, user, payee_id: str) -> Payee:
    payee = payee_visible_to(user=user).filter(pk=payee_id).first()
    if payee is None:
        raise PayeeNotFound()
    return payee


def payee_create(*, owner, name: str, rail: str, destination: str) -> Payee:
    """A payee of ``owner`` on ``rail`` (the serializer has checked the shapes)."""
    if rail not in Rail.values:
        raise PaymentValidationError({"rail": [f"Must be one of: {', '.join(Rail.values)}."]})
    return Payee.objects.create(owner=owner, name=name, rail=rail, destination=destination)


class StatementTimestamp(Func):
    """The database clock when the statement started (``now()`` is the transaction's)."""

    function = "statement_timestamp"
    output_field = models.DateTimeField()


def payee_delete(*, user, payee_id: str) -> Payee:
    """Hide the caller's payee (the payouts made to it keep pointing at it). Refused while
    payouts to it are pending or an active or paused series pays it. Deleting twice
    answers 404 the second time, as for any payee one cannot see; a payee the caller may
    read but does not own (staff with ``payments.view_payee``) is 403.

    The row is locked FOR UPDATE before counting: a payout or series being created to
    it holds a share lock (``payee_lock``) until it commits, so the count sees it, or the
    creation, waiting for this lock, finds the payee deleted. ``deleted_at`` is the time
    of the update, after the count: a payout that finished before it was counted has an
    earlier ``executed_at`` (reconciliation's payout_to_deleted_payee relies on it)."""
    with transaction.atomic():
        payee = Payee.objects.select_for_update().filter(pk=payee_id, owner=user, deleted_at__isnull=True).first()
        if payee is None:
            if payee_visible_to(user=user).filter(pk=payee_id).exists():
                raise PayeeDeleteForbidden()
            raise PayeeNotFound()
        pending = ScheduledPayment.objects.filter(to_payee=payee, status__in=PENDING_STATUSES).count()
        pending += payee.series.filter(status__in=[RecurringStatus.ACTIVE, RecurringStatus.PAUSED]).count()
        if pending:
            raise PayeeInUse(pending)
        Payee.objects.filter(pk=payee.pk).update(deleted_at=StatementTimestamp())
    payee.refresh_from_db()
    return payee


def payout_resolve_failed(*, payout: Payout, actor, reason: str) -> bool:
    """Resolve as failed a parked payout whose funds are reserved: ask its rail first
    (no transaction held). Nothing at the rail (or declined there): void the reserve
    (money back to the payer) and FAILED(resolved_by_staff), in one transaction. Paid at
    the rail: ``PayoutPaidAtRail`` (re-drive it: the next attempt finds it paid and
    records it EXECUTED). No answer: ``RailUnavailable``. Returns True when this call
    resolved it; False when it was no longer parked with a reserve (the caller then
    answers from the payment as it is)."""
    payment_id = payout.payment_id
    found = get_rail(payout.rail).lookup(key=payment_id)
    if isinstance(found, Paid):
        raise PayoutPaidAtRail(found.reference)
    if not isinstance(found, (NotFound, Declined)):
        raise RailUnavailableError()
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(sql.RESOLVE_FAILED, {"id": payment_id})
        row = cur.fetchone()
        if row is None:
            return False
        ledger_resolve_pending(keys=[payment_id], post=False)
        Payout.objects.filter(pk=payment_id, state=PayoutState.PENDING).update(
            state=PayoutState.VOIDED, updated_at=Now(),
            decline_code=found.code if isinstance(found, Declined) else "",
        )
        PaymentEvent.objects.create(
            payment_id=payment_id, kind=PaymentEvent.Kind.FAILED, from_status=PaymentStatus.NEEDS_REVIEW,
            to_status=PaymentStatus.FAILED, attempt=row[0], actor=f"user:{actor.pk}", actor_user=actor,
            data={"outcome": "resolved", "failure_reason": FailureReason.RESOLVED_BY_STAFF.value,
                  "review_reason": row[1], "reason": reason, "rail": "declined" if isinstance(found, Declined)
                  else "not_found"},
        )
    return True
