"""What a worker does with a batch (payments/worker.py): a poison payment is bisected out
and retried with a backoff until its attempts are exhausted; the healthy ones go on."""

import pytest

from ledger.models import Transfer
from payments import execution, worker
from payments.models import ExecutionAttempt, PaymentStatus
from tests.factories import claimed, due_payment, expire_lease, funded_account


@pytest.mark.django_db
def test_poison_payment_does_not_hold_its_batch_hostage(monkeypatch):
    a, b = funded_account(balance=100), funded_account()
    healthy = [due_payment(source=a, target=b, amount=1) for _ in range(6)]
    poison = due_payment(source=a, target=b, amount=1)
    real = execution.ledger_post_batch

    def flaky(*, postings):
        if any(p.key == poison.id for p in postings):
            raise ValueError("corrupt row")
        return real(postings=postings)

    monkeypatch.setattr(execution, "ledger_post_batch", flaky)
    pairs = claimed(*healthy, poison)
    result = worker.apply_with_isolation(pairs)
    assert sorted(result.executed) == sorted(p.id for p in healthy)
    poison.refresh_from_db()
    assert poison.status == PaymentStatus.EXECUTING  # left for the next claim, with a short backoff
    attempt = ExecutionAttempt.objects.get(payment=poison, attempt=1)
    assert attempt.outcome == "error" and "corrupt row" in attempt.error


@pytest.mark.django_db
def test_poison_payment_ends_attempts_exhausted(monkeypatch, settings):
    settings.DELAYPAY_MAX_ATTEMPTS = 3
    a, b = funded_account(balance=100), funded_account()
    poison = due_payment(source=a, target=b, amount=1)

    def broken(*, postings):
        raise ValueError("always broken")

    monkeypatch.setattr(execution, "ledger_post_batch", broken)
    for attempt in range(1, 4):
        expire_lease(poison)
        (pair,) = claimed(poison)
        assert pair == (poison.id, attempt)
        worker.apply_with_isolation([pair])
    poison.refresh_from_db()
    assert (poison.status, poison.failure_reason) == (PaymentStatus.FAILED, "attempts_exhausted")
    errors = ExecutionAttempt.objects.filter(payment=poison).values_list("outcome", flat=True)
    assert list(errors) == ["error", "error", "error"]
    assert not Transfer.objects.filter(key=poison.id).exists()
