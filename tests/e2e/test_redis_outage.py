"""Redis down on the real stack: the promoter neither churns leases nor burns attempts.

The choice (docs/explanation/architecture.md, "While Redis is down"): without Redis,
beat cannot tick, so the promoter claims nothing and due rows stay SCHEDULED; a batch
the promoter had already claimed when publishing failed is executed by the promoter
itself, in-process, at the same attempt.
The test runs its own redis-server so it can kill it without touching the shared one.
"""

import subprocess
import sys
import time

import pytest

from devtools.processes import BASE_DIR, Stack, database_url
from devtools.sandbox import PrivateRedis, pick_port
from payments.models import ExecutionAttempt, PaymentEvent, PaymentStatus, ScheduledPayment
from payments.reconciliation import reconcile
from tests.factories import due_payment, funded_account

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

LEASE = 1.0


def wait_until(predicate, *, timeout: float, stack: Stack, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    logs = "".join(f"\n--- {name}.log ---\n{stack.log(name)[-3000:]}" for name in stack.procs)
    pytest.fail(f"timed out after {timeout}s waiting for {what}{logs}")


@pytest.fixture
def private_redis(tmp_path):
    redis = PrivateRedis(port=pick_port(56479), directory=tmp_path / "redis")
    redis.start()
    try:
        yield redis
    finally:
        redis.stop()


@pytest.fixture
def stack(private_redis, tmp_path):
    stack = Stack(tmp_path, env={"REDIS_URL": private_redis.url, "DELAYPAY_LEASE_SECONDS": str(LEASE)})
    try:
        yield stack
    finally:
        stack.stop()


def executed(payment) -> bool:
    return ScheduledPayment.objects.get(pk=payment.pk).status == PaymentStatus.EXECUTED


def test_redis_outage_leaves_due_rows_scheduled_and_a_claimed_batch_executes_in_process(stack, private_redis):
    a, b = funded_account(balance=1000), funded_account()
    stack.start_all()
    before = due_payment(source=a, target=b, amount=1)
    wait_until(lambda: executed(before), timeout=90, stack=stack, what="the stack to execute a payment")

    private_redis.crash()
    time.sleep(2 * LEASE)  # a tick that was running when Redis died has finished by now
    claims_before = PaymentEvent.objects.filter(kind__in=["claimed", "reclaimed"]).count()
    stranded = [due_payment(source=a, target=b, amount=10) for _ in range(5)]
    time.sleep(5 * LEASE)  # five leases, five ticks' worth of time: nothing may be claimed
    assert PaymentEvent.objects.filter(kind__in=["claimed", "reclaimed"]).count() == claims_before
    for payment in stranded:
        payment.refresh_from_db()
        assert (payment.status, payment.attempt) == (PaymentStatus.SCHEDULED, 0)

    # One promoter tick, run as the promoter runs it, with the real publisher and Redis
    # still down: it claims, publishing fails, and it executes the batch itself.
    tick = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c",
         "from payments.tasks import promoter_tick; print(promoter_tick())"],
        cwd=BASE_DIR, env={**stack.env, "DATABASE_URL": database_url(), "REDIS_URL": private_redis.url},
        capture_output=True, text=True, timeout=120,
    )
    assert tick.returncode == 0, tick.stderr
    assert "publish failed; executing 5 claimed payments in-process" in tick.stderr
    for payment in stranded:
        payment.refresh_from_db()
        assert (payment.status, payment.attempt) == (PaymentStatus.EXECUTED, 1)  # no attempt burnt
        (attempt,) = ExecutionAttempt.objects.filter(payment=payment)
        assert attempt.outcome == "executed" and attempt.worker.startswith("promoter:")

    # Redis comes back empty; the stack picks up where it was.
    private_redis.start()
    after = due_payment(source=a, target=b, amount=1)
    wait_until(lambda: executed(after), timeout=90, stack=stack, what="the stack to recover after Redis returned")
    a.refresh_from_db()
    assert a.balance == 1000 - 52
    assert reconcile().ok
