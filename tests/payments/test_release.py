"""Release at the instant (payments/release.py): nothing leaves before its due instant by
the database's clock, a cancel committed before the instant wins, and what falls due
between two ticks leaves within a slot of its instant, not at the next tick."""

import threading
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection

from common.db import database_now
from payments import promoter, release
from payments.models import PaymentStatus, ScheduledPayment
from payments.services import payment_cancel, payment_schedule
from tests.factories import due_payout, funded_account, payee_for

pytestmark = pytest.mark.django_db(transaction=True)


def due_in(source, target, seconds: float, *, now=None):
    now = now or database_now()
    return payment_schedule(
        payer=source.owner, from_account_id=source.id, to_account_id=target.id, amount=1,
        execute_at=now + timedelta(seconds=seconds),
    )


def due_spread(source, target, offsets: list[float]) -> list[ScheduledPayment]:
    """Payments due at these offsets from the database's now(), set in one statement after
    they were created (the creates may take as long as a loaded machine makes them)."""
    payments = [due_in(source, target, 60) for _ in offsets]
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE payments_scheduledpayment p SET execute_at = now() + make_interval(secs => o.offset_s)"
            " FROM unnest(%s::text[], %s::float8[]) AS o(id, offset_s) WHERE p.id = o.id",
            [[p.id for p in payments], [float(o) for o in offsets]],
        )
    for p in payments:
        p.refresh_from_db()
    return payments


def wait_until_database_time(instant) -> None:
    """Sleep (never spin: the releaser's thread needs the interpreter and the database) until
    the database's clock reaches ``instant``."""
    while (left := (instant - database_now(clock=True)).total_seconds()) > 0:
        time.sleep(min(left, 0.02))


def claimed_rows(ids):
    """(id, status, execute_at, claimed_at) of the payments, by the database."""
    return {p.id: p for p in ScheduledPayment.objects.filter(pk__in=ids)}


class Published:
    """A stand-in publisher: the pairs published, and each message's priority (None: a
    payouts message, which has no priority)."""

    def __init__(self):
        self.pairs = []
        self.priorities = []

    def __call__(self, messages, priority=None):
        for message in messages:
            self.pairs += [tuple(p) for p in message]
            self.priorities.append(priority)


def releaser(**kwargs) -> release.Releaser:
    return release.Releaser(**{
        "slot_seconds": 0.01, "poll_seconds": 0.05, "period_seconds": 1.0, "batch": 1000, "lease_seconds": 60.0,
        **kwargs,
    })


def run_releaser_until(instant, **options) -> Published:
    """A Releaser's thread (``options``: releaser()'s), publishing into a Published, from
    now until the database's clock reaches ``instant``."""
    published = Published()
    r = releaser(**options)
    original = release.release_round

    def with_stub(**kwargs):
        return original(**{**kwargs, "publish": published, "publish_payouts": published})

    release.release_round = with_stub
    try:
        r.start()
        wait_until_database_time(instant)
    finally:
        r.stop()
        release.release_round = original
    return published


def run_rounds(published: Published, *, seconds: float, **round_kwargs) -> list[release.Round]:
    """Release rounds back to back (no sleep) for ``seconds`` of the database's clock:
    the most rounds a releaser can run, each a chance to claim too early."""
    rounds = []
    end = database_now(clock=True) + timedelta(seconds=seconds)
    while database_now(clock=True) < end:
        rounds.append(release.release_round(
            batch=1000, lease_seconds=60, horizon_seconds=1.0, payouts_due=False, degraded=False,
            publish=published, **round_kwargs,
        ))
    return rounds


def test_nothing_is_claimed_before_its_due_instant_by_the_database_clock():
    alice, bob = funded_account(balance=1000), funded_account()
    payments = due_spread(alice, bob, [0.3 + i * 0.037 for i in range(20)])
    published = Published()
    run_rounds(published, seconds=1.4)
    rows = claimed_rows([p.id for p in payments])
    assert {r.status for r in rows.values()} == {PaymentStatus.EXECUTING}
    assert sorted(published.pairs) == sorted((p.id, 1) for p in payments)
    for row in rows.values():
        assert row.claimed_at >= row.execute_at, (row.id, row.claimed_at, row.execute_at)
    # Released one by one at their instants: ahead of any backlog in the execute queue.
    assert set(published.priorities) == {promoter.ON_TIME_PRIORITY}


