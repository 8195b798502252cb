"""Redis restarted three times under the running stack: no process exits, payments go on.

Each restart happens while a worker is in the middle of a batch, so that the batch's
message is delivered and not yet acknowledged (acks_late): the case in which Celery 5.7
workers exited with "AttributeError: 'NoneType' object has no attribute 'hostname'"
(see ``_survive_broker_restarts`` in delaypay/celery.py). The test makes that case
certain instead of likely: it holds a row lock the batch needs, so the batch is still
running when Redis goes, and it keeps Redis down until the promoter has dropped its old
connection and started reconnecting, and the worker too, or 20 s have passed.

The worker usually sees Redis go within milliseconds, as the promoter always does. In
two full-suite runs under load (CI's, and an earlier one here) it had not after 90 s,
and this wait failed; it never happened with the test alone (27 runs, some with the CPU
kept busy, some six at once). Why is not known yet: the stacks of those runs were not
kept, and the failure message now prints the stacks before the logs. The test no longer
waits for that while the batch is blocked: after 20 s it lets the batch finish with
Redis back, and the worker, whose late ack then meets the dead connection, must
reconnect with the batch's message still unacknowledged (still the case this test is
for) before the test goes on. A worker that never reconnects still fails it.
"""

import time

import psycopg
import pytest

from devtools.processes import Stack, database_url
from payments.models import PaymentStatus, ScheduledPayment
from payments.reconciliation import reconcile
from tests.concurrency import assert_still_running, wait_for_lock_waiters, wait_until
from tests.factories import due_payment, funded_account

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

RESTARTS = 3
CONSUMERS = ("worker1", "promoter")
# Logged by a Celery consumer each time it fails to connect, after it has closed the
# connection it lost: proof that it got through the close while Redis was down.
RECONNECTING = "consumer: Cannot connect to"
# Logged by a Celery consumer each time it loses its connection, whether Redis is down
# or already back.
CONNECTION_LOST = "consumer: Connection to broker lost"
WORKER_GRACE = 20.0


@pytest.fixture
def stack(private_redis, tmp_path):
    stack = Stack(tmp_path, env={"REDIS_URL": private_redis.url})
    try:
        yield stack
    finally:
        stack.stop()


def executed(payment) -> bool:
    return ScheduledPayment.objects.get(pk=payment.pk).status == PaymentStatus.EXECUTED


def reconnecting(stack: Stack, pids: dict[str, int], before: dict[str, int]) -> bool:
    """Both consumers have closed the connection they lost and try to connect again."""
    assert_still_running(stack, pids)
    return all(stack.log(name).count(RECONNECTING) > before[name] for name in CONSUMERS)


def seen_within(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def test_worker_promoter_and_beat_survive_three_redis_restarts(stack, private_redis):
    payer, payee = funded_account(balance=1000), funded_account()
    # The in-flight batches pay from an account of their own, which the test locks.
    locked_payer, locked_payee = funded_account(balance=1000), funded_account()
    stack.start_all()
    stack.wait_ready(list(stack.procs))
    pids = {name: proc.pid for name, proc in stack.procs.items()}
    payments = [due_payment(source=payer, target=payee, amount=1)]
    wait_until(lambda: executed(payments[0]), timeout=90, stack=stack, what="the stack to execute a payment")

    for restart in range(1, RESTARTS + 1):
        with psycopg.connect(database_url()) as blocker:
            # The worker's batch locks its accounts FOR UPDATE and waits here; a payment
            # may still be inserted (its foreign key takes only FOR KEY SHARE).
            blocker.execute("SELECT id FROM ledger_account WHERE id = %s FOR NO KEY UPDATE", [locked_payer.id])
            in_flight = due_payment(source=locked_payer, target=locked_payee, amount=1)
            wait_for_lock_waiters(1, timeout=90)

            before = {name: stack.log(name).count(RECONNECTING) for name in CONSUMERS}
            lost_before = stack.log("worker1").count(CONNECTION_LOST)
            private_redis.crash()
            wait_until(
                lambda before=before: reconnecting(stack, pids, {**before, "worker1": -1}),
                timeout=90,
                stack=stack,
                what=f"the promoter to see Redis gone ({restart})",
            )
            worker_saw_it = seen_within(lambda before=before: reconnecting(stack, pids, before), WORKER_GRACE)
            private_redis.start()  # returns once Redis answers PING
            blocker.rollback()
        print(f"restart {restart}: the worker saw Redis gone {'while it was down' if worker_saw_it else 'after'}")
        wait_until(
            lambda n=lost_before: stack.log("worker1").count(CONNECTION_LOST) > n,
            timeout=90,
            stack=stack,
            what=f"the worker to reconnect ({restart})",
        )

        wait_until(lambda p=in_flight: executed(p), timeout=90, stack=stack, what=f"the in-flight batch ({restart})")
        # Due after the restart: claimed on a beat tick and executed through the new Redis.
        after = due_payment(source=payer, target=payee, amount=1, seconds_ago=-1)
        wait_until(lambda p=after: executed(p), timeout=90, stack=stack, what=f"a payment due after restart {restart}")
        assert_still_running(stack, pids)
        payments += [in_flight, after]

    assert ScheduledPayment.objects.filter(pk__in=[p.pk for p in payments], status=PaymentStatus.EXECUTED).count() == (
        1 + 2 * RESTARTS
    )
    payer.refresh_from_db()
    locked_payer.refresh_from_db()
    assert (payer.balance, locked_payer.balance) == (1000 - 1 - RESTARTS, 1000 - RESTARTS)
    assert reconcile().ok
