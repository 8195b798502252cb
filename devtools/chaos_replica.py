"""The read replica under fault injection (``chaos --replica``).

A streaming standby of the run's private primary (``pg_basebackup -R`` into a data
directory of its own, on a free loopback port), the web process with
``DATABASE_REPLICA_URL`` pointing at it (delaypay/db_router.py), and a reader thread that
asks the API for the status of the workload's payments, as their payers would, all
through the run. The plan adds two faults: the standby stopped for a while
(``replica_down``) and its replay paused (``replica_lag``), on top of every other fault,
the primary's crashes included.

What the run then checks, besides everything a run without the replica checks:

* no phantom status: every status a read answered is one the payment really passes
  through, and a terminal one is the payment's final status (a replica shows the past,
  never a future that did not happen);
* reads were served: some by the replica, and none failed while the primary answered;
* the standby caught up after the run and holds exactly the primary's payments (id,
  status, attempt, version) and balances.
"""

import contextlib
import os
import random
import re
import shutil
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg

from .sandbox import DataCluster, PrivatePostgres, pick_port, server_bindir, wait_for

# A status a payment can be read in, and the terminal ones a read must never invent.
TERMINAL = frozenset({"EXECUTED", "FAILED", "CANCELLED"})
STATUSES = TERMINAL | {"SCHEDULED", "EXECUTING", "NEEDS_REVIEW"}
READERS = 50  # payers whose tokens the reader uses (and whose payments it reads)
READ_EVERY = 0.02  # seconds between two reads: about 50 a second
# After the primary comes back, the web's connections to it were cut: a read may fail
# until the connection is made again (Django makes it on the next request).
PRIMARY_SETTLE = 5.0
# What the primary and the standby must agree on once the standby has caught up.
DIGEST = """
SELECT (SELECT md5(string_agg(id || ':' || status || ':' || attempt || ':' || version, ',' ORDER BY id))
          FROM payments_scheduledpayment),
       (SELECT md5(string_agg(id || ':' || balance, ',' ORDER BY id)) FROM ledger_account)
"""


API_READS = re.compile(r'^delaypay_api_reads_total\{database="(\w+)",reason="(\w+)"\} (\S+)$', re.MULTILINE)


def api_reads_in(metrics_text: str) -> dict[tuple[str, str], float]:
    """delaypay_api_reads_total by (database, reason), from a /metrics page."""
    return {(db, reason): float(value) for db, reason, value in API_READS.findall(metrics_text)}


class Standby:
    """A hot standby of ``primary``, streaming from it."""

    def __init__(self, primary: PrivatePostgres, *, port: int):
        self.primary = primary
        self.base = Path(tempfile.mkdtemp(prefix="delaypay-chaos-replica-"))
        if os.geteuid() == 0:
            shutil.chown(self.base, user="postgres", group="postgres")
        self.base.chmod(0o700)
        self.cluster = DataCluster(bindir=server_bindir(), directory=self.base / "data", port=port,
                                   database=primary.database, user=primary.user)

    def create(self) -> None:
        self.cluster.run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", self.primary.user,
            "-D", str(self.cluster.directory), "-R", "-X", "stream", "-c", "fast", "--no-sync",
        )
        # A Debian cluster keeps its configuration outside the data directory: the copy
        # has none. Hot standby needs max_connections at least the primary's (200).
        (self.cluster.directory / "postgresql.conf").write_text("")
        self.cluster.configure(
            port=self.cluster.port, listen_addresses="127.0.0.1", unix_socket_directories=str(self.base),
            hot_standby="on", max_connections=200, fsync="off", shared_buffers="64MB",
        )
        (self.cluster.directory / "pg_hba.conf").write_text(
            "local all all trust\nhost all all 127.0.0.1/32 trust\n"
        )
        for name in ("pg_hba.conf", "postgresql.conf"):
            if os.geteuid() == 0:
                shutil.chown(self.cluster.directory / name, user="postgres", group="postgres")
        self.cluster.start()

    @property
    def url(self) -> str:
        return self.cluster.url()

    def running(self) -> bool:
        return self.cluster.running()

    def stop(self) -> None:
        self.cluster.stop("immediate")

    def start(self) -> None:
        self.cluster.start()

    def pause_replay(self) -> bool:
        try:
            self.cluster.execute("SELECT pg_wal_replay_pause()")
        except psycopg.Error:
            return False
        return True

    def resume_replay(self) -> None:
        with contextlib.suppress(psycopg.Error):
            self.cluster.execute("SELECT pg_wal_replay_resume()")

    def digest(self) -> tuple[str, str]:
        return tuple(self.cluster.execute(DIGEST)[0])

    def drop(self) -> None:
        with contextlib.suppress(Exception):
            if self.cluster.running():
                self.cluster.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)


