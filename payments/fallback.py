"""Degraded mode: the promoter goes on executing due payments while Redis is down.

Beat ticks the promoter through Redis, so without Redis nothing would be claimed. The
promoter process (the Celery worker of the ``promoter`` queue) therefore runs a
``Fallback`` in a thread of its own (a worker bootstep in delaypay/celery.py) that looks
once a tick (``DELAYPAY_TICK_SECONDS``):

* a beat tick ran in this process within ``DELAYPAY_FALLBACK_AFTER_SECONDS``: normal
  operation, nothing to do (and no round trip to Redis);
* no beat tick, but Redis answers a PING: beat or this promoter's consumer is the
  problem, not the transport; nothing to do (``DelaypayPromoterNotTicking`` says so);
* no beat tick and Redis does not answer: take the fleet-wide PostgreSQL advisory lock
  (one promoter executes at a time; the others keep looking) and run up to
  ``DELAYPAY_FALLBACK_BATCHES_PER_TICK`` degraded ticks: the normal claim, executed here
  in-process (``run_tick(degraded=True)``) with the heartbeat, metrics and log
  lines of any tick. Slower than the worker fleet, but on time.

Degraded mode ends when a beat tick runs in this process again, that is when normal
dispatch is back; the lock is then released. Redis answering a PING is not enough:
Celery's consumer reconnects with a back-off of up to 30 s, and until it has, no tick
arrives and nothing would execute.

Nothing runs twice. The claim takes each row ``FOR UPDATE SKIP LOCKED`` and raises its
attempt (the fencing token); the executor applies a payment only at its current attempt,
under its row lock, guarded by the ledger's unique transfer key. A degraded tick and a
beat tick, here or on another promoter, claim disjoint rows; an execute message that
comes back with Redis carries a superseded attempt and changes nothing. The advisory
lock keeps the pace of one promoter; correctness never depends on it.
"""

import logging
import threading
import time
from collections.abc import Callable

from celery.signals import task_prerun
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, close_old_connections, connections

from common import broker

from . import metrics, promoter, sql

logger = logging.getLogger(__name__)

BEAT_TICK_TASK = "payments.tasks.promoter_tick"
# The advisory lock's key, one for the whole fleet: the bytes "dlpyfbk1" as a bigint.
ADVISORY_LOCK_KEY = int.from_bytes(b"dlpyfbk1", "big")

# What a round did (run_round's answer).
BEAT = "beat"  # a beat tick ran recently: normal operation
BROKER_UP = "broker_up"  # no beat tick, but Redis answers: not degraded mode's business
LOCKED_ELSEWHERE = "locked_elsewhere"  # another promoter runs degraded
DEGRADED = "degraded"  # this promoter claimed and executed in-process


class AdvisoryLock:
    """A session-level PostgreSQL advisory lock, held on a database connection of its own.

    Not on the thread's Django connection: ``close_old_connections`` may close and reopen
    that one between rounds, which would drop a session lock without a word.
    """

    def __init__(self, key: int, *, alias: str = DEFAULT_DB_ALIAS):
        self.key = key
        self.alias = alias
        self.held = False
        self._connection = None  # a DatabaseWrapper, created in the thread that uses it

    def acquire(self) -> bool:
        """Take the lock without waiting, or confirm that its session is still alive.
        False when another session holds it; a database error propagates (after closing)."""
        if self.held:
            try:
                self._fetch(sql.FALLBACK_SESSION_ALIVE)
                return True
            except DatabaseError:
                self.close()  # the session died (a PostgreSQL restart), and its lock with it
        try:
            self.held = bool(self._fetch(sql.FALLBACK_TRY_LOCK, [self.key]))
        except DatabaseError:
            self.close()
            raise
        return self.held

    def release(self) -> None:
        """Give the lock up and close its connection (the session's end frees it anyway)."""
        if self._connection is None:
            return
        try:
            if self.held:
                self._fetch(sql.FALLBACK_UNLOCK, [self.key])
        except DatabaseError:
            pass
        finally:
            self.close()

    def close(self) -> None:
        wrapper, self._connection, self.held = self._connection, None, False
        if wrapper is not None:
            try:
                wrapper.close()
            except DatabaseError:
                pass

    def _fetch(self, statement: str, params: list | None = None):
        if self._connection is None:
            self._connection = connections.create_connection(self.alias)
        with self._connection.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchone()[0]