def test_the_look_ahead_names_the_next_instant_and_nothing_past_the_horizon():
    alice, bob = funded_account(balance=1000), funded_account()
    soon, _later = due_spread(alice, bob, [0.5, 5])
    result = release.release_round(batch=10, lease_seconds=60, horizon_seconds=1.0, payouts_due=False,
                                   degraded=False, publish=Published())
    assert result.claimed == 0
    assert result.next_due == soon.execute_at
    assert result.next_payout_due is None
    until_soon = (soon.execute_at - result.database_now).total_seconds()
    assert 0 < until_soon <= 0.5
    assert result.wake_after(poll=5.0) == pytest.approx(until_soon + release.WAKE_MARGIN_SECONDS)
    assert result.wake_after(poll=0.05) == 0.05


def test_a_cancel_committed_before_the_due_instant_wins_over_the_release():
    alice, bob = funded_account(balance=1000), funded_account()
    payments = [due_in(alice, bob, 60) for _ in range(10)]
    # Then all due half a second from now, in one statement: how long the creates took no
    # longer matters.
    now = database_now()
    ScheduledPayment.objects.filter(pk__in=[p.id for p in payments]).update(execute_at=now + timedelta(seconds=0.5))
    published = Published()
    stop = threading.Event()

    def release_continuously():
        try:
            while not stop.is_set():
                release.release_round(batch=1000, lease_seconds=60, horizon_seconds=1.0, payouts_due=False,
                                      degraded=False, publish=published)
        finally:
            connection.close()

    thread = threading.Thread(target=release_continuously)
    thread.start()
    try:
        # 300 ms before the instant by the database's clock (the payments' own).
        wait_until_database_time(now + timedelta(seconds=0.2))
        cancelled = payments[::2]
        for p in cancelled:
            payment_cancel(payment_id=p.id, actor=alice.owner)
        assert database_now(clock=True) < now + timedelta(seconds=0.5), "the cancels took too long to prove anything"
        wait_until_database_time(now + timedelta(seconds=0.8))
    finally:
        stop.set()
        thread.join()
    rows = claimed_rows([p.id for p in payments])
    assert {rows[p.id].status for p in cancelled} == {PaymentStatus.CANCELLED}
    assert {rows[p.id].status for p in payments[1::2]} == {PaymentStatus.EXECUTING}
    assert {pid for pid, _ in published.pairs} == {p.id for p in payments[1::2]}


def test_the_release_claim_leaves_the_backlog_and_retries_to_the_ticks():
    alice, bob = funded_account(balance=1000), funded_account()
    now = database_now()
    old, fresh = due_in(alice, bob, 1, now=now), due_in(alice, bob, 1, now=now)
    past_the_window = now - timedelta(seconds=release.RELEASE_WINDOW_SECONDS + 1)
    ScheduledPayment.objects.filter(pk=old.id).update(execute_at=past_the_window)
    ScheduledPayment.objects.filter(pk=fresh.id).update(execute_at=now)
    result = release.release_round(batch=10, lease_seconds=60, horizon_seconds=1.0, payouts_due=False,
                                   degraded=False, publish=Published())
    assert result.claimed == 1
    rows = claimed_rows([old.id, fresh.id])
    assert (rows[old.id].status, rows[fresh.id].status) == (PaymentStatus.SCHEDULED, PaymentStatus.EXECUTING)


