"""Release at the instant: between the beat's ticks, payments leave at their due time.

The beat ticks the promoter once a second (``DELAYPAY_TICK_SECONDS``) and each tick claims
whatever is due. Alone, that makes a payment up to a tick late: 0.55 s at the median and
1.05 s at p99 for 300 payments a second due evenly (docs/reference/benchmarks.md#on-time).
The ``Releaser`` is a thread of the promoter process (a worker bootstep in
delaypay/celery.py) that closes that gap without changing what a claim is:

* each round is one transaction: the release claim (sql.CLAIM_RELEASE: the internal rows
  due within the last ``RELEASE_WINDOW_SECONDS``, ``execute_at <= now()`` by the
  database's clock, the claim every claimer makes) and then the look-ahead
  (sql.RELEASE_NEXT_DUE: the database's ``now()`` and the next instant an internal payment
  or a payout falls due after it);
* after the commit it publishes what it claimed, as a tick does, and sleeps until the next
  due instant (mapped from the database's clock onto this process's monotonic clock by
  differences only, so no clock skew enters), at least ``DELAYPAY_RELEASE_SLOT_SECONDS``
  after the round began (rows falling due within one slot leave together) and at most
  ``DELAYPAY_RELEASE_POLL_SECONDS`` (a payment created already due, or due sooner than
  anything seen, waits no longer than that);
* payouts due at the instant are claimed as the tick claims them (promoter.payouts_tick:
  within their rail's breaker and pacing), at most once every ``PAYOUT_SLOT_SECONDS``.

Nothing leaves early: a row is claimed only by a statement whose ``now()`` is at or past
its ``execute_at``, so ``executed_at >= execute_at`` and a cancel committed before the due
instant finds the row still SCHEDULED (tests/payments/test_release.py). Waking early costs
an empty claim, never an early one.

The beat's ticks stay what they were: recurring generation, retries, expired leases, the
backlog of a burst (in due order, fair by sender), the heartbeat. The releaser only takes
the rows that fall due now. A claim that comes back a whole batch is a burst at that
instant; from then on each round first claims what falls due after that instant (the
stream), sent at ON_TIME priority (promoter.ON_TIME_PRIORITY), ahead of the burst's
batches in the execute queue. Of many senders, the releaser also claims on a batch of
the burst a round, at BACKLOG priority, while the burst is in its window; of one sender
(more than DELAYPAY_CLAIM_PER_SENDER of the batch), it leaves the rest of the burst to
the ticks' fair claim. So one sender's burst is drained fairly, and the payments due
after a burst are neither claimed nor queued behind its whole backlog
(docs/decisions/0019-release-at-the-instant.md).

One promoter releases at a time: the fleet-wide advisory lock ``RELEASE_LOCK_KEY`` (the
others keep trying once a tick and take over within a tick when its holder dies). The
lock is about pace, never correctness: claims take disjoint rows (``SKIP LOCKED``). While
Redis is down the releaser executes in-process what it claims, like a degraded tick.
"""

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection, connections, transaction

from common.db import bound_cursor
from rails.base import RAIL_NAMES

from . import metrics, promoter, sql
from .fallback import AdvisoryLock

logger = logging.getLogger(__name__)

# The fleet-wide lock of the releasing promoter: the bytes "dlpyrls1" as a bigint.
RELEASE_LOCK_KEY = int.from_bytes(b"dlpyrls1", "big")
# How far back the release claim reaches: rows due longer ago are the ticks' backlog. Half
# a second: wider than any round (a round that falls behind by less loses nothing to the
# ticks), narrow enough that during a burst the releaser spends at most that much of the
# burst's due order before it is back on the rows falling due now.
RELEASE_WINDOW_SECONDS = 0.5
# Waking a millisecond past the due instant: the mapping of the database's clock onto
# this one is exact only to the round trip, and a wake before the instant is an empty claim.
WAKE_MARGIN_SECONDS = 0.001
# How long the releaser executes in-process, without trying Redis, after a publish failed.
BROKER_DOWN_SECONDS = 5.0
# Payouts leave at most this often: a payout message costs its executor a reserve, a rail
# round and a settle whatever it holds (36 ms for two payouts), so one message a slot of
# 10 ms at 100 payouts a second queued them seconds deep; ten a second keep up.
PAYOUT_SLOT_SECONDS = 0.1