def primary_digest(primary: PrivatePostgres) -> tuple[str, str]:
    with psycopg.connect(primary.dsn, autocommit=True) as conn:
        return tuple(conn.execute(DIGEST).fetchone())


def caught_up(standby: Standby, primary: PrivatePostgres, *, timeout: float = 60.0) -> bool:
    """Whether the standby replays up to the primary's current WAL position within ``timeout``."""
    with psycopg.connect(primary.dsn, autocommit=True) as conn:
        target = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0]

    def replayed() -> bool:
        try:
            position = standby.cluster.execute("SELECT pg_last_wal_replay_lsn() - '0/0'::pg_lsn")[0][0]
        except psycopg.Error:
            return False
        return position is not None and position >= target

    try:
        wait_for(replayed, timeout=timeout, what="the standby to catch up", interval=0.25)
    except Exception:
        return False
    return True


@dataclass
class ReadLog:
    codes: Counter = field(default_factory=Counter)
    seen: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    errors: list[tuple[float, str]] = field(default_factory=list)  # (time.time(), what)


class Reader(threading.Thread):
    """GET /api/v1/payments/{id} for random payments of the reader's payers, about
    1/READ_EVERY a second, until ``stop``; what it saw goes to ``log``."""

    def __init__(self, *, url: str, reads: list[tuple[str, str]], stop: threading.Event, seed: int):
        super().__init__(name="replica-reader", daemon=True)
        self.url, self.reads, self.stop = url, reads, stop
        self.rng = random.Random(f"reader:{seed}")
        self.log = ReadLog()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            while not self.stop.wait(READ_EVERY):
                payment_id, token = self.rng.choice(self.reads)
                try:
                    response = client.get(f"/api/v1/payments/{payment_id}",
                                          headers={"Authorization": f"Token {token}"})
                except httpx.TransportError as exc:
                    self._error(f"transport: {type(exc).__name__}")
                    continue
                self.log.codes[response.status_code] += 1
                if response.status_code == 200:
                    self.log.seen[payment_id].add(response.json()["status"])
                elif response.status_code >= 500:
                    self._error(f"{response.status_code}: {response.text[:200]}")

    def _error(self, text: str) -> None:
        self.log.codes["error"] += 1
        self.log.errors.append((time.time(), text))


def reader_tokens(workload_payments: dict, *, seed: int) -> list[tuple[str, str]]:
    """(payment id, its payer's API token) for the payments of READERS payers."""
    from knox.models import AuthToken

    from payments.models import ScheduledPayment

    payers = defaultdict(list)
    for payment_id, payer_id in ScheduledPayment.objects.filter(pk__in=list(workload_payments)).values_list(
            "id", "payer_id"):
        payers[payer_id].append(payment_id)
    chosen = random.Random(f"readers:{seed}").sample(sorted(payers), min(READERS, len(payers)))
    from django.contrib.auth import get_user_model

    users = get_user_model().objects.in_bulk(chosen)
    pairs = []
    for payer_id in chosen:
        _, token = AuthToken.objects.create(users[payer_id])
        pairs += [(payment_id, token) for payment_id in payers[payer_id]]
    return pairs