def test_what_falls_due_between_two_ticks_leaves_within_a_slot_of_its_instant():
    """The release precision, pinned: with the releaser's thread running, 20 payments due
    at instants spread over a second are claimed within half a tick of their instant (the
    database's claimed_at - execute_at; a slot is 10 ms, and on a quiet machine the latest
    is about that). The beat's tick alone (1 s) leaves the latest of them about a second
    late."""
    alice, bob = funded_account(balance=1000), funded_account()
    payments = due_spread(alice, bob, [0.4 + i * 0.05 for i in range(20)])
    now = payments[0].execute_at - timedelta(seconds=0.4)
    # A tick past the last instant (1.35 s): the releaser has had its chance at every one.
    run_releaser_until(now + timedelta(seconds=2.35))
    rows = claimed_rows([p.id for p in payments])
    lateness = sorted((row.claimed_at - row.execute_at).total_seconds() for row in rows.values())
    assert {row.status for row in rows.values()} == {PaymentStatus.EXECUTING}
    assert lateness[0] >= 0
    assert lateness[-1] < 0.5, lateness


def test_the_beat_ticks_each_shard_once_a_second_and_drops_a_tick_older_than_that():
    ticks = {name: entry for name, entry in settings.CELERY_BEAT_SCHEDULE.items() if name.startswith("promoter-tick")}
    assert len(ticks) == settings.DELAYPAY_CLAIM_SHARDS
    for entry in ticks.values():
        assert entry["schedule"] == 1.0
        assert entry["options"]["expires"] == 1.0
    assert settings.DELAYPAY_RELEASE_ENABLED
    assert (settings.DELAYPAY_RELEASE_SLOT_SECONDS, settings.DELAYPAY_RELEASE_POLL_SECONDS) == (0.01, 0.05)


def test_one_senders_burst_at_one_instant_leaves_one_batch_and_the_rest_to_the_fair_ticks(settings):
    """A claim that comes back a whole batch, most of it one sender's, is that sender's
    burst: the releaser takes that batch and leaves what else was due then to the ticks
    (which claim fairly by sender), then goes on with what falls due after it."""
    settings.DELAYPAY_CLAIM_PER_SENDER = 5
    alice, bob = funded_account(balance=1000), funded_account()
    offsets = [0.4] * 30 + [0.7, 0.75, 0.8]
    payments = due_spread(alice, bob, offsets)
    burst, later = payments[:30], payments[30:]
    now = burst[0].execute_at - timedelta(seconds=0.4)
    run_releaser_until(now + timedelta(seconds=1.8), batch=10)
    rows = claimed_rows([p.id for p in payments])
    assert sum(rows[p.id].status == PaymentStatus.EXECUTING for p in burst) == 10
    assert {rows[p.id].status for p in later} == {PaymentStatus.EXECUTING}


def test_one_promoter_releases_at_a_time_and_another_takes_over_when_it_stops():
    first, second = releaser(), releaser()
    first.start()
    try:
        assert wait_for(lambda: first.releasing, 5), "the first releaser never took the lock"
        second.start()
        time.sleep(2.5)  # more than two periods: the second tried and was refused
        assert (first.releasing, second.releasing) == (True, False)
        first.stop()
        assert wait_for(lambda: second.releasing, 5), "the second releaser did not take over"
    finally:
        first.stop()
        second.stop()


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_a_burst_of_many_senders_is_claimed_on_beside_the_ticks(settings):
    settings.DELAYPAY_CLAIM_PER_SENDER = 5
    target = funded_account()
    payers = [funded_account(balance=10) for _ in range(30)]
    payments = [due_in(payer, target, 60) for payer in payers]
    with connection.cursor() as cur:
        cur.execute("UPDATE payments_scheduledpayment SET execute_at = now() + interval '0.4 seconds'"
                    " WHERE id = ANY(%s) RETURNING execute_at", [[p.id for p in payments]])
        burst_at = cur.fetchone()[0]
    published = run_releaser_until(burst_at + timedelta(seconds=0.3), batch=10)
    rows = claimed_rows([p.id for p in payments])
    assert {row.status for row in rows.values()} == {PaymentStatus.EXECUTING}
    # Whole batches are a burst: sent behind what falls due one by one. The last claim
    # (the burst's remainder, not a whole batch) may go either way.
    assert published.priorities[:2] == [promoter.BACKLOG_PRIORITY] * 2, published.priorities


