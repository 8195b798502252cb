"""A client-side deadline for PostgreSQL commands: the answer to a frozen primary.

A primary that hangs (a stopped VM, a `SIGSTOP`, a host stuck in swap) keeps its TCP
connections open: its kernel still acknowledges every packet, so neither keepalives,
``tcp_user_timeout`` nor the server's own ``statement_timeout`` ever ends a wait on it.
A worker, the promoter or a web thread sending a statement or a ``COMMIT`` then waits
forever, through the failover that promoted the standby, and its process never works
again without a restart.

Here a watchdog thread per process looks at every connection the process opened, each
``DELAYPAY_DB_COMMAND_DEADLINE_SECONDS``/4: a connection busy with one command (libpq's
transaction status ``ACTIVE``, no statement sent since the last look) for longer than the
deadline has its socket shut down. The wait ends at once with an ``OperationalError``,
which every caller already handles as a lost connection (a batch retried under its
lease, a tick run again, a 503 ``database_unavailable``), and Django's health check
replaces the connection at its next use. A command cut during ``COMMIT`` has an unknown
outcome, resolved as any lost commit is: the ledger's payment_id guard and the attempt
fence make a retry a no-op where the commit did happen.

Installed by the processes that serve (delaypay/wsgi.py, delaypay/celery.py), never by
``manage.py`` commands: a migration may legitimately run one statement for minutes, as
may the maintenance tasks (reconciliation, archival), which run ``unbounded()``. The
deadline must stay above the longest command of the money path and the console (lock
waits included; they take milliseconds to a second); 15 s by default, 0 turns it off.
"""

import contextlib
import logging
import os
import socket
import threading
import time
import weakref

from django.db.backends.signals import connection_created
from prometheus_client import Counter

logger = logging.getLogger(__name__)

commands_cut_total = Counter(
    "delaypay_db_commands_cut",
    "Database commands whose socket the client-side deadline shut down (a server that "
    "stopped answering: a frozen primary).",
)


class Watchdog:
    """Every connection of one process, and since when each has been busy with one command."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.interval = max(0.05, deadline / 4)
        self._tracked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # psycopg conn -> [statements]
        self._busy: dict[int, tuple[float, int]] = {}  # id(conn) -> (busy since, statements then)
        self._lock = threading.Lock()
        self.unbounded_threads: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def track(self, wrapper) -> None:
        """Watch a Django connection's new psycopg connection. Its statements are counted
        by one execute wrapper per Django connection (``_count``), which counts for
        whichever psycopg connection it holds, in whichever process: a reconnect adds no
        second wrapper, and a forked child counts in its own watchdog."""
        with self._lock:
            self._tracked[wrapper.connection] = [0, threading.get_ident()]
        if _count not in wrapper.execute_wrappers:
            wrapper.execute_wrappers.append(_count)

    def count(self, conn) -> None:
        counter = self._tracked.get(conn)
        if counter is not None:
            counter[0] += 1

    def check(self, now: float) -> int:
        """Shut down the socket of each connection busy with one command for longer than
        the deadline; the number cut."""
        from psycopg.pq import TransactionStatus

        cut = 0
        with self._lock:
            tracked = list(self._tracked.items())
        alive = set()
        for conn, counter in tracked:
            key = id(conn)
            alive.add(key)
            if (conn.closed or counter[1] in self.unbounded_threads
                    or conn.pgconn.transaction_status != TransactionStatus.ACTIVE):
                self._busy.pop(key, None)
                continue
            since, statements = self._busy.get(key, (now, counter[0]))
            if statements != counter[0]:  # another command since the last look
                since, statements = now, counter[0]
            self._busy[key] = (since, statements)
            if now - since > self.deadline:
                self._busy.pop(key, None)
                if shut_down(conn):
                    cut += 1
                    commands_cut_total.inc()
                    logger.warning(
                        "database command cut by the client-side deadline: the server has not answered",
                        extra={"busy_seconds": round(now - since, 1), "deadline_seconds": self.deadline},
                    )
        for key in set(self._busy) - alive:
            del self._busy[key]
        return cut

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="delaypay-db-deadline", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check(time.monotonic())
            except Exception:  # a watchdog that dies protects nothing; say so and go on
                logger.exception("the client-side database deadline's check failed")


def shut_down(conn) -> bool:
    """Shut down a psycopg connection's socket (a duplicate of its descriptor, so that
    the connection's own is closed by its owner, once, as usual)."""
    import psycopg

    with contextlib.suppress(OSError, ValueError, psycopg.Error):
        fd = conn.pgconn.socket
        sock = socket.socket(fileno=os.dup(fd))
        with contextlib.closing(sock):
            sock.shutdown(socket.SHUT_RDWR)
        return True
    return False


_installed: dict[str, object] = {}  # "deadline", "watchdog", "pid"


def _count(execute, sql, params, many, context):
    watchdog = current()
    if watchdog is not None:
        watchdog.count(context["connection"].connection)
    return execute(sql, params, many, context)


def _on_connection_created(sender, connection, **_kwargs):
    watchdog = current()
    if watchdog is not None:
        watchdog.track(connection)


def current() -> Watchdog | None:
    """This process's watchdog (a forked child gets one of its own: threads do not survive
    a fork), or None when none is installed."""
    if "deadline" not in _installed:
        return None
    if _installed.get("pid") != os.getpid():
        watchdog = Watchdog(_installed["deadline"])
        watchdog.start()
        _installed.update(watchdog=watchdog, pid=os.getpid())
    return _installed["watchdog"]


@contextlib.contextmanager
def unbounded():
    """No deadline for the connections this thread opened, while the block runs: for the
    maintenance tasks whose statements may legitimately take minutes on a large database
    (reconciliation, the partitions' archival)."""
    watchdog = current()
    if watchdog is None:
        yield
        return
    ident = threading.get_ident()
    watchdog.unbounded_threads.add(ident)
    try:
        yield
    finally:
        watchdog.unbounded_threads.discard(ident)


def install(deadline: float | None = None) -> None:
    """Watch every connection this process opens from now on (and its forked children's);
    the deadline is DELAYPAY_DB_COMMAND_DEADLINE_SECONDS unless given; 0 installs nothing."""
    if deadline is None:
        from django.conf import settings

        deadline = settings.DELAYPAY_DB_COMMAND_DEADLINE_SECONDS
    if not deadline or "deadline" in _installed:
        return
    _installed["deadline"] = deadline
    connection_created.connect(_on_connection_created, dispatch_uid="delaypay-db-deadline")


def uninstall() -> None:
    """Stop watching (the tests' clean-up)."""
    connection_created.disconnect(dispatch_uid="delaypay-db-deadline")
    watchdog = _installed.get("watchdog")
    if watchdog is not None and _installed.get("pid") == os.getpid():
        watchdog.stop()
    _installed.clear()
