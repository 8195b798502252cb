"""Degraded mode (payments/fallback.py): while Redis is down the promoter claims and
executes from the database, one promoter at a time, a bounded number of batches a tick."""

import socket
import time
from types import SimpleNamespace

import pytest
from celery.signals import task_prerun
from django.db import connection

from common import broker
from delaypay.celery import DegradedModeFallback
from ledger.models import Transfer
from payments import fallback, metrics
from payments.fallback import ADVISORY_LOCK_KEY, AdvisoryLock, Fallback
from payments.models import ExecutionAttempt, Heartbeat, PaymentStatus, ScheduledPayment
from tests.concurrency import Racers, wait_until
from tests.factories import due_payment, funded_account


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Broker:
    """broker_answers as the fallback sees it, switched by the test."""

    def __init__(self, up: bool):
        self.up = up
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.up


@pytest.fixture
def make_fallback():
    """Fallbacks whose last beat tick was long ago (as in an outage), released afterwards."""
    made = []

    def make(*, broker_up: bool = False, batches: int = 4, after: float = 5.0):
        clock = Clock()
        fb = Fallback(after_seconds=after, interval_seconds=1.0, batches_per_tick=batches,
                      broker_answers=Broker(broker_up), clock=clock)
        clock.now += after + 1
        made.append(fb)
        return fb

    yield make
    for fb in made:
        fb.lock.release()


def status(payment) -> str:
    return ScheduledPayment.objects.get(pk=payment.pk).status


def executed_count(payments) -> int:
    return ScheduledPayment.objects.filter(pk__in=[p.pk for p in payments], status=PaymentStatus.EXECUTED).count()


@pytest.mark.django_db(transaction=True)
def test_without_beat_ticks_and_redis_due_payments_execute_in_process_once_each(make_fallback):
    a, b = funded_account(balance=100), funded_account()
    payments = [due_payment(source=a, target=b, amount=10) for _ in range(3)]
    fb = make_fallback()
    executed_before = metrics.degraded_executed_total._value.get()

    assert fb.run_round() == fallback.DEGRADED

    assert fb.degraded and fb.lock.held
    for payment in payments:
        assert status(payment) == PaymentStatus.EXECUTED
        assert Transfer.objects.filter(key=payment.id).count() == 1
        (attempt,) = ExecutionAttempt.objects.filter(payment=payment)
        assert attempt.outcome == "executed" and attempt.worker.startswith("promoter:")
    a.refresh_from_db()
    assert a.balance == 70
    assert Heartbeat.objects.filter(name=Heartbeat.PROMOTER).exists()  # /readyz stays green
    assert metrics.degraded_mode._value.get() == 1
    assert metrics.degraded_executed_total._value.get() - executed_before == 3


@pytest.mark.django_db(transaction=True)
def test_a_recent_beat_tick_keeps_the_fallback_idle_without_asking_redis(make_fallback):
    a, b = funded_account(balance=100), funded_account()
    payment = due_payment(source=a, target=b, amount=10)
    fb = make_fallback()
    fb.note_beat_tick()

    assert fb.run_round() == fallback.BEAT
    assert fb._broker_answers.asked == 0
    assert status(payment) == PaymentStatus.SCHEDULED


@pytest.mark.django_db(transaction=True)
def test_no_beat_tick_but_redis_answers_is_not_degraded_mode(make_fallback):
    a, b = funded_account(balance=100), funded_account()
    payment = due_payment(source=a, target=b, amount=10)
    fb = make_fallback(broker_up=True)

    assert fb.run_round() == fallback.BROKER_UP
    assert not fb.degraded and not fb.lock.held
    assert status(payment) == PaymentStatus.SCHEDULED


@pytest.mark.django_db(transaction=True)
def test_only_the_holder_of_the_advisory_lock_executes(make_fallback):
    a, b = funded_account(balance=100), funded_account()
    payment = due_payment(source=a, target=b, amount=10)
    other = AdvisoryLock(ADVISORY_LOCK_KEY)  # another promoter's session
    assert other.acquire()
    fb = make_fallback()
    try:
        assert fb.run_round() == fallback.LOCKED_ELSEWHERE
        assert not fb.degraded
        assert status(payment) == PaymentStatus.SCHEDULED
    finally:
        other.release()

    assert fb.run_round() == fallback.DEGRADED
    assert status(payment) == PaymentStatus.EXECUTED


@pytest.mark.django_db(transaction=True)
def test_two_promoters_racing_for_the_lock_execute_each_payment_once(make_fallback):
    a, b = funded_account(balance=100), funded_account()
    payments = [due_payment(source=a, target=b, amount=1) for _ in range(5)]
    first, second = make_fallback(), make_fallback()
    with Racers(2) as racers:
        outcomes = racers.run(first.run_round, second.run_round)
        # Each lock lives on a connection of the thread that took it: released there.
        racers.run(first.lock.release, second.lock.release)
    assert sorted(outcomes) == sorted([fallback.DEGRADED, fallback.LOCKED_ELSEWHERE])
    assert executed_count(payments) == 5
    assert Transfer.objects.filter(key__in=[p.id for p in payments]).count() == 5
    assert ExecutionAttempt.objects.filter(payment__in=payments).count() == 5


