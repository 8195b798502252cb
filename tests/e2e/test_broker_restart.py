"""Redis restarted three times under the running stack: no process exits, payments go on.

Each restart happens while a worker is in the middle of a batch, so that the batch's
message is delivered and not yet acknowledged (acks_late): the case in which Celery 5.7
workers exited with "AttributeError: 'NoneType' object has no attribute 'hostname'"
(see ``_survive_broker_restarts`` in delaypay/celery.py). The test makes that case
certain instead of likely: it holds a row lock the batch needs, so the batch is still
running when Redis goes, and it keeps Redis down until the worker and the promoter have
both dropped their old connection and started reconnecting.

Twice (in full-suite runs under load) one of them had not after 90 s: its event loop was
held by Celery's heartbeat, which publishes with retry=True and no policy, so that kombu
retried the dead connection for ever from the loop's own timer, and the consumer never
read the broken socket (the stacks: Heart._send -> retry_over_time). The worker and the
promoter now send heartbeats without retry (``_heartbeats_never_block_the_event_loop`` in
delaypay/celery.py; tests/ops/test_broker_guard.py shows the block and its end).
"""

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
            private_redis.crash()
            wait_until(
                lambda before=before: reconnecting(stack, pids, before),
                timeout=90,
                stack=stack,
                what=f"both consumers to see Redis gone ({restart})",
            )
            private_redis.start()  # returns once Redis answers PING
            blocker.rollback()

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
