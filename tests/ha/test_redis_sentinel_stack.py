"""The product behind Redis Sentinel: worker, promoter and beat configured with the
sentinels' URL and the master's name (DELAYPAY_REDIS_SENTINEL_MASTER) execute a burst of
payments while the Redis master is killed in the middle of it.

What must hold: every payment of the burst executes exactly once (one ledger transfer, one
executed attempt, the books reconcile); no process exits or is restarted (the same pids
from start to end); payments due after the failover execute through the workers, which
means beat, the promoter and the workers all found the promoted replica by asking the
sentinels. The test prints how long the failover took as the product saw it.
"""

import datetime
import signal

import pytest
from django.utils import timezone

from common import broker
from devtools import ha
from devtools.processes import Stack
from ledger.models import Transfer
from payments.models import ExecutionAttempt, PaymentStatus, ScheduledPayment
from payments.reconciliation import reconcile
from tests.concurrency import assert_still_running, wait_until
from tests.factories import due_payment, funded_account

pytestmark = [pytest.mark.ha, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

BURST = 300  # payments, falling due evenly over BURST_SECONDS
BURST_SECONDS = 10.0
KILL_AFTER = 4.0  # seconds into the burst
PAYERS = 6
AFTER = 10  # payments due after the failover, one a second
FAILOVER_BUDGET = 30.0
REDIS_BASE_PORT = 56800  # the module's Redis set (conftest.py, redis_set)
# A claim whose publish failed on the dead master waits for its lease (or is executed by the
# promoter at once, payments/promoter.py): short, so that the test does not wait a minute.
LEASE = 10.0


@pytest.fixture
def stack(redis_set, tmp_path):
    redis_set.heal()
    stack = Stack(tmp_path, env={
        "REDIS_URL": redis_set.url,
        "DELAYPAY_REDIS_SENTINEL_MASTER": ha.MASTER_NAME,
        "DELAYPAY_LEASE_SECONDS": str(LEASE),
    })
    try:
        yield stack
    finally:
        stack.stop()


def payment_due_at(when: datetime.datetime, *, source, target):
    return due_payment(source=source, target=target, amount=1, seconds_ago=(timezone.now() - when).total_seconds())


def executed(payments) -> int:
    return ScheduledPayment.objects.filter(pk__in=[p.pk for p in payments], status=PaymentStatus.EXECUTED).count()


def seconds(later: datetime.datetime, earlier: datetime.datetime) -> float:
    return (later - earlier).total_seconds()


def test_a_burst_of_payments_survives_the_death_of_the_redis_master(stack, redis_set, settings):
    payers = [funded_account(balance=1000) for _ in range(PAYERS)]
    payee = funded_account()
    stack.start_all(workers=1, concurrency=2)
    stack.wait_ready(list(stack.procs))
    pids = {name: proc.pid for name, proc in stack.procs.items()}
    first = due_payment(source=payers[0], target=payee, amount=1)
    wait_until(lambda: executed([first]) == 1, timeout=90, stack=stack, what="the stack to execute a payment")

    # The product's own probe finds the master through the sentinels.
    settings.REDIS_URL = redis_set.url
    settings.DELAYPAY_REDIS_SENTINEL_MASTER = ha.MASTER_NAME
    assert broker.broker_answers()
    old_master = ha.current_master(redis_set.layout)

    start = timezone.now() + datetime.timedelta(seconds=2)
    burst = [
        payment_due_at(start + datetime.timedelta(seconds=BURST_SECONDS * i / BURST),
                       source=payers[i % PAYERS], target=payee)
        for i in range(BURST)
    ]
    wait_until(lambda: timezone.now() >= start + datetime.timedelta(seconds=KILL_AFTER), timeout=60,
               what="the middle of the burst")
    done_before_kill = executed(burst)
    killed = ha.kill_redis_master(redis_set.directory, signal.SIGKILL)
    killed_at = timezone.now()

    wait_until(lambda: ha.current_master(redis_set.layout) not in (None, old_master), timeout=FAILOVER_BUDGET,
               stack=stack, what="the sentinels to promote the replica")
    promoted_at = timezone.now()
    assert broker.broker_answers()  # the probe follows the promotion too

    # Due after the promotion: claimed on beat ticks and executed by the worker, through the new master.
    after = [payment_due_at(promoted_at + datetime.timedelta(seconds=1 + i), source=payers[i % PAYERS], target=payee)
             for i in range(AFTER)]
    wait_until(lambda: executed(burst + after) == BURST + AFTER, timeout=120, stack=stack,
               what="every payment of the burst and after it to execute")
    assert_still_running(stack, pids)

    everything = [first, *burst, *after]
    ids = [p.pk for p in everything]
    assert Transfer.objects.filter(key__in=ids).count() == len(everything)
    attempts = ExecutionAttempt.objects.filter(payment__in=ids, outcome="executed")
    assert attempts.count() == len(everything)  # one executed attempt each: nothing ran twice
    by_worker = dict(attempts.values_list("payment_id", "worker"))
    # The last ones, due well after the promotion, went through Redis to the worker again.
    assert not by_worker[after[-1].pk].startswith("promoter:"), by_worker[after[-1].pk]
    for payer in payers:
        payer.refresh_from_db()
    assert sum(payer.balance for payer in payers) == PAYERS * 1000 - len(everything)
    assert reconcile().ok

    rows = ScheduledPayment.objects.filter(pk__in=ids).values("id", "execute_at", "claimed_at", "executed_at")
    rows = {row["id"]: row for row in rows}
    in_promoter = {pk for pk, worker in by_worker.items() if worker.startswith("promoter:")}
    claimed_after_kill = sorted((rows[p.pk] for p in burst + after if rows[p.pk]["claimed_at"] > killed_at),
                                key=lambda row: row["executed_at"])
    first_any = seconds(claimed_after_kill[0]["executed_at"], killed_at)
    first_worker = seconds(next(r for r in claimed_after_kill if r["id"] not in in_promoter)["executed_at"], killed_at)
    late = max(seconds(rows[p.pk]["executed_at"], rows[p.pk]["execute_at"]) for p in burst)
    degraded = "on" if "degraded mode:" in stack.log("promoter") else "off"
    print(
        f"\nkill -9 of the Redis master ({killed}) {KILL_AFTER:.0f} s into {BURST} payments due over "
        f"{BURST_SECONDS:.0f} s, {done_before_kill} executed before it:"
        f"\n  replica promoted (the sentinels name it) {seconds(promoted_at, killed_at):.1f} s after the kill;"
        f"\n  first payment claimed after the kill executed {first_any:.1f} s after it, first by a worker"
        f" {first_worker:.1f} s after it ({len(in_promoter & {r['id'] for r in claimed_after_kill})} executed"
        f" in the promoter; degraded mode {degraded});"
        f"\n  the latest of the burst executed {late:.1f} s after its due time; {len(everything)} payments, once each"
    )

    # The old master comes back as a replica of the new one; the stack goes on.
    redis_set.heal()
    last = due_payment(source=payers[0], target=payee, amount=1, seconds_ago=-1)
    wait_until(lambda: executed([last]) == 1, timeout=60, stack=stack, what="a payment after the old master's return")
    assert_still_running(stack, pids)
