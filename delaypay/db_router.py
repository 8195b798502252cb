"""Reads of the REST API from a streaming read replica; everything else from the primary.

Installed only when ``DATABASE_REPLICA_URL`` is set (delaypay/settings.py adds the
``replica`` alias, this router and delaypay/read_routing.py's middleware); without it
nothing here runs. docs/how-to/read-replica.md is the operator's view.

* The middleware gives every request a ``ReadRouting`` in a context variable and marks it
  *eligible* for GET and HEAD of the API's read views (payments, accounts, recurring
  payments, payees). The router's ``db_for_read`` sends a read to the replica only inside
  an eligible request, only for the ``payments`` and ``ledger`` apps (users, knox tokens,
  sessions, permissions and login lockouts are always read on the primary: a token issued
  a moment ago must work at once) and never inside a transaction on the primary.
* Which database serves an eligible request is decided once, at its first routed read (by
  then DRF has authenticated the user) and kept for the whole request, so a page and its
  related rows come from one snapshot: the primary when the user wrote through the API
  within ``DELAYPAY_READ_YOUR_WRITES_SECONDS`` (read-your-writes), when the cache holding
  that record does not answer, or when the replica is not usable; else the replica.
* The replica is usable when it answers, is a standby, and its lag is within
  ``DELAYPAY_REPLICA_MAX_LAG_SECONDS``. ``ReplicaMonitor`` measures that at most once per
  ``DELAYPAY_REPLICA_CHECK_SECONDS`` per process, on connections of its own with a short
  connect timeout; other threads of the process meanwhile use the last answer.
* Writes always go to the primary; only the primary is ever migrated.
"""

import contextlib
import logging
import math
import os
import threading
import time
from collections import deque
from dataclasses import dataclass

import psycopg
from django.conf import settings
from django.core.cache import cache
from django.db import DEFAULT_DB_ALIAS, connections

from common.routing import REPLICA, current_routing
from delaypay import replica_metrics as metrics

logger = logging.getLogger(__name__)

PRIMARY = DEFAULT_DB_ALIAS
# The apps whose rows an API read may take from the replica. Anything else (auth, knox,
# sessions, contenttypes, axes, admin, webhooks) is read on the primary.
REPLICA_APPS = frozenset({"payments", "ledger"})
# libpq's own minimum; a URL's connect_timeout wins (delaypay/settings.py).
CONNECT_TIMEOUT_SECONDS = 2


# --- Per-request routing ---------------------------------------------------------------


class ReadRouting:
    """Where one request's routed reads go: undecided until its first routed read."""

    def __init__(self, request):
        self.request = request
        self.eligible = False  # set by the middleware for GET/HEAD of an API read view
        self.database: str | None = None

    def database_for_read(self) -> str:
        if self.database is None:
            self.database, reason = self._decide()
            metrics.api_reads_total.labels(database=_label(self.database), reason=reason).inc()
        return self.database

    def fall_back_to_primary(self) -> None:
        """The replica failed during this request: the rest of it (and its retry) reads the primary."""
        self.database = PRIMARY
        metrics.api_reads_total.labels(database="primary", reason="replica_error").inc()

    def _decide(self) -> tuple[str, str]:
        # DRF has put the authenticated user on the Django request by the first routed read.
        user = getattr(self.request, "user", None)
        if user is None or not user.is_authenticated:
            return PRIMARY, "anonymous"
        recent = wrote_recently(user.pk)
        if recent is None:
            return PRIMARY, "no_write_record"
        if recent:
            return PRIMARY, "recent_write"
        health = replica_monitor().health()
        if not health.usable:
            return PRIMARY, health.reason
        return REPLICA, "replica_ok"


def _label(alias: str) -> str:
    return "replica" if alias == REPLICA else "primary"


# The request's routing lives in common/routing.py (current_routing, set_routing,
# reset_routing), where the API's exception handler, below this package, can read it.


