"""Prometheus exposition for a host whose processes share PROMETHEUS_MULTIPROC_DIR.

In multiprocess mode every process (gunicorn workers, Celery prefork children, the
promoter) writes its counters and histograms to its own mmap file ``<type>_<pid>.db``
in that directory; a scrape sums the files. Files of dead processes must be kept (their
counts are part of the totals), but left alone they pile up with every restarted child
and every scrape reads them all. So a scrape first *compacts*: the counter, histogram
and summary files of processes that no longer exist are merged into one
``<type>_archive.db`` per type and deleted, and their ``live*`` gauge files are deleted
(prometheus_client's ``mark_process_dead``). Totals never go backwards, and the
directory holds one file per live process plus the archives.

Compaction and scrapes of the same directory exclude each other with a lock file
(exclusive to compact, shared to read). The directory must belong to one host and one
PID namespace (a tmpfs per container): liveness is judged with ``kill(pid, 0)``.
"""

import contextlib
import fcntl
import logging
import os
import re
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import REGISTRY, Collector
from prometheus_client.samples import Sample

logger = logging.getLogger(__name__)

ACCUMULATING_TYPES = ("counter", "histogram", "summary")
_PID_FILE_RE = re.compile(r"^(counter|histogram|summary|gauge_[a-z]+)_(\d+)\.db$")
LOCK_NAME = ".compaction.lock"


def multiprocess_dir() -> str | None:
    """The directory when this process runs in multiprocess mode, else None."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


@contextlib.contextmanager
def _locked(path: str, mode: int, *, blocking: bool = True):
    fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, mode | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


def dead_pids(path: str) -> set[int]:
    pids = set()
    for name in os.listdir(path):
        match = _PID_FILE_RE.match(name)
        if match and int(match.group(2)) != os.getpid():
            pids.add(int(match.group(2)))
    return {pid for pid in pids if not process_alive(pid)}


def _write_archive(target: str, files: list[str]) -> None:
    """Merge ``files`` (raw, not cumulative) into a new file and move it over ``target``."""
    tmp = f"{target}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.remove(tmp)
    merged = MultiProcessCollector.merge(files, accumulate=False)
    archive = MmapedDict(tmp)
    try:
        for metric in merged:
            for sample in metric.samples:
                key = mmap_key(metric.name, sample.name, list(sample.labels), list(sample.labels.values()),
                               metric.documentation)
                archive.write_value(key, sample.value, 0.0)
    finally:
        archive.close()
    os.replace(tmp, target)


def compact(path: str) -> int:
    """Fold the files of dead processes into the archives. Returns how many processes
    were folded; 0 when another process is compacting right now."""
    with _locked(path, fcntl.LOCK_EX, blocking=False) as acquired:
        if not acquired:
            return 0
        dead = dead_pids(path)
        if not dead:
            return 0
        for typ in ACCUMULATING_TYPES:
            files = [os.path.join(path, f"{typ}_{pid}.db") for pid in sorted(dead)]
            files = [f for f in files if os.path.exists(f)]
            if not files:
                continue
            archive = os.path.join(path, f"{typ}_archive.db")
            _write_archive(archive, ([archive] if os.path.exists(archive) else []) + files)
            # A crash exactly here would count these files twice; the window is one unlink.
            for f in files:
                os.remove(f)
        for pid in dead:
            mark_process_dead(pid, path)
        logger.debug("folded the metrics of %d dead processes", len(dead), extra={"pids": sorted(dead)})
        return len(dead)


class CompactingMultiProcessCollector(MultiProcessCollector):
    """MultiProcessCollector that compacts dead processes' files before reading."""

    def collect(self):
        compact(self._path)
        with _locked(self._path, fcntl.LOCK_SH):
            return list(super().collect())


def registry_for_host(extra: Iterable[Collector] = ()) -> CollectorRegistry:
    """A registry with every process of this host (multiprocess mode) or this process's
    own metrics (single-process mode), plus ``extra`` collectors."""
    path = multiprocess_dir()
    if path:
        registry = CollectorRegistry()
        CompactingMultiProcessCollector(registry, path=path)
    else:
        registry = CollectorRegistry()
        registry.register(_DefaultRegistryCollector())
    for collector in extra:
        registry.register(collector)
    return registry


class _DefaultRegistryCollector(Collector):
    """Single-process mode: everything in the default registry (incl. process metrics)."""

    def collect(self):
        return REGISTRY.collect()


def host_samples(families: Iterable[str]) -> list[Sample]:
    """The samples of the named metric families summed over this host's processes, as
    /metrics exports them (multiprocess mode), or this process's own (single-process)."""
    wanted = set(families)
    path = multiprocess_dir()
    if path:
        with _locked(path, fcntl.LOCK_SH):
            found = list(MultiProcessCollector(None, path=path).collect())
    else:
        found = list(REGISTRY.collect())
    return [sample for family in found if family.name in wanted for sample in family.samples]


def render(extra: Iterable[Collector] = ()) -> bytes:
    """The exposition text for this host's processes and ``extra``."""
    return generate_latest(registry_for_host(extra))
