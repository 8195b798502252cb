"""Where a worker's time goes: py-spy around the worker trees, and a summary of it.

``py-spy record --subprocesses --idle --format raw`` samples the worker parent and its
prefork children; ``--idle`` keeps samples of threads waiting (on PostgreSQL, on the
broker), so the profile is of wall-clock time, not only CPU. The raw output is
"collapsed stacks" (``frame;frame;frame count``), which ``summarize`` folds into the
share of samples that pass through each function (inclusive) and that end in it (self).
"""

import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path


def py_spy() -> str:
    beside_python = Path(sys.executable).parent / "py-spy"
    binary = str(beside_python) if beside_python.exists() else shutil.which("py-spy")
    if binary is None:
        raise RuntimeError("--profile needs py-spy: pip install -r requirements-dev.txt")
    return binary


class Profiler:
    """One ``py-spy record`` per worker tree, from ``start()`` until ``stop()``."""

    def __init__(self, pids: dict[str, int], out_dir: Path, *, rate: int = 50):
        self.pids = pids
        self.out_dir = Path(out_dir)
        self.rate = rate
        self.procs: dict[str, subprocess.Popen] = {}

    def path(self, name: str) -> Path:
        return self.out_dir / f"profile-{name}.txt"

    def start(self) -> "Profiler":
        binary = py_spy()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for name, pid in self.pids.items():
            log = open(self.out_dir / f"py-spy-{name}.log", "wb")
            self.procs[name] = subprocess.Popen(
                [binary, "record", "--pid", str(pid), "--subprocesses", "--idle", "--nonblocking",
                 "--rate", str(self.rate), "--format", "raw", "--output", str(self.path(name))],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
            log.close()
        return self

    def stop(self) -> list[Path]:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        for proc in self.procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        return [self.path(name) for name in self.procs if self.path(name).exists()]


def parse_collapsed(text: str) -> Counter:
    """``frame;frame;...;frame count`` lines -> Counter of stack tuples."""
    stacks: Counter = Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks[tuple(stack.split(";"))] += int(count)
    return stacks


def _label(frame: str) -> str:
    """``execute_batch (payments/execution.py:123)`` -> ``execute_batch (payments/execution.py)``;
    library paths are cut to the part after ``site-packages/``."""
    head, _, location = frame.partition(" (")
    if not location:
        return head
    path = location.rstrip(")").rsplit(":", 1)[0]
    if "site-packages/" in path:
        path = path.split("site-packages/", 1)[1]
    elif "/lib/python3" in path:
        path = path.split("/lib/python3", 1)[1].split("/", 1)[-1]
    return f"{head} ({path})"


OWN_CODE = ("payments/", "ledger/")


def _own_line(frame: str) -> str | None:
    """``execute_batch (/x/payments/execution.py:164)`` -> ``payments/execution.py:164 execute_batch``."""
    head, _, location = frame.partition(" (")
    path = location.rstrip(")")
    if "site-packages" in path:
        return None
    for root in OWN_CODE:
        if path.startswith(root):
            return f"{path} {head}"
        if f"/{root}" in path:
            return f"{root}{path.split('/' + root, 1)[1]} {head}"
    return None


def summarize(stacks: Counter, *, top: int = 25, only: str = "execute_batch (") -> dict:
    """Where the samples inside a task went.

    Only the part of each stack from the first frame matching ``only`` (the Celery task
    function) down is counted. ``inclusive``: share of those samples with the function
    anywhere on the stack; ``self``: share ending in it; ``lines``: share by the deepest
    line of delaypay's own code (which statement the worker was waiting on).
    """
    inclusive: Counter = Counter()
    self_time: Counter = Counter()
    lines: Counter = Counter()
    total = 0
    for stack, n in stacks.items():
        start = next((i for i, frame in enumerate(stack) if only in frame and "tasks.py" in frame), None)
        if start is None:
            continue
        frames = stack[start:]
        total += n
        labels = [_label(f) for f in frames]
        for label in set(labels):
            inclusive[label] += n
        self_time[labels[-1]] += n
        own = [line for line in (_own_line(f) for f in frames) if line]
        if own:
            # The caller tells apart a shared helper's uses (the ledger's unlocked preview
            # and its locking post both run _decide).
            caller = f" <- {own[-2].split(' ', 1)[1]}" if len(own) > 1 else ""
            lines[own[-1] + caller] += n

    def shares(counter: Counter) -> list[tuple[str, float]]:
        return [(label, round(100 * n / total, 1)) for label, n in counter.most_common(top)] if total else []

    return {
        "samples": sum(stacks.values()),
        "task_samples": total,
        "inclusive": shares(inclusive),
        "self": shares(self_time),
        "lines": shares(lines),
    }
