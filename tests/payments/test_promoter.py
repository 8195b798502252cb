import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from ledger.models import Transfer
from payments import execution
from payments.execution import execute_batch
from payments.models import ExecutionAttempt, PaymentEvent, PaymentStatus, ScheduledPayment
from payments.promoter import claim_and_publish, claim_due, messages_for
from tests.factories import due_payment, expire_lease, funded_account


def wait_for(predicate, timeout=10.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


@pytest.mark.django_db
def test_claim_takes_due_rows_oldest_first_and_leaves_future_ones():
    a, b = funded_account(), funded_account()
    newer = due_payment(source=a, target=b, amount=1, seconds_ago=1)
    older = due_payment(source=a, target=b, amount=1, seconds_ago=5)
    future = ScheduledPayment.objects.create(
        payer=a.owner, from_account=a, to_account=b, amount=1, execute_at=timezone.now() + timedelta(hours=1)
    )
    claim = claim_due(batch=10, lease_seconds=60)
    assert claim.fresh == [(older.id, 1), (newer.id, 1)]
    assert claim.reclaimed == []
    future.refresh_from_db()
    assert future.status == PaymentStatus.SCHEDULED
    older.refresh_from_db()
    assert older.status == PaymentStatus.EXECUTING
    assert older.lease_until > older.claimed_at
    # A first claim writes no event (decision record 0010): the row says it all.
    assert list(PaymentEvent.objects.filter(payment=older).values_list("kind", flat=True)) == ["created"]


@pytest.mark.django_db
def test_a_reclaim_writes_its_event_with_the_time_of_the_claim_it_supersedes():
    a, b = funded_account(), funded_account()
    payment = due_payment(source=a, target=b, amount=1)
    claim_due(batch=10, lease_seconds=60)
    first_claimed_at = ScheduledPayment.objects.get(pk=payment.pk).claimed_at
    expire_lease(payment)
    assert claim_due(batch=10, lease_seconds=60).reclaimed == [(payment.id, 2)]
    payment.refresh_from_db()  # the row keeps only the latest claim's time
    event = PaymentEvent.objects.get(payment=payment, kind="reclaimed")
    assert (event.attempt, event.from_status, event.to_status) == (2, "EXECUTING", "EXECUTING")
    assert parse_datetime(event.data["previous_claimed_at"]) == first_claimed_at
    assert event.created_at == payment.claimed_at


@pytest.mark.django_db
def test_claim_respects_batch_size():
    a, b = funded_account(), funded_account()
    for _ in range(5):
        due_payment(source=a, target=b, amount=1)
    assert len(claim_due(batch=3, lease_seconds=60)) == 3
    assert len(claim_due(batch=3, lease_seconds=60)) == 2
    assert len(claim_due(batch=3, lease_seconds=60)) == 0


@pytest.mark.django_db(transaction=True)
def test_crash_between_claim_and_publish_is_recovered_after_lease_expiry():
    a, b = funded_account(balance=100), funded_account()
    payment = due_payment(source=a, target=b, amount=30)
    # The promoter claims and then "crashes": nothing is published.
    assert claim_due(batch=10, lease_seconds=0.5).fresh == [(payment.id, 1)]
    assert len(claim_due(batch=10, lease_seconds=0.5)) == 0  # the lease is still live
    assert wait_for(lambda: len(claim := claim_due(batch=10, lease_seconds=60)) and claim.reclaimed)
    payment.refresh_from_db()
    assert (payment.status, payment.attempt) == (PaymentStatus.EXECUTING, 2)
    assert PaymentEvent.objects.filter(payment=payment, kind="reclaimed", attempt=2).exists()

    result = execute_batch(pairs=[(payment.id, 2)])
    assert result.executed == [payment.id]
    # The lost attempt's message turning up late changes nothing.
    assert execute_batch(pairs=[(payment.id, 1)]).stale == [(payment.id, 1)]
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.EXECUTED
    assert Transfer.objects.filter(key=payment.id).count() == 1
    a.refresh_from_db()
    assert a.balance == 70
    assert ExecutionAttempt.objects.get(payment=payment, attempt=1).outcome == "stale"


@pytest.mark.django_db
def test_lost_messages_travel_together_and_started_ones_alone():
    a, b = funded_account(), funded_account()
    lost1, lost2, started = (due_payment(source=a, target=b, amount=1) for _ in range(3))
    claim_due(batch=10, lease_seconds=60)
    execution.mark_started([(started.id, 1)])  # a worker took it, then died
    for payment in (lost1, lost2, started):
        expire_lease(payment)
    fresh = due_payment(source=a, target=b, amount=1)
    claim = claim_due(batch=10, lease_seconds=60)
    assert claim.fresh == [(fresh.id, 1)]
    assert claim.started == {(started.id, 2)}
    messages = messages_for(claim)
    assert messages[0] == [(fresh.id, 1)]
    assert sorted(messages[1]) == sorted([(lost1.id, 2), (lost2.id, 2)])  # one message, not one each
    assert messages[2:] == [[(started.id, 2)]]


@pytest.mark.django_db(transaction=True)
def test_tick_publishes_after_commit_and_stops_at_the_in_flight_cap():
    a, b = funded_account(), funded_account()
    for _ in range(7):
        due_payment(source=a, target=b, amount=1)
    published = []

    def publish(messages):
        # Published only after the claim committed: no transaction is open.
        assert not connection.in_atomic_block
        for message in messages:
            published.append([pid for pid, _ in message])

    result = claim_and_publish(publish=publish, execute_in_process=None, batch=3, in_flight_cap=5)
    assert result.claimed == 5
    assert result.capped
    assert [len(m) for m in published] == [3, 2]
    assert ScheduledPayment.objects.filter(status=PaymentStatus.SCHEDULED).count() == 2


@pytest.mark.django_db
def test_tick_executes_in_process_when_publishing_fails():
    a, b = funded_account(balance=10), funded_account()
    payment = due_payment(source=a, target=b, amount=4)

    def publish(messages):
        raise ConnectionError("redis is down")

    executed = []
    result = claim_and_publish(
        publish=publish,
        execute_in_process=lambda pairs: executed.append(execute_batch(pairs=pairs)),
    )
    assert result.executed_in_process == 1
    payment.refresh_from_db()
    assert (payment.status, payment.attempt) == (PaymentStatus.EXECUTED, 1)


@pytest.mark.django_db(transaction=True)
def test_expired_leases_do_not_count_against_the_in_flight_cap():
    # Redis lost every message of a full in-flight window: all those rows sit EXECUTING
    # with expired leases. They are exactly what the promoter must re-claim; counting
    # them as in flight would block the promoter forever.
    a, b = funded_account(), funded_account()
    lost = [due_payment(source=a, target=b, amount=1) for _ in range(5)]
    claim_due(batch=10, lease_seconds=60)
    for payment in lost:
        expire_lease(payment)
    published = []
    result = claim_and_publish(publish=published.extend, execute_in_process=None, batch=10, in_flight_cap=6)
    assert result.reclaimed == 5
    assert not result.capped
    assert [sorted(pid for pid, _attempt in message) for message in published] == [sorted(p.id for p in lost)]


@pytest.mark.django_db
def test_one_claim_never_exceeds_its_batch_and_takes_expired_leases_first():
    a, b = funded_account(), funded_account()
    stranded = [due_payment(source=a, target=b, amount=1) for _ in range(3)]
    claim_due(batch=10, lease_seconds=60)
    for payment in stranded:
        expire_lease(payment)
    fresh = [due_payment(source=a, target=b, amount=1) for _ in range(3)]
    claim = claim_due(batch=4, lease_seconds=60)
    assert len(claim) == 4
    assert sorted(pid for pid, _ in claim.reclaimed) == sorted(p.id for p in stranded)
    assert len(claim.fresh) == 1 and claim.fresh[0][0] in {p.id for p in fresh}


def test_a_message_sent_on_time_is_taken_before_a_backlog_sent_earlier():
    """The execute queue's priorities (promoter.ON_TIME_PRIORITY, BACKLOG_PRIORITY), on the
    real Redis: kombu keeps a list per priority step and a consumer reads step 0 first, so a
    payment released at its instant is not queued behind a burst's batches published
    before it. queue_lengths counts every step."""
    from celery import current_app

    from common import broker
    from payments import promoter
    from tests.conftest import flush_test_redis

    flush_test_redis()
    try:
        promoter.publish_messages([[[f"pay_backlog{i}", 1]] for i in range(3)])  # a tick's: BACKLOG
        promoter.publish_messages([[["pay_on_time", 1]]], priority=promoter.ON_TIME_PRIORITY)
        promoter.publish_messages([[["pay_backlog3", 1]]])
        assert broker.queue_lengths()["execute"] == 5
        taken = []
        with current_app.connection_for_read() as conn:
            queue = conn.SimpleQueue("execute", no_ack=True)
            for _ in range(5):
                args, _kwargs, _embed = queue.get(timeout=2).payload
                taken.append(args[0][0][0])
            queue.close()
        assert taken == ["pay_on_time", "pay_backlog0", "pay_backlog1", "pay_backlog2", "pay_backlog3"]
    finally:
        flush_test_redis()
