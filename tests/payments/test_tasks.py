"""The Celery tasks are thin (payments/tasks.py): called as functions here, each runs
one service and answers a summary; the execute task retries transient database errors
and, past its retry budget, gives the batch back to lease expiry."""

import pytest
from django.db import OperationalError

from payments import tasks
from payments.models import PaymentStatus, ScheduledPayment
from tests.factories import claimed, due_payment, funded_account

pytestmark = pytest.mark.django_db


def test_execute_batch_task_answers_what_happened():
    a, b = funded_account(balance=10), funded_account()
    paid, unpaid = due_payment(source=a, target=b, amount=10), due_payment(source=a, target=b, amount=10)
    pairs = claimed(paid, unpaid)
    assert tasks.execute_batch([list(p) for p in pairs] + [[paid.id, 99]]) == {
        "executed": 1, "already_applied": 0, "failed": 1, "unknown": 0, "stale": 1,
    }


def test_execute_batch_task_raises_a_transient_error_for_celery_to_retry(monkeypatch):
    def connection_lost(pairs, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(tasks, "run_batch", connection_lost)
    # Called directly (no worker), Task.retry re-raises the error it was given.
    with pytest.raises(OperationalError):
        tasks.execute_batch([["pay_x", 1]])


# close_old_connections() in the task closes a connection inside a test's transaction.
@pytest.mark.django_db(transaction=True)
def test_execute_batch_task_past_its_retry_budget_leaves_the_payments_to_lease_expiry(monkeypatch, settings):
    settings.DELAYPAY_TRANSIENT_RETRIES = 0
    a, b = funded_account(balance=10), funded_account()
    payment = due_payment(source=a, target=b, amount=10)
    pairs = claimed(payment)

    def connection_lost(pairs, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(tasks, "run_batch", connection_lost)
    assert tasks.execute_batch([list(p) for p in pairs]) == {"gave_up": 1}
    payment = ScheduledPayment.objects.get(pk=payment.pk)
    assert payment.status == PaymentStatus.EXECUTING and payment.lease_until is not None


def test_promoter_tick_task_answers_what_it_claimed():
    a, b = funded_account(balance=10), funded_account()
    due_payment(source=a, target=b, amount=1)
    assert tasks.promoter_tick() == {"claimed": 1, "reclaimed": 0}