def test_during_a_burst_what_falls_due_after_it_is_claimed_first_and_sent_ahead_of_it():
    """A round after a burst's first whole batch: the payment due after the burst's instant
    is claimed first and published at ON_TIME priority, then one more batch of the burst
    at BACKLOG priority (the workers take ON_TIME messages first: test_promoter.py)."""
    target = funded_account()
    payers = [funded_account(balance=10) for _ in range(30)]
    burst = [due_in(payer, target, 60) for payer in payers]
    stream = due_in(payers[0], target, 60)
    with connection.cursor() as cur:
        cur.execute("UPDATE payments_scheduledpayment SET execute_at = now() - interval '0.2 seconds'"
                    " WHERE id = ANY(%s)", [[p.id for p in burst]])
    published = Published()
    first = release.release_round(batch=10, lease_seconds=60, horizon_seconds=1.0, payouts_due=False,
                                  degraded=False, publish=published)
    assert (first.full, first.claimed, published.priorities) == (True, 10, [promoter.BACKLOG_PRIORITY])
    with connection.cursor() as cur:
        cur.execute("UPDATE payments_scheduledpayment SET execute_at = now() WHERE id = %s", [stream.id])
    published = Published()
    second = release.release_round(batch=10, lease_seconds=60, horizon_seconds=1.0, payouts_due=False,
                                   degraded=False, publish=published, after=first.database_now, burst=True)
    assert (second.full, second.burst_full, second.claimed) == (False, True, 11)
    assert published.priorities == [promoter.ON_TIME_PRIORITY, promoter.BACKLOG_PRIORITY]
    assert published.pairs[0] == (stream.id, 1)
    assert {pid for pid, _ in published.pairs[1:]} <= {p.id for p in burst}


def test_a_burst_batch_mostly_of_one_sender_is_seen_as_that_senders_burst(settings):
    """Claiming on beside the ticks stops when the burst's batch is one sender's: the
    round says so (hot_sender), and the releaser leaves the rest to the fair ticks."""
    settings.DELAYPAY_CLAIM_PER_SENDER = 5
    target = funded_account()
    payers = [funded_account(balance=10) for _ in range(10)]
    hot = funded_account(balance=100)
    many = [due_in(payer, target, 60) for payer in payers]
    one = [due_in(hot, target, 60) for _ in range(20)]
    with connection.cursor() as cur:
        cur.execute("UPDATE payments_scheduledpayment SET execute_at = now() - interval '0.3 seconds'"
                    " WHERE id = ANY(%s)", [[p.id for p in many]])
        cur.execute("UPDATE payments_scheduledpayment SET execute_at = now() - interval '0.2 seconds'"
                    " WHERE id = ANY(%s)", [[p.id for p in one]])
    first = release.release_round(batch=10, lease_seconds=60, horizon_seconds=1.0, payouts_due=False,
                                  degraded=False, publish=Published())
    assert (first.full, first.hot_sender) == (True, False)
    second = release.release_round(batch=10, lease_seconds=60, horizon_seconds=1.0, payouts_due=False,
                                   degraded=False, publish=Published(), after=first.database_now, burst=True)
    assert (second.burst_full, second.hot_sender) == (True, True)


def test_a_payout_is_claimed_at_its_instant_within_a_payout_slot_never_before():
    alice = funded_account(balance=1000)
    payee = payee_for(alice.owner)
    payouts = [due_payout(source=alice, payee=payee, amount=1) for _ in range(3)]
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE payments_scheduledpayment p SET execute_at = now() + make_interval(secs => o.offset_s)"
            " FROM unnest(%s::text[], %s::float8[]) AS o(id, offset_s) WHERE p.id = o.id RETURNING now()",
            [[p.id for p in payouts], [0.4, 0.6, 0.65]],
        )
        now = cur.fetchone()[0]
    published = run_releaser_until(now + timedelta(seconds=1.6))
    rows = claimed_rows([p.id for p in payouts])
    assert sorted(pid for pid, _ in published.pairs) == sorted(p.id for p in payouts)
    lateness = [(row.claimed_at - row.execute_at).total_seconds() for row in rows.values()]
    assert min(lateness) >= 0
    assert max(lateness) < 0.5, lateness  # a payout slot (0.1 s) and a poll, with room; the tick is 1 s
