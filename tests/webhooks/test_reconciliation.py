"""Reconciliation of the outbox: every terminal payment has exactly one event of its type."""

import pytest
from django.db import connection

from payments.execution import execute_batch
from payments.reconciliation import reconcile
from payments.services import payment_cancel
from tests.factories import claimed, due_payment, funded_account, future_payment
from webhooks.models import Event

pytestmark = pytest.mark.django_db

@pytest.fixture
def finished():
    a, b = funded_account(balance=100), funded_account()
    executed = due_payment(source=a, target=b, amount=10)
    failed = due_payment(source=a, target=b, amount=1000)
    execute_batch(pairs=claimed(executed, failed))
    cancelled = future_payment(source=a, target=b)
    payment_cancel(payment_id=cancelled.id, actor=a.owner)
    pending = future_payment(source=a, target=b)
    return {"executed": executed, "failed": failed, "cancelled": cancelled, "pending": pending}


def webhook_check(**kwargs):
    return reconcile(**kwargs).get("webhook_events")


def test_every_terminal_payment_has_its_event(finished):
    assert webhook_check().ok


def test_a_missing_event_is_reported(finished):
    Event.objects.filter(payment_id=finished["executed"].id).delete()
    check = webhook_check()
    assert check.violations == 1
    assert check.samples == [f"{finished['executed'].id} EXECUTED: no event"]


def test_a_duplicate_or_wrong_event_is_reported(finished):
    original = Event.objects.get(payment_id=finished["failed"].id)
    Event.objects.create(
        type="payment.failed", owner_id=original.owner_id, payment_id=original.payment_id,
        version=original.version, snapshot=original.snapshot,
    )  # fmt: skip
    Event.objects.filter(payment_id=finished["cancelled"].id).update(type="payment.executed")
    Event.objects.create(
        type="payment.executed", owner_id=original.owner_id, payment_id=finished["pending"].id, version=1, snapshot={}
    )
    check = webhook_check()
    assert check.violations == 3
    assert f"{finished['failed'].id} FAILED: payment.failed,payment.failed" in check.samples
    assert f"{finished['cancelled'].id} CANCELLED: payment.executed" in check.samples
    assert f"{finished['pending'].id} SCHEDULED: payment.executed" in check.samples


def test_the_check_is_one_pass_over_each_table(finished):
    """Set-based like its neighbours: hash joins, no nested loop per payment."""
    from payments import sql

    with connection.cursor() as cur:
        cur.execute("EXPLAIN " + sql.RECONCILE_WEBHOOK_EVENTS, {"limit": 10})
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert "Nested Loop" not in plan and "SubPlan" not in plan