@pytest.mark.django_db(transaction=True)
def test_a_round_runs_at_most_batches_per_tick_claim_batches(make_fallback, settings):
    settings.DELAYPAY_CLAIM_BATCH = 2
    a, b = funded_account(balance=100), funded_account()
    payments = [due_payment(source=a, target=b, amount=1, seconds_ago=10 - i) for i in range(7)]
    fb = make_fallback(batches=2)

    assert fb.run_round() == fallback.DEGRADED
    assert executed_count(payments) == 4  # two batches of two, the oldest first
    assert {status(p) for p in payments[:4]} == {PaymentStatus.EXECUTED}
    assert fb.run_round() == fallback.DEGRADED
    assert executed_count(payments) == 7  # two, then the last one (a short batch ends the round)


@pytest.mark.django_db(transaction=True)
def test_degraded_mode_lasts_until_a_beat_tick_runs_again_then_frees_the_lock(make_fallback):
    a, b = funded_account(balance=100), funded_account()
    fb = make_fallback()
    assert fb.run_round() == fallback.DEGRADED

    # Redis is back, but no tick has reached this promoter yet (its consumer reconnects
    # with a back-off): payments falling due meanwhile still execute here.
    fb._broker_answers.up = True
    meanwhile = due_payment(source=a, target=b, amount=10)
    assert fb.run_round() == fallback.DEGRADED
    assert status(meanwhile) == PaymentStatus.EXECUTED

    fb.note_beat_tick()
    later = due_payment(source=a, target=b, amount=10)
    assert fb.run_round() == fallback.BEAT
    assert not fb.degraded and not fb.lock.held
    assert metrics.degraded_mode._value.get() == 0
    assert status(later) == PaymentStatus.SCHEDULED  # left to beat and the workers
    other = AdvisoryLock(ADVISORY_LOCK_KEY)
    try:
        assert other.acquire()
    finally:
        other.release()


@pytest.mark.django_db(transaction=True)
def test_a_lock_whose_session_died_is_taken_again(make_fallback):
    a, b = funded_account(balance=100), funded_account()
    fb = make_fallback()
    assert fb.run_round() == fallback.DEGRADED
    with connection.cursor() as cur:  # the lock's session dies (a PostgreSQL restart, an admin)
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
                    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                    " AND objid::bigint = (%s::bigint & 4294967295)", [ADVISORY_LOCK_KEY])
        assert cur.fetchone() == (True,)
    payment = due_payment(source=a, target=b, amount=10)

    assert fb.run_round() == fallback.DEGRADED  # on a new session
    assert fb.lock.held
    assert status(payment) == PaymentStatus.EXECUTED


@pytest.mark.django_db(transaction=True)
def test_the_thread_follows_beat_ticks_executes_in_the_gaps_and_cleans_up_when_stopped():
    a, b = funded_account(balance=100), funded_account()
    broker_state = Broker(up=False)
    fb = Fallback(after_seconds=1.0, interval_seconds=0.05, batches_per_tick=4, broker_answers=broker_state)
    beat_tick = SimpleNamespace(name=fallback.BEAT_TICK_TASK)
    fb.start()
    try:
        # Beat ticks keep arriving (the task_prerun signal of the promoter_tick task).
        payment = due_payment(source=a, target=b, amount=10)
        deadline = time.monotonic() + 2.0  # two fallback periods with ticks 20 times as often
        while time.monotonic() < deadline:
            task_prerun.send(sender=None, task_id="t", task=beat_tick, args=(), kwargs={})
            assert not fb.degraded
            time.sleep(0.05)
        assert status(payment) == PaymentStatus.SCHEDULED
        # They stop: within a few rounds the thread executes from the database.
        wait_until(lambda: status(payment) == PaymentStatus.EXECUTED, timeout=10, what="the degraded round")
        assert fb.degraded
    finally:
        fb.stop()
    assert not fb._thread.is_alive()
    assert not fb.degraded and not fb.lock.held
    other = AdvisoryLock(ADVISORY_LOCK_KEY)
    try:
        assert other.acquire()  # the thread gave the lock up
    finally:
        other.release()


def test_broker_answers_is_one_quick_try():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens once closed
    started = time.monotonic()
    assert broker.broker_answers(f"redis://127.0.0.1:{port}/0") is False
    assert time.monotonic() - started < 1.0  # no retries with back-off
    assert broker.broker_answers() is True


def worker_consuming(*queues):
    return SimpleNamespace(app=SimpleNamespace(amqp=SimpleNamespace(queues=SimpleNamespace(
        consume_from={name: object() for name in queues}))))


def test_the_fallback_runs_in_promoter_processes_only(settings):
    promoter, executor = worker_consuming("promoter"), worker_consuming("execute")
    assert DegradedModeFallback(promoter).include_if(promoter)
    assert not DegradedModeFallback(executor).include_if(executor)
    settings.DELAYPAY_FALLBACK_ENABLED = False
    assert not DegradedModeFallback(promoter).include_if(promoter)
