import threading
import time
from collections.abc import Callable

from django.db import connections


def run_concurrently(*calls: Callable[[], object]) -> list[object]:
    """Start every call in its own thread at the same instant (a barrier), each with its
    own database connection; return each call's result or the exception it raised."""
    barrier = threading.Barrier(len(calls))
    results: list[object] = [None] * len(calls)

    def run(i: int, call: Callable[[], object]) -> None:
        try:
            barrier.wait()
            results[i] = call()
        except Exception as exc:
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


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
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()

    def join() -> object:
        thread.join(timeout=30)
        assert not thread.is_alive(), "thread did not finish"
        if "error" in outcome:
            raise outcome["error"]
        return outcome["result"]

    return join
