"""Reconciliation of the outbox: a terminal payment has at most one event, of its type, and
has it when its owner's endpoint was subscribed to that type before it finished."""

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.functions import Now

from payments.execution import execute_batch
from payments.reconciliation import reconcile
from payments.services import payment_cancel
from tests.factories import claimed, due_payment, funded_account, future_payment, webhook_endpoint
from webhooks import events
from webhooks.models import Endpoint, Event

pytestmark = pytest.mark.django_db

@pytest.fixture
def finished():
    a, b = funded_account(balance=100), funded_account()
    webhook_endpoint(a.owner)
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


def subscribed_since(minutes: float, **changes) -> None:
    """The payer's endpoint unchanged since ``minutes`` before the payments finished (a test's
    transaction has one now(): the payments' updated_at)."""
    Endpoint.objects.update(updated_at=Now() - timedelta(minutes=minutes), **changes)


def test_a_missing_event_is_reported(finished):
    subscribed_since(2)
    Event.objects.filter(payment_id=finished["executed"].id).delete()
    check = webhook_check()
    assert check.violations == 1
    assert check.samples == [f"{finished['executed'].id} EXECUTED: no event"]


@pytest.mark.parametrize("changes", [
    {"minutes": 0.5},  # changed within the minute before: its transaction may have committed after
    {"minutes": 2, "enabled": False},
    {"minutes": 2, "events": [events.PAYMENT_CANCELLED]},  # not the missing event's type
])
def test_no_event_is_owed_without_a_subscription_older_than_the_payment(finished, changes):
    subscribed_since(**changes)
    Event.objects.filter(payment_id=finished["executed"].id).delete()
    assert webhook_check().ok


def test_no_event_is_owed_to_an_owner_without_an_endpoint(finished):
    Endpoint.objects.all().delete()
    Event.objects.filter(payment_id=finished["executed"].id).delete()
    assert webhook_check().ok


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
    from payments import sql_reconcile

    with connection.cursor() as cur:
        cur.execute("EXPLAIN " + sql_reconcile.RECONCILE_WEBHOOK_EVENTS, {"limit": 10})
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert "Nested Loop" not in plan and "SubPlan" not in plan
