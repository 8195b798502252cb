"""A pg_auto_failover cluster and a Redis Sentinel set on loopback (devtools/ha.py), one of
each per test module, stopped and removed at the end even when a test fails.

These tests kill and freeze servers for minutes of wall time: they run when selected with
``-m ha`` (``make test-ha``) and are skipped otherwise, and they skip, saying why, where
Debian's packages are missing (``make ha-packages`` installs them as root).
"""

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from devtools import ha
from devtools.sandbox import port_is_free

BASE_DIR = Path(__file__).resolve().parents[2]
# A statement the server does not answer within this is abandoned (its socket shut down):
# a frozen server's kernel keeps the connection open, so nothing else would end the wait.
STATEMENT_WATCHDOG = 2.0


def pytest_collection_modifyitems(config, items):
    if re.search(r"\bha\b", config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="the failover tests run when selected: `make test-ha` (pytest -m ha tests/ha)")
    for item in items:
        if item.get_closest_marker("ha"):
            item.add_marker(skip)


def require(program: str, package: str) -> None:
    if shutil.which(program) is None:
        pytest.skip(f"{program} is not installed (Debian's {package}): `make ha-packages` as root installs it")


def free_base_port(preferred: int, count: int) -> int:
    """The first port from ``preferred`` up (within 56000-56999) with ``count`` free ports."""
    for base in range(preferred, 56999 - count, count):
        if all(port_is_free(port) for port in range(base, base + count)):
            return base
    raise RuntimeError(f"no {count} free ports from {preferred}")


def private_directory(prefix: str) -> Path:
    """Under /tmp, not pytest's tmp_path: the postgres user must be able to reach it."""
    return Path(tempfile.mkdtemp(prefix=prefix))


def run_devtools(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "devtools.ha", *args], cwd=BASE_DIR, capture_output=True, text=True,
        stdin=subprocess.DEVNULL, timeout=timeout, check=False,
    )


@dataclass
class Cluster:
    directory: Path
    base_port: int
    url: str

    @property
    def layout(self) -> ha.Layout:
        return ha.Layout(self.directory, self.base_port)

    def node_dsn(self, node: str) -> str:
        return self.layout.dsn(self.layout.port(node))

    def heal(self) -> None:
        """Start again what a test killed and wait until a primary and a secondary are in sync."""
        for args in (("resume", "--dir", str(self.directory)),
                     ("up", "--dir", str(self.directory), "--base-port", str(self.base_port))):
            done = run_devtools(*args)
            assert done.returncode == 0, done.stderr[-3000:]


@contextlib.contextmanager
def started(up: str, down: str, variable: str, *, ports: int, preferred_port: int):
    """``python -m devtools.ha <up>`` in a new directory, which must print one line
    ``<variable>=<url>``; (directory, base port, url); ``<down>`` and removal at the end.
    Our ports lie in the kernel's ephemeral range: a client socket of another process may
    take one between our check and the server's bind, so a second range is tried."""
    for attempt in (1, 2):
        directory = private_directory(f"delaypay-{up}-")
        base_port = free_base_port(preferred_port, ports)
        done = run_devtools(up, "--dir", str(directory), "--base-port", str(base_port))
        if done.returncode == 0 or attempt == 2:
            break
        stop(down, directory)
        preferred_port = base_port + ports
    try:
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.count("\n") == 1 and done.stdout.startswith(f"{variable}="), done.stdout
        yield directory, base_port, done.stdout.strip().removeprefix(f"{variable}=")
    finally:
        stop(down, directory)


def stop(down: str, directory: Path) -> None:
    stopped = run_devtools(down, "--dir", str(directory))
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    shutil.rmtree(directory, ignore_errors=True)


