"""Fresh, private resources for one benchmark run, removed at the end.

Databases are created on the configured PostgreSQL server under names starting with
``delaypay_bench_`` and dropped afterwards; Redis is a private ``redis-server`` on a
spare loopback port, so a run never touches another database or Redis number.
"""

import os
import re
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import psycopg
import redis
from django.core.management import call_command
from django.db import connection, connections
from psycopg import sql

PREFIX = "delaypay_bench_"
_NAME_OK = re.compile(r"^delaypay_bench_[a-z0-9_]{1,40}$")


def scratch_name(*parts: str) -> str:
    """``delaypay_bench_<parts>`` made of safe characters only."""
    name = PREFIX + "_".join(re.sub(r"[^a-z0-9]+", "_", p.lower()).strip("_") for p in parts if p)
    if not _NAME_OK.match(name):
        raise ValueError(f"bad scratch database name {name!r}")
    return name


def _server_params() -> dict:
    params = connection.get_connection_params()
    params["dbname"] = "postgres"
    return params


def server_version() -> str:
    """The PostgreSQL server's version, without needing the configured database to exist."""
    with psycopg.connect(**_server_params(), autocommit=True) as conn:
        return conn.execute("SHOW server_version").fetchone()[0]


def create_database(name: str) -> None:
    """Create ``name`` (dropping a leftover of the same name first)."""
    if not _NAME_OK.match(name):
        raise ValueError(f"refusing to create {name!r}: scratch names start with {PREFIX}")
    with psycopg.connect(**_server_params(), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop_database(name: str) -> None:
    """Drop a scratch database, ending any session still connected to it."""
    if not _NAME_OK.match(name):
        raise ValueError(f"refusing to drop {name!r}: only {PREFIX}* databases are dropped")
    with psycopg.connect(**_server_params(), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def switch_database(name: str) -> None:
    """Point this process's default connection at ``name`` (as Django's test runner
    does with the test database); the Stack's children inherit it via DATABASE_URL."""
    connections["default"].close()
    connection.settings_dict["NAME"] = name


@contextmanager
def fresh_database(name: str, *, keep: bool = False):
    """Create, migrate and switch to ``name``; on exit switch back and drop it."""
    original = connection.settings_dict["NAME"]
    create_database(name)
    try:
        switch_database(name)
        call_command("migrate", interactive=False, verbosity=0)
        yield name
    finally:
        switch_database(original)
        if not keep:
            drop_database(name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateRedis:
    """A throw-away ``redis-server`` on a spare loopback port (no persistence)."""

    def __init__(self, log_dir: Path):
        self.log_dir = Path(log_dir)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self) -> "PrivateRedis":
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_dir / "redis.log", "ab")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--daemonize", "no"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 15
        while True:
            try:
                client.ping()
                return self
            except redis.ConnectionError as exc:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"private redis-server did not start (see {self.log_dir / 'redis.log'})"
                    ) from exc
                time.sleep(0.05)

    def used_memory_mb(self) -> float:
        return redis.Redis.from_url(self.url).info("memory")["used_memory"] / 2**20

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "PrivateRedis":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def pg_env() -> dict[str, str]:
    """Environment for libpq command-line tools (pgbench) reaching the same server."""
    db = connection.settings_dict
    env = dict(os.environ)
    env.update({
        "PGHOST": db.get("HOST") or "127.0.0.1",
        "PGPORT": str(db.get("PORT") or 5432),
        "PGUSER": db.get("USER") or "",
    })
    if db.get("PASSWORD"):
        env["PGPASSWORD"] = db["PASSWORD"]
    return env