class Fallback:
    """The degraded-mode loop of one promoter process (see the module docstring)."""

    def __init__(
        self,
        *,
        after_seconds: float,
        interval_seconds: float,
        batches_per_tick: int,
        broker_answers: Callable[[], bool] = broker.broker_answers,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.after_seconds = after_seconds
        self.interval_seconds = interval_seconds
        self.batches_per_tick = max(1, batches_per_tick)
        self._broker_answers = broker_answers
        self._clock = clock
        self._last_beat_tick = clock()  # start-up counts as a tick: beat gets its grace period
        self.degraded = False
        self.lock = AdvisoryLock(ADVISORY_LOCK_KEY)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_settings(cls) -> "Fallback":
        return cls(
            after_seconds=settings.DELAYPAY_FALLBACK_AFTER_SECONDS,
            interval_seconds=settings.PROMOTER_TICK_SECONDS,
            batches_per_tick=settings.DELAYPAY_FALLBACK_BATCHES_PER_TICK,
        )

    def note_beat_tick(self) -> None:
        """A beat tick is running in this process (the promoter_tick task)."""
        self._last_beat_tick = self._clock()

    def run_round(self) -> str:
        """One look: do nothing, or run up to ``batches_per_tick`` degraded ticks. Returns
        BEAT, BROKER_UP, LOCKED_ELSEWHERE or DEGRADED."""
        close_old_connections()
        silent = self._clock() - self._last_beat_tick
        if silent < self.after_seconds:
            self._leave("a beat tick ran: normal dispatch resumes")
            return BEAT
        if not self.degraded and self._broker_answers():
            self.lock.release()
            return BROKER_UP
        if not self.lock.acquire():
            # Its connection stays open for the next try (it holds nothing).
            self._leave("another promoter holds the degraded-mode lock", release=False)
            return LOCKED_ELSEWHERE
        if not self.degraded:
            self.degraded = True
            metrics.record_degraded(active=True)
            logger.warning(
                "degraded mode: Redis does not answer and no beat tick ran for %.0f s; this promoter "
                "executes due payments from the database", silent, extra={"seconds_without_tick": round(silent, 1)},
            )
        for _ in range(self.batches_per_tick):
            result = promoter.run_tick(degraded=True)
            metrics.record_degraded(active=True, executed=result.executed_in_process)
            # Fewer than a whole batch: nothing more is due (or the in-flight cap is near).
            if result.claimed < settings.DELAYPAY_CLAIM_BATCH or result.capped or self._stop.is_set():
                break
        return DEGRADED

    def _leave(self, reason: str, *, release: bool = True) -> None:
        if self.degraded:
            self.degraded = False
            metrics.record_degraded(active=False)
            logger.warning("degraded mode ends: %s", reason)
        if release:
            self.lock.release()

    # --- The thread ----------------------------------------------------------------------

    def start(self) -> None:
        task_prerun.connect(self._on_task_prerun, weak=False)
        self._thread = threading.Thread(target=self._run, name="delaypay-fallback", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the thread: it finishes its round, releases the lock and closes its connections."""
        self._stop.set()
        task_prerun.disconnect(self._on_task_prerun)
        if self._thread is not None:
            self._thread.join(timeout)

    def _on_task_prerun(self, sender=None, task=None, **_kwargs) -> None:
        if getattr(task, "name", None) == BEAT_TICK_TASK:
            self.note_beat_tick()

    def _run(self) -> None:
        logger.info("degraded-mode fallback ready", extra={
            "after_seconds": self.after_seconds, "batches_per_tick": self.batches_per_tick,
        })
        try:
            while not self._stop.is_set():
                started = self._clock()
                try:
                    self.run_round()
                except DatabaseError as exc:
                    # PostgreSQL is down or restarting: nothing can execute; look again next tick.
                    logger.warning("degraded-mode round failed", extra={"error": type(exc).__name__})
                    connections.close_all()
                except Exception:
                    logger.exception("degraded-mode round failed")
                    connections.close_all()
                self._stop.wait(max(0.0, self.interval_seconds - (self._clock() - started)))
        finally:
            self._leave("the promoter stops")
            connections.close_all()  # this thread's connections only
