"""A real streaming replica for the read-replica tests (delaypay/db_router.py).

The machine's PostgreSQL allows no replication connections (and its configuration is not
ours to change), so the session builds a pair of its own: a primary cluster (initdb into a
temporary directory, wal_level=replica, replication from 127.0.0.1 trusted) and a standby
made with ``pg_basebackup -R``, each on a free loopback port, both stopped and removed at
the end. PostgreSQL refuses to run as root: then its programs run as the postgres user.

The primary is migrated and seeded by a ``manage.py``-like subprocess; each test starts the
web process (gunicorn, as the Procfile runs it) against the pair with its own settings and
drives it over HTTP, as a client would.
"""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from devtools.chaos_replica import api_reads_in
from devtools.processes import procfile
from devtools.sandbox import DataCluster, SandboxError, pick_port, server_bindir, wait_for
from tests.conftest import worker_port

BASE_DIR = Path(settings.BASE_DIR)
DATABASE = "delaypay"


def _bindir() -> Path:
    try:
        return server_bindir()
    except SandboxError as exc:
        pytest.skip(str(exc))


@dataclass
class Pair:
    primary: DataCluster
    replica: DataCluster
    seed: dict = field(default_factory=dict)

    def replay_position(self) -> int:
        return int(self.replica.execute("SELECT pg_last_wal_replay_lsn() - '0/0'::pg_lsn")[0][0])

    def primary_position(self) -> int:
        return int(self.primary.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])

    def wait_caught_up(self, timeout: float = 20) -> None:
        target = self.primary_position()
        wait_for(lambda: self.replay_position() >= target, timeout=timeout, what="the replica to catch up")

    def pause_replay(self) -> None:
        """Stop applying WAL. "pause requested" is enough: the startup process checks it
        before applying each record, so nothing written from now on is replayed."""
        self.replica.execute("SELECT pg_wal_replay_pause()")
        assert self.replay_paused()

    def resume_replay(self) -> None:
        self.replica.execute("SELECT pg_wal_replay_resume()")

    def replay_paused(self) -> bool:
        return self.replica.execute("SELECT pg_get_wal_replay_pause_state()")[0][0] != "not paused"


# Run in a subprocess against the fixture primary: migrate, then the users, accounts,
# payments and API tokens the tests use. Prints one line "SEED <json>".
SEED = """
import json
import django
from datetime import timedelta

django.setup()
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.utils import timezone
from knox.models import AuthToken

from ledger.models import Account
from payments.services import payment_schedule

call_command("migrate", interactive=False, verbosity=0)
User = get_user_model()
seed = {}
for name in ("alice", "bob", "carol", "dave"):
    user = User.objects.create_user(username=name, password="correct-horse-battery-staple")
    seed[name] = {"token": AuthToken.objects.create(user)[1]}
    seed[name]["account"] = Account.objects.create(owner=user, name=f"{name}'s", kind=Account.Kind.USER).id
carol = User.objects.get(username="carol")
carol.is_staff = True
carol.save()
carol.user_permissions.add(Permission.objects.get(codename="view_scheduledpayment"))
for name in ("bob", "dave"):
    payment = payment_schedule(
        payer=User.objects.get(username=name), from_account_id=seed[name]["account"],
        to_account_id=seed["alice"]["account"], amount=100, execute_at=timezone.now() + timedelta(days=1),
    )
    seed[name]["payment"] = payment.id
print("SEED " + json.dumps(seed))
"""


