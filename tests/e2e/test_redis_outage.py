"""Redis down on the real stack: payments falling due still execute, from the database.

The choice (docs/explanation/architecture.md, "While Redis is down"): with no beat tick
for DELAYPAY_FALLBACK_AFTER_SECONDS and no answer from Redis, the promoter ticks on its
own timer and executes what it claims in-process (degraded mode, payments/fallback.py),
one promoter at a time by a PostgreSQL advisory lock. When a beat tick reaches it again,
normal dispatch through the workers resumes. Nothing runs twice.
Each test runs its own redis-server so it can kill it without touching the shared one.
"""

import socket

import pytest

from devtools.processes import Stack
from ledger.models import Transfer
from payments.models import ExecutionAttempt, PaymentStatus, ScheduledPayment
from payments.reconciliation import reconcile
from tests.concurrency import wait_until
from tests.factories import due_payment, funded_account

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

LEASE = 5.0
FALLBACK_AFTER = 2.0


@pytest.fixture
def stack(private_redis, tmp_path):
    stack = Stack(tmp_path, env={
        "REDIS_URL": private_redis.url,
        "DELAYPAY_LEASE_SECONDS": str(LEASE),
        "DELAYPAY_FALLBACK_AFTER_SECONDS": str(FALLBACK_AFTER),
    })
    try:
        yield stack
    finally:
        stack.stop()


def all_executed(payments) -> bool:
    ids = [p.id for p in payments]
    return ScheduledPayment.objects.filter(pk__in=ids, status=PaymentStatus.EXECUTED).count() == len(ids)


def executors(payments) -> set[str]:
    """Who executed these payments (the attempt rows' worker column)."""
    rows = ExecutionAttempt.objects.filter(payment__in=payments, outcome="executed")
    return set(rows.values_list("worker", flat=True))


def in_process_name(stack: Stack, name: str) -> str:
    """The worker column of a batch the promoter ``name`` executed in-process."""
    return f"promoter:{socket.gethostname()}:{stack.procs[name].pid}"


def assert_executed_once_each(payments) -> None:
    for payment in payments:
        assert Transfer.objects.filter(key=payment.id).count() == 1
        assert ExecutionAttempt.objects.filter(payment=payment, outcome="executed").count() == 1


def test_due_payments_execute_from_the_database_while_redis_is_down_and_dispatch_resumes_after(
    stack, private_redis, client, settings
):
    a, b = funded_account(balance=1000), funded_account()
    stack.start_all()
    stack.wait_ready(["worker1", "promoter"])
    before = due_payment(source=a, target=b, amount=1)
    wait_until(lambda: all_executed([before]), timeout=90, stack=stack, what="the stack to execute a payment")

    private_redis.crash()
    # Due already, and falling due over the next seconds, all while Redis is down.
    during = [due_payment(source=a, target=b, amount=10, seconds_ago=-offset) for offset in (0, 1, 2, 3, 4)]
    wait_until(lambda: all_executed(during), timeout=60, stack=stack, what="degraded mode to execute them")
    assert not private_redis.running  # executed during the outage, not after it
    assert_executed_once_each(during)
    assert executors(during) == {in_process_name(stack, "promoter")}
    for payment in ScheduledPayment.objects.filter(pk__in=[p.id for p in during]):
        # Within seconds of being due: the fallback waits FALLBACK_AFTER for a tick, then ticks every second.
        assert (payment.executed_at - payment.execute_at).total_seconds() < 20, payment.id

    # The API stays in service: /readyz is 200 "degraded", the promoter check is green.
    settings.REDIS_URL = private_redis.url
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "degraded"
    assert (body["checks"]["redis"]["ok"], body["checks"]["redis"]["degraded"]) == (False, True)
    assert body["checks"]["promoter"]["ok"] is True

    # Redis comes back empty. Once a beat tick reaches the promoter again, degraded mode
    # ends and payments go through the workers, as before the outage.
    private_redis.start()
    wait_until(lambda: "degraded mode ends" in stack.log("promoter"), timeout=90, stack=stack,
               what="a beat tick to end degraded mode")
    after = due_payment(source=a, target=b, amount=1, seconds_ago=-1)
    wait_until(lambda: all_executed([after]), timeout=90, stack=stack, what="normal dispatch after the outage")
    (worker,) = executors([after])
    assert not worker.startswith("promoter:"), worker
    assert_executed_once_each([before, *during, after])
    for name in ("worker1", "promoter", "beat"):
        assert stack.procs[name].poll() is None, f"{name} exited:\n{stack.log(name)[-3000:]}"
    a.refresh_from_db()
    assert a.balance == 1000 - 1 - 50 - 1
    assert reconcile().ok


def test_two_promoters_one_executes_at_a_time_and_the_other_takes_over_when_it_dies(stack, private_redis):
    a, b = funded_account(balance=1000), funded_account()
    stack.start_worker("worker1")
    for name in ("promoter1", "promoter2"):
        stack.start_promoter(name)
    stack.start_beat()
    stack.wait_ready(["worker1", "promoter1", "promoter2"])
    before = due_payment(source=a, target=b, amount=1)
    wait_until(lambda: all_executed([before]), timeout=90, stack=stack, what="the stack to execute a payment")

    private_redis.crash()
    first = [due_payment(source=a, target=b, amount=10, seconds_ago=-offset) for offset in (0, 1, 2, 3, 4)]
    wait_until(lambda: all_executed(first), timeout=60, stack=stack, what="degraded mode to execute them")
    (holder_worker,) = executors(first)  # one promoter executed them all: the lock's holder
    names = {in_process_name(stack, name): name for name in ("promoter1", "promoter2")}
    holder = names[holder_worker]
    other = "promoter2" if holder == "promoter1" else "promoter1"

    # The holder dies; PostgreSQL frees its lock with its session; the other takes over.
    stack.kill(holder)
    second = [due_payment(source=a, target=b, amount=10, seconds_ago=-offset) for offset in (0, 1, 2)]
    wait_until(lambda: all_executed(second), timeout=60, stack=stack, what="the other promoter to take over")
    assert not private_redis.running
    assert executors(second) == {in_process_name(stack, other)}
    assert_executed_once_each([before, *first, *second])
    a.refresh_from_db()
    assert a.balance == 1000 - 1 - 80
    assert reconcile().ok