@dataclass
class Round:
    """What one release round did and saw."""

    claimed: int = 0
    executed_in_process: int = 0
    full: bool = False  # the on-time claim came back a whole batch: a burst at this instant
    burst_full: bool = False  # the burst's batch (``burst``) came back whole: more of it is in the window
    hot_sender: bool = False  # one sender had more than its fair share (DELAYPAY_CLAIM_PER_SENDER) of a claim
    database_now: datetime | None = None
    next_due: datetime | None = None  # internal
    next_payout_due: datetime | None = None
    dispatch_lateness: list[float] = field(default_factory=list)

    def wake_after(self, *, poll: float) -> float:
        """Seconds from the round's instant (its now()) to the next due instant, at most ``poll``."""
        upcoming = [t for t in (self.next_due, self.next_payout_due) if t is not None]
        if not upcoming or self.database_now is None:
            return poll
        return min(poll, max(0.0, (min(upcoming) - self.database_now).total_seconds()) + WAKE_MARGIN_SECONDS)


NEVER = datetime.fromisoformat("0001-01-01T00:00:00+00:00")


def release_round(
    *,
    batch: int,
    lease_seconds: float,
    horizon_seconds: float,
    payouts_due: bool,
    degraded: bool,
    after: datetime = NEVER,
    burst: bool = False,
    publish: Callable = promoter.publish_messages,
    publish_payouts: Callable = promoter.publish_payouts,
    execute_in_process: Callable = promoter.execute_in_process,
) -> Round:
    """One round: the payouts whose instant came (``payouts_due``, from the last round's
    look-ahead), the release claims and the look-ahead in one transaction, then the
    publish (or, ``degraded`` or when it fails, the execution here).

    The on-time claim takes the rows due after ``after`` (the instant of the last claim
    that came back a whole batch: a burst's rows are not the stream's) and is sent
    ON_TIME, unless it is a whole batch itself (a burst at this instant, sent BACKLOG).
    ``burst`` (a burst of many senders is in the window): one more batch of the window's
    rows in due order, the burst's, sent BACKLOG behind the on-time ones."""
    result = Round()
    if payouts_due and not degraded:
        tick = promoter.TickResult()
        promoter.payouts_tick(publish=publish_payouts, deadline=time.monotonic() + horizon_seconds,
                              lease_seconds=lease_seconds, result=tick)
        result.dispatch_lateness += tick.dispatch_lateness
    on_time, backlog = promoter.Claim(), promoter.Claim()
    params = {**promoter.claim_params(batch=batch, lease_seconds=lease_seconds, actor="promoter"),
              "window": RELEASE_WINDOW_SECONDS}
    # The look-ahead is prepared on the server (common.db.bound_cursor): it runs every round,
    # up to a hundred times a second, and its plan over the schedule's partitions never
    # changes. The claims are planned each time, as the ticks' claims are: their plan
    # depends on how many rows are due (a burst, or a few), which a generic plan cannot know.
    with transaction.atomic(), connection.cursor() as cur, bound_cursor() as prepared:
        on_time.add_rows(promoter._claim_rows(cur, sql.CLAIM_RELEASE, {**params, "after": after}))
        if burst and len(on_time) < batch:
            backlog.add_rows(promoter._claim_rows(cur, sql.CLAIM_RELEASE, {**params, "after": NEVER}))
        prepared.execute(sql.RELEASE_NEXT_DUE, {"horizon": horizon_seconds, "rails": list(RAIL_NAMES)})
        result.database_now, result.next_due, result.next_payout_due = prepared.fetchone()
    result.claimed = len(on_time) + len(backlog)
    result.full = len(on_time) >= batch
    result.burst_full = len(backlog) >= batch
    cap = settings.DELAYPAY_CLAIM_PER_SENDER
    result.hot_sender = bool(cap) and max(
        (*on_time.fresh_senders.values(), *backlog.fresh_senders.values()), default=0) > cap
    result.dispatch_lateness += on_time.dispatch_lateness + backlog.dispatch_lateness
    # A whole batch is a burst at this instant: sent behind what falls due one by one.
    for claim, priority in ((on_time, promoter.BACKLOG_PRIORITY if result.full else promoter.ON_TIME_PRIORITY),
                            (backlog, promoter.BACKLOG_PRIORITY)):
        if claim:
            _, executed = promoter.hand_over(
                promoter.messages_for(claim), degraded=degraded, publish=functools.partial(publish, priority=priority),
                execute_in_process=execute_in_process,
            )
            result.executed_in_process += executed
            degraded = degraded or bool(executed)  # the publish failed: the rest runs here too
    return result