def _base_env(**extra: str) -> dict[str, str]:
    env = {
        key: value for key, value in os.environ.items()
        if not key.startswith(("DATABASE_", "DELAYPAY_", "DJANGO_", "PROMETHEUS_"))
    }
    return {
        **env,
        "DJANGO_SETTINGS_MODULE": "delaypay.settings",
        "DJANGO_DEBUG": "1",
        "DJANGO_SECRET_KEY": "dev",
        "REDIS_URL": settings.REDIS_URL,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


@pytest.fixture(scope="session")
def pg_pair():
    """A primary and its streaming standby, migrated and seeded; removed at the end."""
    bindir = _bindir()
    base = Path(tempfile.mkdtemp(prefix="delaypay-replica-"))
    if os.geteuid() == 0:
        shutil.chown(base, user="postgres", group="postgres")
    base.chmod(0o700)
    primary_port = pick_port(worker_port(55432))
    replica_port = pick_port(primary_port + 1)
    primary = DataCluster(bindir=bindir, directory=base / "primary", port=primary_port)
    replica = DataCluster(bindir=bindir, directory=base / "replica", port=replica_port)
    try:
        primary.run(
            "initdb", "-D", str(primary.directory), "-U", "root", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"
        )
        primary.configure(
            port=primary_port, listen_addresses="127.0.0.1", unix_socket_directories=str(base),
            wal_level="replica", max_wal_senders=4, hot_standby="on", fsync="off", max_connections=40,
            shared_buffers="32MB",
            # No WAL the tests did not cause: autovacuum's ANALYZE of the freshly seeded tables
            # and a timed checkpoint would advance the primary's position at a moment of their
            # choosing, and a lag check that lands right then sees a replica "behind" (the
            # idle-primary test relies on the replica having replayed everything).
            autovacuum="off", checkpoint_timeout="1h",
        )
        with open(primary.directory / "pg_hba.conf", "a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")
        primary.start()
        primary.execute(f"CREATE DATABASE {DATABASE}", dbname="postgres")
        # Migrate and seed the primary while the standby is made: it streams what they write.
        seeding = subprocess.Popen(
            [sys.executable, "-c", SEED], cwd=BASE_DIR, env=_base_env(DATABASE_URL=primary.url()),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        )
        try:
            primary.run(
                "pg_basebackup", "-h", "127.0.0.1", "-p", str(primary_port), "-U", "root",
                "-D", str(replica.directory), "-R", "-X", "stream", "-c", "fast", "--no-sync",
            )
            replica.configure(port=replica_port)
            replica.start()
            assert replica.execute("SELECT pg_is_in_recovery()")[0][0] is True
            out, err = seeding.communicate(timeout=120)
        finally:
            if seeding.poll() is None:
                seeding.kill()
                seeding.wait()
        lines = [line for line in out.splitlines() if line.startswith("SEED ")]
        if seeding.returncode != 0 or not lines:
            raise RuntimeError(f"seeding the primary failed:\n{out}\n{err}")
        pair = Pair(primary=primary, replica=replica, seed=json.loads(lines[-1][5:]))
        pair.wait_caught_up()
        yield pair
    finally:
        for cluster in (replica, primary):
            if cluster.directory.exists():
                with contextlib.suppress(Exception):
                    cluster.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pair(pg_pair):
    """The pair as every test expects it: both running, replay on, the replica caught up."""
    if not pg_pair.replica.running():
        pg_pair.replica.start()
    if pg_pair.replay_paused():
        pg_pair.resume_replay()
    pg_pair.wait_caught_up()
    yield pg_pair
    if not pg_pair.replica.running():
        pg_pair.replica.start()
    if pg_pair.replay_paused():
        pg_pair.resume_replay()


class Web:
    """The web process (the Procfile's ``web`` line, one gunicorn worker) on a loopback port."""

    def __init__(self, pair: Pair, directory: Path, env: dict[str, str]):
        self.port = pick_port(worker_port(58000))
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = directory / "web.log"
        metrics_dir = directory / "prometheus"
        metrics_dir.mkdir()
        self.env = _base_env(
            DATABASE_URL=pair.primary.url(),
            DATABASE_REPLICA_URL=pair.replica.url(),
            PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
            PORT=str(self.port),
            WEB_CONCURRENCY="1",
            **env,
        )
        command = procfile()["web"].replace("0.0.0.0", "127.0.0.1")  # loopback only
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(  # nosec B602: the Procfile's own line
            ["sh", "-c", f"exec {command}"],
            cwd=BASE_DIR, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        self.client = httpx.Client(base_url=self.url, timeout=20)

    def wait_ready(self) -> None:
        wait_for(self._up, timeout=60, what=f"the web process on {self.url}")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the web process exited ({self.proc.returncode}):\n{self.log()}")
        try:
            return self.client.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def get(self, path: str, token: str) -> httpx.Response:
        return self.client.get(f"/api/v1/{path}", headers={"Authorization": f"Token {token}"})

    def post(self, path: str, token: str, body: dict, key: str) -> httpx.Response:
        headers = {"Authorization": f"Token {token}", "Idempotency-Key": key}
        return self.client.post(f"/api/v1/{path}", headers=headers, json=body)

    def reads(self) -> dict[tuple[str, str], float]:
        """delaypay_api_reads_total by (database, reason), from /metrics."""
        return api_reads_in(self.client.get("/metrics").text)

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, 9)
                self.proc.wait(timeout=15)
        self._log.close()


@pytest.fixture
def start_web(pair, tmp_path):
    """``start_web(**env)``: a web process against the pair with extra settings; killed at teardown."""
    started: list[Web] = []

    def start(**env: str) -> Web:
        directory = tmp_path / f"web{len(started)}"
        directory.mkdir()
        web = Web(pair, directory, env)
        started.append(web)
        web.wait_ready()
        return web

    yield start
    for web in started:
        web.stop()


def poll(predicate, *, timeout: float = 20, what: str, interval: float = 0.1):
    """The predicate's first true value, checked until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
