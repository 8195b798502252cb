import pytest

from ledger.models import Account, Transfer
from ledger.services import account_set_status, ledger_transfer
from payments import execution
from payments.execution import execute_batch
from payments.models import ExecutionAttempt, PaymentEvent, PaymentStatus
from tests.factories import claimed, due_payment, expire_lease, funded_account


def refresh(*objs):
    for obj in objs:
        obj.refresh_from_db()


@pytest.mark.django_db
def test_execute_moves_money_and_records_attempt_and_event():
    a, b = funded_account(balance=100), funded_account()
    payment = due_payment(source=a, target=b, amount=40)
    result = execute_batch(pairs=claimed(payment), worker="w1")
    assert result.executed == [payment.id]
    refresh(a, b, payment)
    assert (a.balance, b.balance) == (60, 40)
    assert payment.status == PaymentStatus.EXECUTED
    assert payment.lease_until is None
    transfer = Transfer.objects.get(key=payment.id)
    assert payment.executed_at == transfer.created_at
    attempt = ExecutionAttempt.objects.get(payment=payment)
    assert (attempt.attempt, attempt.outcome, attempt.worker) == (1, "executed", "w1")
    # Two events: a first claim writes none (decision record 0010).
    assert list(PaymentEvent.objects.filter(payment=payment).values_list("kind", flat=True)) == [
        "created",
        "executed",
    ]


@pytest.mark.django_db
def test_underfunded_payment_fails_and_moves_nothing():
    a, b = funded_account(balance=10), funded_account()
    payment = due_payment(source=a, target=b, amount=11)
    result = execute_batch(pairs=claimed(payment))
    assert result.failed == {payment.id: "insufficient_funds"}
    refresh(a, b, payment)
    assert (a.balance, b.balance) == (10, 0)
    assert (payment.status, payment.failure_reason) == (PaymentStatus.FAILED, "insufficient_funds")
    assert not Transfer.objects.filter(key=payment.id).exists()


@pytest.mark.django_db
def test_frozen_payer_fails_with_account_frozen():
    a, b = funded_account(balance=10), funded_account()
    payment = due_payment(source=a, target=b, amount=1)
    account_set_status(account_id=a.id, status=Account.Status.FROZEN)
    assert execute_batch(pairs=claimed(payment)).failed == {payment.id: "account_frozen"}


@pytest.mark.django_db
def test_due_order_decides_who_gets_the_money():
    a, b = funded_account(balance=100), funded_account()
    first = due_payment(source=a, target=b, amount=80, seconds_ago=10)
    second = due_payment(source=a, target=b, amount=80, seconds_ago=5)
    pairs = claimed(first, second)
    result = execute_batch(pairs=list(reversed(pairs)))
    assert result.executed == [first.id]
    assert result.failed == {second.id: "insufficient_funds"}


@pytest.mark.django_db
def test_duplicate_delivery_moves_money_once():
    a, b = funded_account(balance=100), funded_account()
    payment = due_payment(source=a, target=b, amount=30)
    pairs = claimed(payment)
    assert execute_batch(pairs=pairs).executed == [payment.id]
    again = execute_batch(pairs=pairs)
    assert again.stale == pairs
    assert again.executed == [] and again.already_applied == []
    refresh(a)
    assert a.balance == 70
    assert Transfer.objects.filter(key=payment.id).count() == 1
    # The duplicate left no second attempt row: (payment, attempt) is unique.
    assert ExecutionAttempt.objects.filter(payment=payment).count() == 1


@pytest.mark.django_db
def test_crash_after_apply_converges_to_executed_without_rechecking_funds():
    a, b = funded_account(balance=50), funded_account()
    payment = due_payment(source=a, target=b, amount=50)
    claimed(payment)
    # The first worker moved the money and died before its status CAS.
    ledger_transfer(key=payment.id, debit_account_id=a.id, credit_account_id=b.id, amount=50)
    expire_lease(payment)
    (pair,) = claimed(payment)  # re-claimed after the lease expired: attempt 2
    assert pair == (payment.id, 2)
    result = execute_batch(pairs=[pair])
    assert result.already_applied == [payment.id]
    refresh(a, payment)
    assert a.balance == 0  # moved once, and not turned into insufficient_funds
    assert payment.status == PaymentStatus.EXECUTED
    assert ExecutionAttempt.objects.get(payment=payment, attempt=2).outcome == "already_applied"


@pytest.mark.django_db
def test_claims_no_worker_started_cost_nothing(settings):
    settings.DELAYPAY_MAX_ATTEMPTS = 2
    a, b = funded_account(balance=100), funded_account()
    payment = due_payment(source=a, target=b, amount=1)
    for _ in range(5):  # the workers are down: every lease just expires
        expire_lease(payment)
        (pair,) = claimed(payment)
    assert pair == (payment.id, 5)
    assert execute_batch(pairs=[pair]).executed == [payment.id]


@pytest.mark.django_db
def test_payment_started_past_its_budget_is_parked_and_moves_nothing(settings):
    settings.DELAYPAY_MAX_ATTEMPTS = 2
    a, b = funded_account(balance=100), funded_account()
    payment = due_payment(source=a, target=b, amount=1)
    for _ in range(3):  # a worker starts it, then dies: each start is one try
        expire_lease(payment)
        (pair,) = claimed(payment)
        execution.mark_started([pair])
    assert execute_batch(pairs=[pair]).parked == {payment.id: "attempts_exhausted"}
    refresh(a, payment)
    assert (payment.status, payment.review_reason, payment.tries) == (
        PaymentStatus.NEEDS_REVIEW, "attempts_exhausted", 3,
    )
    assert a.balance == 100 and not Transfer.objects.filter(key=payment.id).exists()
    assert ExecutionAttempt.objects.get(payment=payment, attempt=pair[1]).outcome == "parked"
    assert PaymentEvent.objects.filter(payment=payment).last().kind == "parked"


@pytest.mark.django_db
def test_a_redelivered_message_is_not_another_try():
    a, b = funded_account(balance=100), funded_account()
    payment = due_payment(source=a, target=b, amount=1)
    (pair,) = claimed(payment)
    assert execution.mark_started([pair]) == 1
    assert execution.mark_started([pair]) == 0  # the same claim started again (redelivery, task retry)
    assert execute_batch(pairs=[pair]).executed == [payment.id]
    payment.refresh_from_db()
    assert (payment.tries, payment.tried_attempt) == (1, 1)  # counted when the attempt ended
