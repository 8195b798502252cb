"""Start and stop the real delaypay processes (worker, promoter, beat) as children.

Used by the end-to-end tests, the benchmark and the fault-injection run, so that all
three drive the system exactly as the Procfile does.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

from django.conf import settings
from django.db import connection

BASE_DIR = Path(settings.BASE_DIR)


def procfile(base_dir: Path = BASE_DIR) -> dict[str, str]:
    """The Procfile's process types and their command lines."""
    lines = (base_dir / "Procfile").read_text().splitlines()
    return dict(line.split(":", 1) for line in lines if line.strip() and not line.startswith("#"))


def database_url(db_settings: dict | None = None) -> str:
    """A DATABASE_URL for the database this process is connected to (the test database
    inside a test)."""
    db = db_settings or connection.settings_dict
    user = quote(db.get("USER") or "", safe="")
    password = quote(db.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = db.get("HOST") or "127.0.0.1"
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{quote(db['NAME'], safe='')}"


def stop_children_on_sigterm() -> None:
    """Make SIGTERM a KeyboardInterrupt, as Ctrl-C is (SIGINT too, also when a script
    started this process with SIGINT ignored, as it does a background job), so that the
    ``finally`` that stops a Stack's children runs: they live in sessions of their own
    and would outlive a parent killed any other way, still consuming from its Redis.
    The first signal wins: later ones are ignored, so that a second SIGTERM (``timeout``
    forwards its own to the child it runs) cannot cut the teardown short; SIGKILL still
    stops it."""

    def interrupted(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)


class Stack:
    """A set of delaypay processes sharing one environment and one log directory."""

    def __init__(self, log_dir: Path, *, env: dict[str, str] | None = None, base_dir: Path = BASE_DIR):
        """``base_dir``: the code the processes run, by default this checkout's; another
        release's source tree runs that release (its Procfile, its packages first on the
        path), as a rolling deploy does."""
        self.base_dir = Path(base_dir)
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "delaypay.settings",
            "DATABASE_URL": database_url(),
            "REDIS_URL": settings.REDIS_URL,
            # A sentinel:// REDIS_URL is read with these (common/redis_url.py).
            "DELAYPAY_REDIS_SENTINEL_MASTER": settings.DELAYPAY_REDIS_SENTINEL_MASTER,
            "DELAYPAY_REDIS_SENTINEL_PASSWORD": settings.DELAYPAY_REDIS_SENTINEL_PASSWORD,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
            **({"PYTHONPATH": str(self.base_dir)} if self.base_dir != BASE_DIR else {}),
            **(env or {}),
        }
        self.procs: dict[str, subprocess.Popen] = {}
        self._logs: list = []

    def _spawn(
        self, name: str, kind: str, env: dict[str, str] | None = None, extra_args: str = "", *, loopback: bool = False
    ) -> subprocess.Popen:
        """Run the Procfile's ``kind`` line (plus ``extra_args``) under the name ``name``;
        ``loopback``: bound to 127.0.0.1 instead of every address."""
        if name in self.procs and self.procs[name].poll() is None:
            raise RuntimeError(f"{name} is already running")
        command = procfile(self.base_dir)[kind]
        if loopback:
            command = command.replace("0.0.0.0", "127.0.0.1")  # nosec B104: replacing it, not binding it
        log = open(self.log_dir / f"{name}.log", "ab")
        self._logs.append(log)
        # The Procfile's line through sh, as a platform runs it (bandit B607: sh from PATH).
        proc = subprocess.Popen(  # nosec B607
            ["sh", "-c", f"exec {command} {extra_args}".rstrip()],
            cwd=self.base_dir,
            # application_name in pg_stat_activity: which process holds which transaction.
            env={**self.env, "PGAPPNAME": name, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def start_worker(self, name: str = "worker", *, concurrency: int = 2, extra_args: str = "") -> subprocess.Popen:
        return self._spawn(
            name, "worker", {"WORKER_NAME": name, "WORKER_CONCURRENCY": str(concurrency)}, extra_args
        )

    def start_promoter(self, name: str = "promoter") -> subprocess.Popen:
        return self._spawn(name, "promoter", {"PROMOTER_NAME": name})

    def start_webhooks(self, name: str = "webhooks", *, concurrency: int = 8) -> subprocess.Popen:
        """The webhook dispatcher (webhooks/dispatcher.py): a thread-pool worker on its own queue."""
        return self._spawn(name, "webhooks", {"WEBHOOKS_NAME": name, "WEBHOOK_CONCURRENCY": str(concurrency)})

    def start_payouts(self, name: str = "payouts", *, concurrency: int = 2) -> subprocess.Popen:
        """The payout executor (payouts/executor.py): prefork children on the payouts queue,
        each calling its rail from a thread pool."""
        return self._spawn(name, "payouts", {"PAYOUTS_NAME": name, "PAYOUT_CONCURRENCY": str(concurrency)})

    def start_gateway(self, port: int, name: str = "gateway") -> subprocess.Popen:
        """The sandbox gateway (rails/sandbox.py) on ``port``, its storage in the log directory."""
        return self._spawn(name, "gateway", {"GATEWAY_PORT": str(port), "GATEWAY_DB": str(self.log_dir / f"{name}.db")})

    def start_web(self, port: int, name: str = "web", *, env: dict[str, str] | None = None) -> subprocess.Popen:
        """The web process (gunicorn, one worker) on 127.0.0.1:``port``."""
        return self._spawn(name, "web", {"PORT": str(port), "WEB_CONCURRENCY": "1", **(env or {})}, loopback=True)

    def start_beat(self, name: str = "beat") -> subprocess.Popen:
        return self._spawn(name, "beat", {"DELAYPAY_BEAT_SCHEDULE_FILE": str(self.log_dir / f"{name}-schedule")})

    def start_all(self, *, workers: int = 1, concurrency: int = 2) -> None:
        for i in range(workers):
            self.start_worker(f"worker{i + 1}", concurrency=concurrency)
        self.start_promoter()
        self.start_beat()

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal a process's whole group (the parent and its prefork children)."""
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                proc.wait(timeout=30)

    def log(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_ready(self, names: list[str], *, timeout: float = 90.0) -> None:
        """Wait until each Celery process has logged that it is ready (beat: that it
        started); RuntimeError at once if one exits, or after ``timeout``."""
        deadline = time.monotonic() + timeout
        pending = list(names)
        while pending:
            for name in list(pending):
                log = self.log(name)
                if (" ready." in log) or (name.startswith("beat") and "beat: Starting" in log):
                    pending.remove(name)
                elif self.procs[name].poll() is not None:
                    raise RuntimeError(f"{name} exited during start-up:\n{log[-3000:]}")
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"{pending} not ready after {timeout}s; logs in {self.log_dir}")
            time.sleep(0.2)

    def stop(self, timeout: float = 15.0) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)
        for log in self._logs:
            log.close()
        self._logs.clear()