class PrimaryReplicaRouter:
    """Django's database router (settings.DATABASE_ROUTERS when a replica is configured)."""

    def db_for_read(self, model, **hints) -> str:
        routing = current_routing()
        if routing is None or not routing.eligible or model._meta.app_label not in REPLICA_APPS:
            return PRIMARY
        # Inside a transaction on the primary a read must see that transaction's own rows.
        if connections[PRIMARY].in_atomic_block:
            return PRIMARY
        return routing.database_for_read()

    def db_for_write(self, model, **hints) -> str:
        return PRIMARY

    def allow_relation(self, obj1, obj2, **hints) -> bool | None:
        # Both aliases hold the same rows: a payment read on the replica may point at a user
        # read on the primary.
        if {obj1._state.db, obj2._state.db} <= {PRIMARY, REPLICA}:
            return True
        return None

    def allow_migrate(self, db, app_label, model_name=None, **hints) -> bool:
        return db == PRIMARY


# --- Read-your-writes --------------------------------------------------------------------
#
# The record of a user's last write lives in Django's cache (Redis), shared by every web
# process and host, keyed by user: API clients authenticate with tokens and seldom keep
# cookies, and a user's other clients (another token, another device) must see the write
# too, which a cookie on one client cannot give. The key expires with the window, so the
# record costs one SET per write and one GET per routed read.


def _write_key(user_id) -> str:
    return f"read-your-writes:{user_id}"


def record_write(user_id) -> None:
    """Send the user's reads to the primary for the next DELAYPAY_READ_YOUR_WRITES_SECONDS."""
    window = settings.DELAYPAY_READ_YOUR_WRITES_SECONDS
    if window <= 0:
        return
    try:
        cache.set(_write_key(user_id), 1, timeout=math.ceil(window))
    except Exception:  # any cache failure: wrote_recently() will not answer either, so reads use the primary
        logger.warning("could not record a write for read-your-writes", exc_info=True)


def wrote_recently(user_id) -> bool | None:
    """Whether the user wrote within the window; None when the cache does not answer."""
    if settings.DELAYPAY_READ_YOUR_WRITES_SECONDS <= 0:
        return False
    try:
        return cache.get(_write_key(user_id)) is not None
    except Exception:  # Redis down: the primary is always right
        logger.warning("could not read the read-your-writes record", exc_info=True)
        return None


# --- Replica health and lag --------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaHealth:
    usable: bool
    reason: str  # replica_ok, replica_down or replica_lagging
    lag_seconds: float  # math.inf when unknown


DOWN = ReplicaHealth(usable=False, reason="replica_down", lag_seconds=math.inf)