class Releaser:
    """The release loop of one promoter process (see the module docstring)."""

    def __init__(
        self,
        *,
        slot_seconds: float,
        poll_seconds: float,
        period_seconds: float,
        batch: int,
        lease_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.slot_seconds = slot_seconds
        self.poll_seconds = max(poll_seconds, slot_seconds)
        self.period_seconds = period_seconds
        self.batch = batch
        self.lease_seconds = lease_seconds
        self._clock = clock
        self.lock = AdvisoryLock(RELEASE_LOCK_KEY)
        self.releasing = False
        self._payouts_due = False
        self._payouts_not_before = 0.0
        self._after = NEVER
        self._burst = False
        self._broker_down_until = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_settings(cls) -> "Releaser":
        return cls(
            slot_seconds=settings.DELAYPAY_RELEASE_SLOT_SECONDS,
            poll_seconds=settings.DELAYPAY_RELEASE_POLL_SECONDS,
            period_seconds=settings.PROMOTER_TICK_SECONDS,
            batch=settings.DELAYPAY_CLAIM_BATCH,
            lease_seconds=settings.DELAYPAY_LEASE_SECONDS,
        )

    def run_period(self) -> int:
        """Release for one tick period, if this promoter holds the lock. Returns the rounds run."""
        close_old_connections()
        if not self.lock.acquire():
            self._set_releasing(False)
            return 0
        self._set_releasing(True)
        end = self._clock() + self.period_seconds
        rounds = 0
        while not self._stop.is_set():
            began = self._clock()
            degraded = began < self._broker_down_until
            payouts_now = self._payouts_due and began >= self._payouts_not_before
            result = release_round(
                batch=self.batch, lease_seconds=self.lease_seconds, horizon_seconds=self.period_seconds,
                payouts_due=payouts_now, degraded=degraded, after=self._after, burst=self._burst,
            )
            if payouts_now:
                self._payouts_due, self._payouts_not_before = False, began + PAYOUT_SLOT_SECONDS
            if result.full:
                # A burst at the instant: one batch of it left now. What falls due after it is
                # claimed first from now on (the stream is not claimed behind the burst).
                # One sender's burst (DELAYPAY_CLAIM_PER_SENDER) is left to the ticks, which
                # claim fairly by sender; a burst of many senders is claimed on beside them,
                # a batch a round, while it is in the window.
                self._after = result.database_now
                self._burst = not result.hot_sender
            elif self._burst and (result.hot_sender or not result.burst_full):
                # The burst left the window or is all claimed; or what is left of it is
                # mostly one sender's, which the ticks claim fairly.
                self._burst = False
            rounds += 1
            if result.executed_in_process and not degraded:
                self._broker_down_until = self._clock() + BROKER_DOWN_SECONDS
            metrics.record_release(result)
            wait = 0.0 if self._burst else max(self.slot_seconds, result.wake_after(poll=self.poll_seconds))
            # The payouts' instant comes by the next round (the round's now() is about `began`);
            # once due they stay due until a round claims them, at most once a payout slot.
            self._payouts_due = self._payouts_due or (result.next_payout_due is not None and (
                result.next_payout_due <= result.database_now + timedelta(seconds=wait)
            ))
            self._stop.wait(max(0.0, began + wait - self._clock()))
            if began + wait >= end:
                return rounds  # the next period starts at once, with the lock checked
        return rounds

    def _set_releasing(self, releasing: bool) -> None:
        if releasing != self.releasing:
            self.releasing = releasing
            metrics.record_releasing(releasing)
            logger.info("releasing at the instant" if releasing else "another promoter releases")

    # --- The thread ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="delaypay-releaser", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the thread: it ends its round, releases the lock and closes its connections."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        logger.info("releaser ready", extra={"slot_seconds": self.slot_seconds, "poll_seconds": self.poll_seconds})
        try:
            while not self._stop.is_set():
                started = self._clock()
                try:
                    if self.run_period():
                        continue
                except DatabaseError as exc:
                    # PostgreSQL is down, restarting or failing over: the ticks' business too.
                    logger.warning("release round failed", extra={"error": type(exc).__name__})
                    self.lock.close()
                    self._set_releasing(False)
                    connections.close_all()
                except Exception:
                    logger.exception("release round failed")
                    self.lock.close()
                    self._set_releasing(False)
                    connections.close_all()
                self._stop.wait(max(0.0, self.period_seconds - (self._clock() - started)))
        finally:
            self._set_releasing(False)
            self.lock.release()
            connections.close_all()  # this thread's connections only
