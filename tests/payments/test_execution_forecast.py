"""The executor writes statuses, attempts and events from a forecast of the outcomes,
then lets the ledger decide under the account locks: a forecast that no longer holds
must roll everything back and end with the outcome decided under the locks."""

import threading

import pytest
from django.db import connections

from ledger.models import Transfer
from ledger.services import ledger_transfer
from payments import execution
from payments.execution import execute_batch
from payments.models import ExecutionAttempt, PaymentEvent, PaymentStatus
from payments.promoter import claim_due
from tests.factories import due_payment, funded_account


def outcome_rows(payment):
    attempts = list(ExecutionAttempt.objects.filter(payment=payment).values_list("attempt", "outcome"))
    events = PaymentEvent.objects.filter(payment=payment).exclude(kind="created")
    events = list(events.values_list("kind", flat=True))
    return attempts, events


@pytest.mark.django_db(transaction=True)
def test_balance_spent_between_forecast_and_lock_ends_failed_with_one_attempt_and_no_transfer(monkeypatch):
    payer, payee, elsewhere = funded_account(balance=100), funded_account(), funded_account()
    payment = due_payment(source=payer, target=payee, amount=80)
    pairs = claim_due(batch=10, lease_seconds=60).fresh
    real_preview = execution.ledger_preview_batch
    spent = []

    def preview_then_spend(*, postings):
        forecast = real_preview(postings=postings)  # says APPLIED: 100 >= 80
        if not spent:
            # Another transaction spends the payer's money before our account lock.
            def spend():
                try:
                    ledger_transfer(key="spend-it", debit_account_id=payer.id,
                                    credit_account_id=elsewhere.id, amount=50)
                finally:
                    connections.close_all()

            thread = threading.Thread(target=spend)
            thread.start()
            thread.join()
            spent.append(True)
        return forecast

    monkeypatch.setattr(execution, "ledger_preview_batch", preview_then_spend)
    result = execute_batch(pairs=pairs, worker="w1")

    assert result.failed == {payment.id: "insufficient_funds"}
    payment.refresh_from_db()
    payer.refresh_from_db()
    assert (payment.status, payment.failure_reason) == (PaymentStatus.FAILED, "insufficient_funds")
    assert payer.balance == 50
    assert not Transfer.objects.filter(key=payment.id).exists()
    # The rolled-back forecast left nothing behind: one attempt, one outcome event.
    assert outcome_rows(payment) == ([(1, "failed")], ["failed"])


@pytest.mark.django_db
def test_wrong_forecast_is_discarded_and_the_locked_decision_is_recorded(monkeypatch):
    payer, payee = funded_account(balance=100), funded_account()
    payment = due_payment(source=payer, target=payee, amount=30)
    pairs = claim_due(batch=10, lease_seconds=60).fresh
    real_preview = execution.ledger_preview_batch

    def pessimist(*, postings):
        forecast = real_preview(postings=postings)
        return {key: type(post)(execution.Outcome.INSUFFICIENT_FUNDS, None) for key, post in forecast.items()}

    monkeypatch.setattr(execution, "ledger_preview_batch", pessimist)
    result = execute_batch(pairs=pairs, worker="w1")

    assert result.executed == [payment.id]
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.EXECUTED
    assert Transfer.objects.get(key=payment.id).amount == 30
    assert outcome_rows(payment) == ([(1, "executed")], ["executed"])