class ReplicaMonitor:
    """A process's view of the replica, measured at most once per ``interval`` seconds.

    Lag is not ``now() - pg_last_xact_replay_timestamp()`` alone: on an idle primary that
    grows forever while the replica has everything. So positions are compared first: a
    replica that has replayed the primary's current WAL position has lag 0. Behind it, the
    lag is the smaller of two upper bounds on how stale its data is: the time since the
    newest primary position (sampled by an earlier check) the replica has replayed, and the
    time since the last transaction it replayed committed.
    """

    def __init__(self, *, max_lag: float, interval: float, history: int = 3600):
        self.max_lag = max_lag
        self.interval = interval
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._health: ReplicaHealth | None = None
        self._next_check = 0.0
        # (monotonic time, primary WAL position) of earlier checks, oldest first.
        self._samples: deque[tuple[float, int]] = deque(maxlen=history)
        self._connections: dict[str, psycopg.Connection] = {}

    def health(self) -> ReplicaHealth:
        health = self._health
        if health is not None and time.monotonic() < self._next_check:
            return health
        if not self._lock.acquire(blocking=False):
            # Another thread is checking: its last answer, or the primary until the first one.
            return health or DOWN
        try:
            if self._health is None or time.monotonic() >= self._next_check:
                self._health = self._check()
                self._next_check = time.monotonic() + self.interval
                metrics.replica_lag_seconds.set(self._health.lag_seconds)
                metrics.replica_usable.set(1 if self._health.usable else 0)
            return self._health
        finally:
            self._lock.release()

    def mark_failed(self) -> None:
        """A query on the replica failed: the primary until the next check."""
        self._health = DOWN
        self._next_check = time.monotonic() + self.interval
        metrics.replica_lag_seconds.set(math.inf)
        metrics.replica_usable.set(0)

    def _check(self) -> ReplicaHealth:
        try:
            sampled_at = time.monotonic()
            (primary_position,) = self._query(PRIMARY, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        except psycopg.Error as exc:
            logger.warning("replica check: the primary did not answer (%s)", exc)
            return DOWN
        try:
            in_recovery, replay_position, replay_age = self._query(
                REPLICA,
                "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn() - '0/0'::pg_lsn, "
                "EXTRACT(EPOCH FROM clock_timestamp() - pg_last_xact_replay_timestamp())",
            )
        except psycopg.Error as exc:
            logger.warning("replica check: the replica did not answer (%s)", exc)
            return DOWN
        if not in_recovery or replay_position is None:
            # A promoted or wrongly configured "replica" is no copy of this primary.
            logger.warning("replica check: DATABASE_REPLICA_URL is not a standby in recovery")
            return DOWN
        lag = self._lag(
            sampled_at, int(primary_position), int(replay_position), None if replay_age is None else float(replay_age)
        )
        if lag > self.max_lag:
            return ReplicaHealth(usable=False, reason="replica_lagging", lag_seconds=lag)
        return ReplicaHealth(usable=True, reason="replica_ok", lag_seconds=lag)

    def _lag(self, sampled_at: float, primary_position: int, replay_position: int, replay_age: float | None) -> float:
        self._samples.append((sampled_at, primary_position))
        if replay_position >= primary_position:
            self._samples.clear()
            self._samples.append((sampled_at, primary_position))
            return 0.0
        reached = None
        while self._samples and self._samples[0][1] <= replay_position:
            reached = self._samples.popleft()
        if reached is not None:
            self._samples.appendleft(reached)  # the newest position the replica has replayed
        since_reached = time.monotonic() - reached[0] if reached is not None else math.inf
        since_replayed_commit = max(0.0, replay_age) if replay_age is not None else math.inf
        return min(since_reached, since_replayed_commit)

    def _query(self, alias: str, statement: str):
        conn = self._connections.get(alias)
        try:
            if conn is None or conn.closed:
                conn = self._connections[alias] = self._connect(alias)
            row = conn.execute(statement).fetchone()
        except psycopg.Error:
            self._close(alias)
            raise
        return row  # a SELECT without FROM always returns one row

    def _connect(self, alias: str) -> psycopg.Connection:
        params = connections[alias].get_connection_params()
        for django_only in ("cursor_factory", "context", "prepare_threshold"):
            params.pop(django_only, None)
        params.setdefault("connect_timeout", CONNECT_TIMEOUT_SECONDS)
        params["application_name"] = "delaypay-replica-monitor"
        conn = psycopg.connect(**params, autocommit=True)
        # The checks are a few function calls: a replica that takes longer is not healthy.
        conn.execute("SET statement_timeout = '2s'")
        return conn

    def _close(self, alias: str) -> None:
        conn = self._connections.pop(alias, None)
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()


_monitor: ReplicaMonitor | None = None
_monitor_lock = threading.Lock()


def replica_monitor() -> ReplicaMonitor:
    """This process's monitor (a forked child makes its own: connections are not shared)."""
    global _monitor
    monitor = _monitor
    if monitor is None or monitor.pid != os.getpid():
        with _monitor_lock:
            if _monitor is None or _monitor.pid != os.getpid():
                _monitor = ReplicaMonitor(
                    max_lag=settings.DELAYPAY_REPLICA_MAX_LAG_SECONDS, interval=settings.DELAYPAY_REPLICA_CHECK_SECONDS
                )
            monitor = _monitor
    return monitor
