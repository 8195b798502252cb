"""Private PostgreSQL and Redis instances for the fault-injection run.

The chaos run crashes and restarts its database and its broker, so it never uses the
machine's shared ones: it creates a Debian PostgreSQL cluster of its own (the
``pg_createcluster``/``pg_ctlcluster`` wrappers run the server as the postgres user,
which PostgreSQL requires) and a ``redis-server`` child process, each on a free
private port, and removes both afterwards.
"""

import getpass
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psycopg
from psycopg import sql


class SandboxError(RuntimeError):
    pass


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port(preferred: int, taken: set[int] = frozenset(), tries: int = 50) -> int:
    """``preferred`` if nobody listens there, else the next free port above it."""
    for port in range(preferred, preferred + tries):
        if port not in taken and port_is_free(port):
            return port
    raise SandboxError(f"no free port in {preferred}..{preferred + tries - 1}")


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise SandboxError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def wait_for(predicate, *, timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise SandboxError(f"timed out after {timeout}s waiting for {what}")


class PrivatePostgres:
    """A throwaway Debian cluster ``<version>/<name>`` on 127.0.0.1:<port>, trust auth."""

    def __init__(self, *, name: str, port: int, database: str, settings: dict[str, str] | None = None):
        self.name = name
        self.settings = settings or {}
        self.port = port
        self.database = database
        self.user = getpass.getuser()
        self.version = self._newest_version()
        self.created = False

    @staticmethod
    def _newest_version() -> str:
        versions = [v for v in os.listdir("/usr/lib/postgresql") if re.fullmatch(r"\d+", v)]
        if not versions:
            raise SandboxError("no PostgreSQL server installed under /usr/lib/postgresql")
        return max(versions, key=int)

    @staticmethod
    def clusters() -> list[tuple[str, str, int]]:
        """(version, name, port) of every cluster on this machine."""
        out = _run("pg_lsclusters", "--no-header").stdout
        return [(f[0], f[1], int(f[2])) for f in (line.split() for line in out.splitlines()) if len(f) >= 3]

    def exists(self) -> bool:
        return any(v == self.version and n == self.name for v, n, _ in self.clusters())

    def _ctl(self, action: str, *extra: str) -> None:
        _run("pg_ctlcluster", "--skip-systemctl-redirect", self.version, self.name, action, *extra)

    @property
    def _owner_file(self) -> Path:
        return Path("/etc/postgresql") / self.version / self.name / "delaypay-chaos.pid"

    def _owner_alive(self) -> bool:
        try:
            os.kill(int(self._owner_file.read_text()), 0)
        except (OSError, ValueError):
            return False
        return True

    def create(self) -> None:
        if self.exists():
            if self._owner_alive():
                raise SandboxError(
                    f"cluster {self.version}/{self.name} belongs to a chaos run still in progress "
                    f"(pid {self._owner_file.read_text().strip()}); choose another --cluster"
                )
            # Left behind by a run that was killed before its cleanup: ours by name.
            self.drop()
        _run(
            "pg_createcluster", self.version, self.name, "-p", str(self.port),
            # A crashed *process* loses nothing with fsync off (the OS keeps its page
            # cache); only a power loss would. This run crashes processes, not machines.
            "-o", "fsync=off",
            "-o", "max_connections=200",
            *[arg for key, value in self.settings.items() for arg in ("-o", f"{key}={value}")],
            "--", "--auth=trust",
        )
        self.created = True
        self._owner_file.write_text(str(os.getpid()))
        self.start()
        with psycopg.connect(self._dsn(user="postgres", dbname="postgres"), autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [self.user]).fetchone():
                conn.execute(sql.SQL("CREATE ROLE {} SUPERUSER LOGIN").format(sql.Identifier(self.user)))
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(self.database), sql.Identifier(self.user))
            )

    @property
    def dsn(self) -> str:
        return self._dsn(user=self.user, dbname=self.database)

    def _dsn(self, *, user: str, dbname: str) -> str:
        return f"host=127.0.0.1 port={self.port} user={user} dbname={dbname} connect_timeout=2"

    def is_up(self) -> bool:
        try:
            with psycopg.connect(self._dsn(user="postgres", dbname="postgres")) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def start(self) -> None:
        self._ctl("start")
        wait_for(self.is_up, timeout=60, what=f"PostgreSQL {self.version}/{self.name} to accept connections")

    def crash(self) -> None:
        """Stop with ``-m immediate``: every backend dies at once, no checkpoint; the
        next start replays the WAL, exactly as after a crash."""
        self._ctl("stop", "-m", "immediate")

    def drop(self) -> None:
        _run("pg_dropcluster", "--stop", self.version, self.name, check=False)
        self.created = False

    def settings_overrides(self) -> dict:
        """What to put into Django's DATABASES["default"] to use this cluster."""
        # Trust authentication on a private loopback cluster: no password (bandit B105).
        db = {"NAME": self.database, "HOST": "127.0.0.1", "PORT": str(self.port), "USER": self.user}
        return {**db, "PASSWORD": ""}  # nosec B105


