"""What a worker does with a batch (payments/worker.py): a poison payment is bisected out
and retried with a backoff until its attempts are exhausted; the healthy ones go on."""

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.models import Transfer
from payments import execution, worker
from payments.models import ExecutionAttempt, PaymentEvent, PaymentStatus, ScheduledPayment
from tests.factories import claimed, due_payment, funded_account


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
    assert poison.status == PaymentStatus.SCHEDULED  # back on the retry ladder
    assert poison.next_attempt_at is not None
    attempt = ExecutionAttempt.objects.get(payment=poison, attempt=1)
    assert attempt.outcome == "error" and "corrupt row" in attempt.error


@pytest.mark.django_db
def test_poison_payment_climbs_the_retry_ladder_then_is_parked(monkeypatch, settings):
    settings.DELAYPAY_MAX_ATTEMPTS = 3
    settings.DELAYPAY_RETRY_DELAYS = [60.0, 300.0]
    a, b = funded_account(balance=100), funded_account()
    poison = due_payment(source=a, target=b, amount=1)

    def broken(*, postings):
        raise ValueError("always broken")

    monkeypatch.setattr(execution, "ledger_post_batch", broken)
    for attempt in range(1, 4):
        if attempt > 1:  # its wait on the ladder is over
            ScheduledPayment.objects.filter(pk=poison.pk).update(next_attempt_at=timezone.now() - timedelta(hours=1))
        (pair,) = claimed(poison)
        assert pair == (poison.id, attempt)
        worker.run_batch([pair])
        poison.refresh_from_db()
        if attempt < 3:
            assert poison.status == PaymentStatus.SCHEDULED
            waited = (poison.next_attempt_at - poison.updated_at).total_seconds()
            assert 0 <= waited <= settings.DELAYPAY_RETRY_DELAYS[attempt - 1] + 1  # full jitter within the step
    assert (poison.status, poison.review_reason, poison.tries) == (
        PaymentStatus.NEEDS_REVIEW, "attempts_exhausted", 3,
    )
    outcomes = ExecutionAttempt.objects.filter(payment=poison).values_list("outcome", flat=True)
    assert list(outcomes) == ["error", "error", "error"]
    kinds = list(PaymentEvent.objects.filter(payment=poison).values_list("kind", flat=True))
    assert kinds == ["created", "retry_scheduled", "reclaimed", "retry_scheduled", "reclaimed", "parked"]
    assert not Transfer.objects.filter(key=poison.id).exists()