@dataclass
class RedisSet:
    """A Redis master, its replica and three sentinels (devtools.ha redis-up)."""

    directory: Path
    base_port: int
    url: str  # the sentinels' URL, kombu's form

    @property
    def layout(self) -> ha.RedisLayout:
        return ha.RedisLayout(self.directory, self.base_port)

    def heal(self) -> None:
        """Start again what a test killed (it returns as a replica of the current master)
        and wait until the sentinels agree on a master and a healthy replica."""
        done = run_devtools("redis-up", "--dir", str(self.directory), "--base-port", str(self.base_port))
        assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def redis_set(request):
    """A Redis set for the module, on five ports from the module's ``REDIS_BASE_PORT`` up
    (each module its own range, so that two modules never race for the same ports);
    stopped and removed at the end."""
    require("redis-server", "redis-server")
    with started("redis-up", "redis-down", "REDIS_SENTINEL_URL", ports=5,
                 preferred_port=request.module.REDIS_BASE_PORT) as (directory, base_port, url):
        yield RedisSet(directory, base_port, url)


@pytest.fixture(scope="module")
def pg_cluster():
    require("pg_autoctl", "postgresql-15-auto-failover")
    with started("up", "down", "DATABASE_URL", ports=3, preferred_port=56600) as (directory, base_port, url):
        yield Cluster(directory, base_port, url)


@pytest.fixture
def cluster(pg_cluster):
    """The module's cluster, healthy: a primary and a secondary in sync."""
    pg_cluster.heal()
    return pg_cluster


@dataclass
class Ack:
    seq: int
    sent: float  # time.monotonic() when the INSERT was sent
    at: float  # and when its commit returned
    port: int  # the server that acknowledged it


@dataclass
class Writer:
    """A client committing one row at a time through ``url``, reconnecting after any error,
    as the product's processes must: what it saw acknowledged is what must survive."""

    url: str
    table: str
    acks: list[Ack] = field(default_factory=list)
    errors: list[tuple[float, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self):
        self.thread = threading.Thread(target=self.run, name=f"writer-{self.table}", daemon=True)
        self.watchdog = Watchdog()

    def start(self) -> "Writer":
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {self.table} (seq int PRIMARY KEY, port int NOT NULL)")
        self.thread.start()
        self.watchdog.start()
        return self

    def run(self) -> None:
        seq, conn = 0, None
        while not self.stop.is_set():
            try:
                if conn is None:
                    conn = psycopg.connect(self.url, autocommit=True, connect_timeout=2)
                seq += 1
                sent = time.monotonic()
                with self.watchdog.watching(conn):
                    port = conn.execute(
                        f"INSERT INTO {self.table} (seq, port) VALUES (%s, inet_server_port()) RETURNING port", [seq]
                    ).fetchone()[0]
                self.acks.append(Ack(seq, sent, time.monotonic(), port))
            except psycopg.Error as exc:
                self.errors.append((time.monotonic(), f"{type(exc).__name__}: {str(exc)[:200]}"))
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                conn = None
                self.stop.wait(0.1)
        if conn is not None:
            conn.close()

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        self.watchdog.stop.set()
        self.watchdog.thread.join(timeout=5)

    def acked_after(self, moment: float) -> Ack | None:
        """The first commit sent after ``moment`` (an answer already on its way then, read
        a moment later, does not count) and acknowledged."""
        return next((ack for ack in list(self.acks) if ack.sent > moment), None)


class Watchdog:
    """Shuts down the socket of a statement that has waited more than STATEMENT_WATCHDOG."""

    def __init__(self):
        self.current: tuple[float, psycopg.Connection] | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="watchdog", daemon=True)

    def start(self) -> None:
        self.thread.start()

    @contextlib.contextmanager
    def watching(self, conn: psycopg.Connection):
        self.current = (time.monotonic(), conn)
        try:
            yield
        finally:
            self.current = None

    def run(self) -> None:
        while not self.stop.wait(0.2):
            current = self.current
            if current is not None and time.monotonic() - current[0] > STATEMENT_WATCHDOG:
                shut_down(current[1])
                self.current = None


def shut_down(conn: psycopg.Connection) -> None:
    with contextlib.suppress(OSError, psycopg.Error):
        sock = socket.socket(fileno=os.dup(conn.fileno()))
        with contextlib.closing(sock):
            sock.shutdown(socket.SHUT_RDWR)
