import threading
from collections.abc import Callable

from django.db import connections


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
            connections.close_all()

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
