"""Resident memory of the Stack's processes, per process type.

A Celery worker is a process tree (the parent and its prefork children), so every
figure covers the whole tree: the parent found by its pid plus all its descendants.
``peak_rss_mb`` is the largest sum over all trees of one type seen at any sample;
``peak_rss_mb_per_process`` the largest single process (its own VmHWM, the kernel's
high-water mark, so a spike between two samples is not missed). RSS counts pages
shared between a parent and its forked children once per process, so a tree's sum
overstates what it costs the machine.
"""

import re
import threading
from collections.abc import Callable, Mapping

MB = 2**20


def process_type(name: str) -> str:
    """``worker3`` -> ``worker``: the Stack names processes by type plus a number."""
    return re.sub(r"\d+$", "", name)


def psutil_module():
    try:
        import psutil
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("the benchmark needs psutil: pip install -r requirements-dev.txt") from exc
    return psutil


def tree(pid: int) -> list:
    """The process ``pid`` and all its descendants (psutil.Process objects)."""
    psutil = psutil_module()
    try:
        parent = psutil.Process(pid)
        return [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def vm_hwm_bytes(pid: int) -> int:
    """The kernel's peak resident set size of one process (VmHWM), 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def snapshot(pids: Mapping[str, int]) -> dict[str, dict]:
    """Current RSS per process type: ``{type: {"rss_mb", "processes"}}``."""
    psutil = psutil_module()
    out: dict[str, dict] = {}
    for name, pid in pids.items():
        entry = out.setdefault(process_type(name), {"rss_mb": 0.0, "processes": 0})
        for proc in tree(pid):
            try:
                rss = proc.memory_info().rss / MB
            except psutil.NoSuchProcess:
                continue
            entry["rss_mb"] += rss
            entry["processes"] += 1
    return out


class RssSampler:
    """Sample the trees of ``pids()`` every ``interval`` seconds in a daemon thread."""

    def __init__(self, pids: Callable[[], Mapping[str, int]], *, interval: float = 0.5):
        self.pids = pids
        self.interval = interval
        self.peak_total: dict[str, float] = {}
        self.peak_process: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def sample(self) -> None:
        """One walk of every tree: each type's total RSS now, and each process's peak."""
        psutil = psutil_module()
        totals: dict[str, float] = {}
        for name, pid in self.pids().items():
            kind = process_type(name)
            totals.setdefault(kind, 0.0)
            for proc in tree(pid):
                try:
                    rss = proc.memory_info().rss
                except psutil.NoSuchProcess:
                    continue
                totals[kind] += rss / MB
                peak = max(vm_hwm_bytes(proc.pid), rss) / MB
                self.peak_process[kind] = max(self.peak_process.get(kind, 0.0), peak)
        for kind, total in totals.items():
            self.peak_total[kind] = max(self.peak_total.get(kind, 0.0), total)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def start(self) -> "RssSampler":
        self._thread.start()
        return self

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sample()
        return self.result()

    def result(self) -> dict:
        return {
            "peak_rss_mb": {k: round(v, 1) for k, v in sorted(self.peak_total.items())},
            "peak_rss_mb_per_process": {k: round(v, 1) for k, v in sorted(self.peak_process.items())},
        }
