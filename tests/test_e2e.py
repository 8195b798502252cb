"""End to end on the real stack: `celery worker`, the promoter worker and `celery beat`
as subprocesses, Redis as the broker, PostgreSQL as the schedule."""

import time
from datetime import timedelta

import pytest
from django.db.models import Sum
from django.utils import timezone

from ledger.models import Account, Transfer
from payments.models import PaymentStatus, ScheduledPayment
from payments.promoter import claim_due, messages_for
from payments.services import payment_cancel, payment_schedule
from payments.tasks import execute_batch, publish_messages
from tests.factories import expire_lease, funded_account

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def wait_until(predicate, *, timeout: float, stack=None, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    logs = "".join(f"\n--- {name}.log ---\n{stack.log(name)[-4000:]}" for name in stack.procs) if stack else ""
    pytest.fail(f"timed out after {timeout}s waiting for {what}{logs}")


def schedule(source, target, amount, seconds):
    return payment_schedule(
        payer=source.owner,
        from_account_id=source.id,
        to_account_id=target.id,
        amount=amount,
        execute_at=timezone.now() + timedelta(seconds=seconds),
    )


def statuses(*payments):
    return {p.id: p.status for p in ScheduledPayment.objects.filter(pk__in=[p.id for p in payments])}


def test_due_payments_execute_fail_or_stay_cancelled(celery_stack):
    alice, bob, carol = funded_account(balance=1000), funded_account(), funded_account(balance=5)
    celery_stack.start_all()
    ok = schedule(alice, bob, 300, 2)
    underfunded = schedule(carol, bob, 50, 2)
    cancelled = schedule(alice, bob, 100, 2)
    payment_cancel(payment_id=cancelled.id, actor=alice.owner)

    wait_until(
        lambda: set(statuses(ok, underfunded).values()) <= {PaymentStatus.EXECUTED, PaymentStatus.FAILED},
        timeout=60, stack=celery_stack, what="both due payments to finish",
    )
    time.sleep(2)  # give a wrongly-claimed cancelled payment time to show itself
    for p in (ok, underfunded, cancelled, alice, bob, carol):
        p.refresh_from_db()
    assert ok.status == PaymentStatus.EXECUTED
    assert ok.executed_at >= ok.execute_at
    assert (underfunded.status, underfunded.failure_reason) == (PaymentStatus.FAILED, "insufficient_funds")
    assert cancelled.status == PaymentStatus.CANCELLED
    assert (alice.balance, bob.balance, carol.balance) == (700, 300, 5)
    assert not Transfer.objects.filter(key__in=[underfunded.id, cancelled.id]).exists()
    assert Account.objects.aggregate(total=Sum("balance"))["total"] == 0


def test_duplicate_and_stale_messages_through_the_broker_move_money_once(celery_stack):
    alice, bob = funded_account(balance=100), funded_account()
    payment = schedule(alice, bob, 60, 0.5)
    time.sleep(0.6)
    claim = claim_due(batch=10, lease_seconds=60)
    assert claim.fresh == [(payment.id, 1)]
    expire_lease(payment)
    reclaim = claim_due(batch=10, lease_seconds=60)
    assert reclaim.reclaimed == [(payment.id, 2)]

    celery_stack.start_worker()
    # The current attempt twice, and the superseded attempt once.
    publish_messages(messages_for(reclaim) * 2)
    execute_batch.apply_async(args=[[[payment.id, 1]]])

    wait_until(
        lambda: ScheduledPayment.objects.get(pk=payment.id).status == PaymentStatus.EXECUTED,
        timeout=60, stack=celery_stack, what="the payment to execute",
    )
    wait_until(
        lambda: payment.attempts.filter(attempt=1, outcome="stale").exists(),
        timeout=30, stack=celery_stack, what="the stale attempt to be recorded",
    )
    alice.refresh_from_db()
    assert alice.balance == 40
    assert Transfer.objects.filter(key=payment.id).count() == 1
    assert list(payment.attempts.order_by("attempt").values_list("attempt", "outcome")) == [
        (1, "stale"),
        (2, "executed"),
    ]
