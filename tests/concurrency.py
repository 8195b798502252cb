import threading
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