class ReplicaRun:
    """The standby, the web process reading from it, and the reader, for one chaos run."""

    def __init__(self, primary: PrivatePostgres, *, stack, log_dir: Path, seed: int):
        self.primary, self.stack, self.log_dir, self.seed = primary, stack, log_dir, seed
        self.standby = Standby(primary, port=pick_port(primary.port + 1, {primary.port}))
        self.web_port = pick_port(58100)
        self.reader: Reader | None = None
        self.stop = threading.Event()

    @property
    def web_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def web_env(self) -> dict[str, str]:
        metrics = self.log_dir / "web-prometheus"
        metrics.mkdir(exist_ok=True)
        return {"DATABASE_REPLICA_URL": self.standby.url, "PROMETHEUS_MULTIPROC_DIR": str(metrics),
                # Lag is judged at most this often: a paused replay is noticed within it.
                "DELAYPAY_REPLICA_CHECK_SECONDS": "0.5"}

    def start_web(self) -> None:
        self.stack.start_web(self.web_port, env=self.web_env())

    def web_up(self) -> bool:
        try:
            return httpx.get(f"{self.web_url}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def start(self) -> None:
        self.standby.create()
        self.start_web()
        wait_for(self.web_up, timeout=60, what=f"the web process on {self.web_url}")

    def start_reading(self, workload_payments: dict) -> None:
        reads = reader_tokens(workload_payments, seed=self.seed)
        self.reader = Reader(url=self.web_url, reads=reads, stop=self.stop, seed=self.seed)
        self.reader.start()

    def api_reads(self) -> dict[str, float]:
        """delaypay_api_reads_total by "database/reason", from the web's /metrics."""
        try:
            text = httpx.get(f"{self.web_url}/metrics", timeout=10).text
        except httpx.TransportError:
            return {}
        return {f"{db}/{reason}": value for (db, reason), value in api_reads_in(text).items()}

    def finish(self, final_statuses: dict[str, str], *, primary_down: list[tuple[float, float]]) -> dict:
        """Stop reading, let the standby catch up, and compare it with the primary.
        ``primary_down``: (from, to) times (time.time()) the primary was crashed, widened
        by PRIMARY_SETTLE: a read may fail then, and only then."""
        self.stop.set()
        if self.reader is not None:
            self.reader.join(timeout=15)
        log = self.reader.log if self.reader is not None else ReadLog()
        phantoms = [
            f"{pid} read {sorted(seen)} ended {final_statuses.get(pid)}" for pid, seen in log.seen.items()
            if (seen - STATUSES) or any(s in TERMINAL and s != final_statuses.get(pid) for s in seen)
        ]
        unexcused = [text for at, text in log.errors
                     if not any(start - 1.0 <= at <= end + PRIMARY_SETTLE for start, end in primary_down)]
        if not self.standby.running():
            self.standby.start()
        self.standby.resume_replay()
        synced = caught_up(self.standby, self.primary)
        same = synced and self.standby.digest() == primary_digest(self.primary)
        reads = self.api_reads()
        return {
            "reads": dict(log.codes),
            "payments_read": len(log.seen),
            "phantom_statuses": len(phantoms),
            "phantom_samples": phantoms[:5],
            "errors_while_primary_up": len(unexcused),
            "error_samples": unexcused[:5],
            "api_reads": reads,
            "served_by_replica": sum(v for k, v in reads.items() if k.startswith("replica/")),
            "caught_up": synced,
            "matches_primary": same,
        }

    def close(self) -> None:
        self.stop.set()
        self.standby.drop()


def replica_ok(figures: dict | None) -> bool:
    if figures is None:
        return True
    return (figures["phantom_statuses"] == 0 and figures["errors_while_primary_up"] == 0
            and figures["reads"].get(200, 0) > 0 and figures["served_by_replica"] > 0
            and figures["caught_up"] and figures["matches_primary"])


def describe_replica(figures: dict | None) -> str:
    if figures is None:
        return ""
    return (f" replica: reads={sum(v for k, v in figures['reads'].items() if k != 'error')}"
            f" ok={figures['reads'].get(200, 0)} by_replica={figures['served_by_replica']:.0f}"
            f" phantom={figures['phantom_statuses']} errors_primary_up={figures['errors_while_primary_up']}"
            f" caught_up={figures['caught_up']} matches_primary={figures['matches_primary']}")
