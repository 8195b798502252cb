"""CPU seconds spent by each kind of process during a drain: the per-payment costs the
capacity model (devtools/capacity.py, docs/explanation/capacity.md) is built from.

``CpuMeter.start()`` reads the user + system CPU time of every process of the Stack
(each a tree: a Celery worker is its parent and its prefork children) and of the
PostgreSQL server processes: the backends connected to the benchmark's database
(``postgres: <cluster>: <user> <database> ...``) as ``postgres``, and the server's own
processes (WAL writer, checkpointer, background writer, autovacuum, the WAL sender)
as ``postgres_background``. ``stop()`` reads them again and returns the difference per
kind. A process that started after ``start()`` counts from zero; one that ended before
``stop()`` is lost (the benchmark's processes live for the whole drain; the backends are
pooled, CONN_MAX_AGE).
"""

from collections.abc import Callable, Mapping

from .rss import process_type, psutil_module, tree

BACKGROUND = ("walwriter", "checkpointer", "background writer", "autovacuum", "walsender", "logical replication")


def cpu_seconds(proc) -> float:
    """User + system CPU seconds of one psutil process."""
    times = proc.cpu_times()
    return times.user + times.system


def postgres_processes(database: str) -> dict[int, str]:
    """pid -> ``postgres`` (a backend of ``database``) or ``postgres_background``. A
    backend's title is ``postgres: <cluster>: <user> <database> <client> <state>``."""
    psutil = psutil_module()
    found: dict[int, str] = {}
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            if proc.info["name"] != "postgres":
                continue
            title = " ".join(word for word in proc.info["cmdline"] or [] if word)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        words = title.split()
        if words[:1] != ["postgres:"]:
            continue  # the postmaster
        if len(words) > 3 and words[3] == database:
            found[proc.pid] = "postgres"
        elif any(name in title for name in BACKGROUND):
            found[proc.pid] = "postgres_background"
    return found


class CpuMeter:
    """CPU seconds per process kind between ``start()`` and ``stop()``."""

    def __init__(self, pids: Callable[[], Mapping[str, int]], *, database: str):
        self.pids = pids
        self.database = database
        self.before: dict[int, tuple[str, float]] = {}

    def read(self) -> dict[int, tuple[str, float]]:
        psutil = psutil_module()
        out: dict[int, tuple[str, float]] = {}
        for name, pid in self.pids().items():
            for proc in tree(pid):
                try:
                    out[proc.pid] = (process_type(name), cpu_seconds(proc))
                except psutil.NoSuchProcess:
                    continue
        for pid, kind in postgres_processes(self.database).items():
            try:
                out[pid] = (kind, cpu_seconds(psutil.Process(pid)))
            except psutil.NoSuchProcess:
                continue
        return out

    def start(self) -> "CpuMeter":
        self.before = self.read()
        return self

    def stop(self) -> dict[str, float]:
        """CPU seconds per kind (``worker``, ``promoter``, ``beat``, ``postgres``, ...)."""
        spent: dict[str, float] = {}
        for pid, (kind, now) in self.read().items():
            _, then = self.before.get(pid, (kind, 0.0))
            spent[kind] = spent.get(kind, 0.0) + max(0.0, now - then)
        return {kind: round(seconds, 3) for kind, seconds in sorted(spent.items())}