def server_bindir() -> Path:
    """The PostgreSQL server programs: pg_config's bindir, else the newest under
    /usr/lib/postgresql; SandboxError when there are none (initdb, pg_basebackup)."""
    candidates = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False).stdout.strip()
        if out:
            candidates.append(Path(out))
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), reverse=True)
    for candidate in candidates:
        if (candidate / "initdb").exists() and (candidate / "pg_basebackup").exists():
            return candidate
    raise SandboxError("no PostgreSQL server programs (initdb, pg_basebackup) on this machine")


def as_postgres(*command: str) -> list[str]:
    """``command`` as the postgres user when we are root: PostgreSQL's programs refuse root."""
    return [*(["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []), *command]


class DataCluster:
    """One PostgreSQL data directory and the server running on it (``pg_ctl``), for what a
    Debian cluster cannot be: a primary of our own configuration, a streaming standby."""

    def __init__(self, *, bindir: Path, directory: Path, port: int, database: str = "delaypay", user: str = "root"):
        self.bindir = bindir
        self.directory = directory
        self.port = port
        self.database = database
        self.user = user
        self.log = directory.parent / f"{directory.name}.log"

    def run(self, program: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            as_postgres(str(self.bindir / program), *args),
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout, check=False,
        )
        if proc.returncode != 0:
            raise SandboxError(f"{program} {' '.join(args)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc

    def configure(self, **parameters) -> None:
        with open(self.directory / "postgresql.conf", "a") as conf:
            for name, value in parameters.items():
                conf.write(f"{name} = '{value}'\n")

    def start(self) -> None:
        self.run("pg_ctl", "-D", str(self.directory), "-l", str(self.log), "-w", "-t", "60", "start")
        wait_for(self.answers, timeout=30, what=f"PostgreSQL on port {self.port}")

    def stop(self, mode: str = "fast") -> None:
        self.run("pg_ctl", "-D", str(self.directory), "-m", mode, "-w", "-t", "60", "stop")

    def running(self) -> bool:
        proc = subprocess.run(as_postgres(str(self.bindir / "pg_ctl"), "-D", str(self.directory), "status"),
                              capture_output=True, stdin=subprocess.DEVNULL, check=False)
        return proc.returncode == 0

    def dsn(self, dbname: str | None = None) -> str:
        return f"host=127.0.0.1 port={self.port} user={self.user} dbname={dbname or self.database} connect_timeout=2"

    def url(self) -> str:
        return f"postgres://{self.user}@127.0.0.1:{self.port}/{self.database}"

    def answers(self) -> bool:
        try:
            with psycopg.connect(self.dsn("postgres")) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def execute(self, statement: str, params=None, dbname: str | None = None):
        with psycopg.connect(self.dsn(dbname), autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else None


class PrivateRedis:
    """A ``redis-server`` child with no persistence: a restart throws every message away."""

    def __init__(self, *, port: int, directory: Path):
        self.port = port
        self.directory = Path(directory)
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def is_up(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        if self.running:
            raise SandboxError("redis-server is already running")
        self.directory.mkdir(parents=True, exist_ok=True)
        if self._log is None:
            self._log = open(self.directory / "redis.log", "ab")
        # redis-server from PATH, as the Makefile starts it (bandit B607).
        self.proc = subprocess.Popen(  # nosec B607
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory)],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        wait_for(self.is_up, timeout=20, what=f"redis-server on port {self.port}")

    def crash(self) -> None:
        """SIGKILL: the server and every queued or unacknowledged message are gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        self.crash()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "PrivateRedis":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
