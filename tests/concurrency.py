"""Helpers for races and for waiting on real processes (threads at a barrier, polls with a deadline)."""

import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connections


def close_thread_connections() -> None:
    """What a thread of a test opened, closed before it ends: its database connections,
    and the connections of its Redis cache (Django keeps a cache instance, with its own
    connection pool, per thread; left open, a pool's sockets are closed by the garbage
    collector at some later instant, and the ResourceWarning it raises fails whichever
    test is running then)."""
    from django.core.cache import caches

    connections.close_all()
    for cache in caches.all(initialized_only=True):
        for pool in getattr(getattr(cache, "_cache", None), "_pools", {}).values():
            pool.disconnect()


def other_session():
    """A second session to the test database, as another client's: Django's own
    ``get_new_connection`` with the default connection's parameters, in autocommit."""
    from django.db import connection

    session = connection.get_new_connection(connection.get_connection_params())
    session.autocommit = True
    return session


def run_concurrently(*calls: Callable[[], object]) -> list[object]:
    """Start every call in its own thread at the same instant (a barrier), each with its
    own database connection; return each call's result or the exception it raised."""
    with Racers(len(calls)) as racers:
        return racers.run(*calls)


class Racers:
    """A team of threads, each holding its own database connection across rounds, for
    races repeated hundreds of times: ``run(*calls)`` releases every thread at the same
    instant (a barrier) and returns each call's result or the exception it raised.
    Opening connections once keeps the rounds tight and cheap."""

    def __init__(self, size: int):
        self.size = size
        self._start = threading.Barrier(size + 1)
        self._done = threading.Barrier(size + 1)
        self._calls: list[Callable[[], object]] = []
        self._results: list[object] = [None] * size
        self._closing = False
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(size)]
        for thread in self._threads:
            thread.start()

    def _loop(self, i: int) -> None:
        try:
            while True:
                self._start.wait()
                if self._closing:
                    return
                try:
                    self._results[i] = self._calls[i]()
                except Exception as exc:
                    self._results[i] = exc
                self._done.wait()
        finally:
            close_thread_connections()

    def run(self, *calls: Callable[[], object]) -> list[object]:
        if len(calls) != self.size:
            raise ValueError(f"expected {self.size} calls, got {len(calls)}")
        self._calls = list(calls)
        self._results = [None] * self.size
        self._start.wait()
        self._done.wait(timeout=120)
        return list(self._results)

    def close(self) -> None:
        self._closing = True
        self._start.wait()
        for thread in self._threads:
            thread.join()

    def __enter__(self) -> "Racers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def wait_for_lock_waiters(count: int, timeout: float = 10.0) -> None:
    """Poll (with a deadline) until ``count`` sessions of this database wait on a lock."""
    deadline = time.monotonic() + timeout
    with connections["default"].cursor() as cur:
        while True:
            # Activity is snapshotted once per transaction; the caller may be inside one.
            cur.execute("SELECT pg_stat_clear_snapshot()")
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if cur.fetchone()[0] >= count:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {count} sessions waiting on a lock after {timeout}s")
            time.sleep(0.01)


def start_thread(call: Callable[[], object]) -> Callable[[], object]:
    """Run ``call`` in a thread with its own database connection; return a function that
    joins it and returns the call's result (or raises its exception)."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["result"] = call()
        except Exception as exc:
            outcome["error"] = exc
        finally:
            close_thread_connections()

    thread = threading.Thread(target=run)
    thread.start()

    def join() -> object:
        thread.join(timeout=30)
        assert not thread.is_alive(), "thread did not finish"
        if "error" in outcome:
            raise outcome["error"]
        return outcome["result"]

    return join


def wait_until(predicate, *, timeout: float, stack=None, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    # Stacks first: a long failure is cut in the middle by whatever shows it, and where each
    # process is stuck says more than the end of its log.
    logs = "".join(f"\n--- {name}.log ---\n{stack.log(name)[-4000:]}" for name in stack.procs) if stack else ""
    pytest.fail(f"timed out after {timeout}s waiting for {what}{python_stacks(stack) if stack else ''}{logs}")


def assert_still_running(stack, pids: dict[str, int]) -> None:
    """Fail at once if a process of the stack exited or was replaced (``pids``: name to pid
    when it started), or is about to exit: a worker whose consumer gave up ("Unrecoverable
    error") waits for its running tasks before it exits."""
    gone = {name: proc.returncode for name, proc in stack.procs.items() if proc.poll() is not None}
    gone |= {name: "exiting" for name in stack.procs if "Unrecoverable error" in stack.log(name)}
    if gone or {name: proc.pid for name, proc in stack.procs.items()} != pids:
        logs = "".join(f"\n--- {name}.log ---\n{stack.log(name)[-6000:]}" for name in gone)
        pytest.fail(f"processes exited or exiting: {gone}{logs}")


def python_stacks(stack) -> str:
    """Every thread's Python stack in each of the stack's live processes (``py-spy dump``),
    so that a wait that timed out says where each process was, not only what it logged."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        return "\n(py-spy is not installed: no stacks)"
    dumps = []
    for name, proc in stack.procs.items():
        if proc.poll() is not None:
            continue
        try:
            # The dev tool from requirements-dev.txt, on a child of this test (bandit B603).
            out = subprocess.run(  # nosec B603
                [py_spy, "dump", "--pid", str(proc.pid)], capture_output=True, text=True, timeout=30
            )
            dumps.append(f"\n--- {name} stacks ---\n{out.stdout}{out.stderr}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            dumps.append(f"\n--- {name} stacks ---\n(py-spy failed: {exc!r})")
    return "".join(dumps)
