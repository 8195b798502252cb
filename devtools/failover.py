"""Failover under load (issue 37): the real web, workers, promoter and beat on a
pg_auto_failover cluster (devtools/ha.py), API clients creating payments throughout, and
the primary killed (``kill``: SIGKILL of its whole node), frozen (``stop``: SIGSTOP for
``--stop-seconds``, then SIGCONT) or switched over (``switchover``: pg_autoctl's planned
switchover) while a burst of payments drains; or (``redis``) Redis behind Sentinel
(devtools.ha's set, ``REDIS_URL=sentinel://...``) with its master killed instead. Each
round heals the cluster (the old primary or master returns as the replica) before the
next.

Checked at the end, from the database:

* lost: a payment of the bursts not EXECUTED, FAILED or CANCELLED;
* duplicated transfers: a ledger transfer key written twice;
* conservation: the balances against a model of deposits and executed payments, and
  reconciliation's balance checks;
* acknowledged creates missing: a payment the API answered 201 (or 200, a replay) for
  that is not in the database;
* creates duplicated: an Idempotency-Key with more than one payment (every client
  retries a create with the same key until it gets an answer);
* RTO: from the fault to the first create sent after it and acknowledged.

``python manage.py failover`` runs it (``make chaos-ha``); tests/ha/test_stack_failover.py
runs a small one.
"""

import contextlib
import json
import shutil
import signal
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import httpx
from django.core.management import call_command
from django.db import connections, transaction

from devtools import ha
from devtools.chaos import Options as ChaosOptions
from devtools.chaos import build_workload, conservation_errors, db_retry, duplicated_transfers, expected_balances
from devtools.gateway import free_port
from devtools.processes import Stack
from devtools.sandbox import PrivateRedis, SandboxError, pick_port, port_is_free
from ledger.models import Account
from ledger.services import Posting, ledger_post_batch
from payments.models import PaymentStatus, ScheduledPayment
from payments.reconciliation import reconcile

MODES = ("kill", "stop", "switchover", "redis")
CREATE_LEAD = 30.0  # seconds from a create to its execute_at
ABANDON_AFTER = 120.0  # a client gives up a create after this long without an answer
TERMINAL = (PaymentStatus.EXECUTED, PaymentStatus.FAILED, PaymentStatus.CANCELLED)


@dataclass
class Options:
    payments: int = 10_000  # per round's burst
    rounds: int = 5
    mode: str = "kill"
    stop_seconds: float = 30.0
    window: float = 20.0  # a burst's payments fall due over this many seconds
    fault_at: float = 0.3  # ... and the fault lands this share of the window in
    clients: int = 4  # API clients creating payments throughout
    workers: int = 2
    concurrency: int = 2
    lease_seconds: float = 10.0
    command_deadline: float | None = None  # DELAYPAY_DB_COMMAND_DEADLINE_SECONDS; the product's default when None
    seed: int = 0
    base_port: int = 56620  # the cluster's monitor; nodes on the next two
    redis_port: int = 56479
    directory: Path | None = None  # the cluster's; a new one under /tmp when None
    log_dir: Path = Path("var/failover")
    converge_timeout: float = 300.0


@dataclass
class Create:
    key: str
    sent: float  # time.monotonic() of the try that got the answer
    answered: float
    status: int
    payment_id: str | None


@dataclass
class ApiClients:
    """Threads creating one payment at a time through the API, each retrying a create with
    its Idempotency-Key after a 503 or a lost connection, as a careful client does."""

    base_url: str
    token: str
    source: str
    target: str
    count: int
    answers: list[Create] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)
    abandoned: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> "ApiClients":
        self.threads = [threading.Thread(target=self.run, name=f"api-client-{i}", daemon=True)
                        for i in range(self.count)]
        for thread in self.threads:
            thread.start()
        return self

    def run(self) -> None:
        headers = {"Authorization": f"Token {self.token}"}
        with httpx.Client(base_url=self.base_url, headers=headers, timeout=10.0) as client:
            while not self.stop.is_set():
                # Due half a minute on: a create retried through the whole outage is still
                # in the future, so its body, and the key's fingerprint, never change.
                execute_at = (datetime.now(UTC) + timedelta(seconds=CREATE_LEAD)).isoformat()
                self.create(client, str(uuid.uuid4()),
                            {"from_account": self.source, "to_account": self.target, "amount": 1,
                             "execute_at": execute_at})

    def create(self, client: httpx.Client, key: str, body: dict) -> None:
        """Until the server answers (a stop does not abandon a key half-way: what it may
        have created must be known), or ABANDON_AFTER seconds."""
        give_up = time.monotonic() + ABANDON_AFTER
        while time.monotonic() < give_up:
            sent = time.monotonic()
            try:
                response = client.post("/api/v1/payments", json=body, headers={"Idempotency-Key": key})
            except httpx.HTTPError as exc:
                self.errors[type(exc).__name__] += 1
                time.sleep(0.2)
                continue
            code = f"{response.status_code} {response.json().get('code', '')}".strip()
            if response.status_code >= 500 or response.status_code == 429:  # the same key, later
                self.errors[code] += 1
                time.sleep(min(float(response.headers.get("Retry-After", 1)), 1.0))
                continue
            payment_id = response.json().get("payment_id") if response.status_code in (200, 201) else None
            if payment_id is None:
                self.errors[code] += 1
            self.answers.append(Create(key, sent, time.monotonic(), response.status_code, payment_id))
            return
        self.abandoned += 1

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=ABANDON_AFTER + 15)

    def longest_gap(self, start: float, end: float) -> float:
        """The longest time between two acknowledged creates (by their answers) around
        [start, end]: how long writes stopped, whatever the fault."""
        times = sorted(a.answered for a in list(self.answers) if a.payment_id)
        before = [t for t in times if t <= start][-1:]
        around = before + [t for t in times if start < t <= end]
        return max((b - a for a, b in pairwise(around)), default=end - start)

    def first_ack_sent_after(self, moment: float) -> float | None:
        return min((a.answered for a in list(self.answers) if a.payment_id and a.sent > moment), default=None)


@dataclass
class ReadyzWatcher:
    """GET /readyz twice a second: (time.monotonic(), status; 0 for no answer in 5 s)."""

    base_url: str
    answers: list[tuple[float, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> "ReadyzWatcher":
        self.thread = threading.Thread(target=self.run, name="readyz-watcher", daemon=True)
        self.thread.start()
        return self

    def run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=5.0) as client:
            while not self.stop.wait(0.5):
                try:
                    status = client.get("/readyz").status_code
                except httpx.HTTPError:
                    status = 0
                self.answers.append((time.monotonic(), status))

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)

    def round_figures(self, start: float, end: float) -> dict:
        """Seconds not ready between ``start`` and ``end``, and whether the last answer was 200."""
        seen = [(t, status) for t, status in list(self.answers) if start <= t <= end]
        not_ready = sum(0.5 for _, status in seen if status != 200)
        return {"not_ready_seconds": not_ready, "ready_at_end": bool(seen) and seen[-1][1] == 200}


def use_cluster(url: str) -> None:
    """Point this process's default connection at the cluster's multi-host URL."""
    import environ

    db = environ.Env.db_url_config(url)
    connections.close_all()
    settings_dict = connections.settings["default"]
    options = {**settings_dict.get("OPTIONS", {}), **db.get("OPTIONS", {}), "connect_timeout": 2}
    settings_dict.update({k: db[k] for k in ("NAME", "USER", "PASSWORD", "HOST", "PORT")}, OPTIONS=options)


def create_database(cluster_url: str, name: str) -> str:
    """A new database on the cluster; its URL (the same hosts and options)."""
    import psycopg

    with psycopg.connect(cluster_url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # our own name, letters and digits only
    base, _, query = cluster_url.partition("?")
    return f"{base.rsplit('/', 1)[0]}/{name}?{query}"


def api_client_account(deposit: int) -> tuple[str, str, str]:
    """A user with a funded account and a payee account, and an API token: (token, from, to)."""
    from django.contrib.auth import get_user_model
    from knox.models import AuthToken

    from common.ids import new_id

    user = get_user_model().objects.create_user(username=f"failover-{new_id('usr')[-8:].lower()}")
    source = Account.objects.create(id=new_id("acc"), owner=user, name="failover client", kind=Account.Kind.USER)
    target = Account.objects.create(id=new_id("acc"), owner=user, name="failover payee", kind=Account.Kind.USER)
    with transaction.atomic():
        ledger_post_batch(postings=[Posting(new_id("dep"), "acc_issuance", source.id, deposit)])
    _, token = AuthToken.objects.create(user)
    return token, source.id, target.id


def inject(options: Options, directory: Path, redis_dir: Path) -> str:
    """The round's fault; the name of the node it hit."""
    if options.mode == "redis":
        return ha.kill_redis_master(redis_dir, signal.SIGKILL)
    if options.mode == "kill":
        return ha.kill_primary(directory, signal.SIGKILL)
    if options.mode == "stop":
        node = ha.kill_primary(directory, signal.SIGSTOP)
        threading.Timer(options.stop_seconds, lambda: ha.resume(directory)).start()
        return node
    layout = ha.Layout.load(directory.resolve())
    primary = ha.primary_of(ha.nodes_state(layout))
    threading.Thread(target=ha.switchover, args=(directory,), daemon=True).start()
    return primary


def unfinished(ids: list[str]) -> int:
    return ScheduledPayment.objects.filter(pk__in=ids).exclude(status__in=TERMINAL).count()


def converge(ids: list[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if db_retry(lambda: unfinished(ids)) == 0:
            return True
        time.sleep(0.5)
    return False


def measure(bursts: dict[str, tuple[str, str, int]], deposits: Counter, clients: ApiClients,
            client_accounts: tuple[str, str], client_deposit: int) -> dict:
    statuses = dict(ScheduledPayment.objects.values_list("id", "status"))
    lost = sum(1 for pid in bursts if statuses.get(pid) not in TERMINAL)
    acked = {a.payment_id for a in clients.answers if a.payment_id}
    source, target = client_accounts
    created = dict(ScheduledPayment.objects.filter(from_account_id=source).values_list("id", "status"))
    # The API clients' creates are one unit each, from their account to their payee account.
    expected = expected_balances({**deposits, source: client_deposit},
                                 {**bursts, **{pid: (source, target, 1) for pid in created}}, statuses)
    report = reconcile(stuck_after_seconds=0, overdue_after_seconds=0, sample_limit=5)
    duplicated = duplicated_transfers()
    conservation = conservation_errors(expected, report)
    return {
        "payments": len(bursts),
        "by_status": dict(Counter(statuses.get(pid) for pid in bursts)),
        "lost": lost,
        "duplicated_transfers": duplicated,
        "conservation_errors": conservation,
        "reconcile_violations": report.violations,
        "api_creates_acknowledged": len(acked),
        "api_acknowledged_missing": len(acked - set(created)),
        # Created, yet no answer named it: a retry that made a second payment for its key.
        "api_creates_duplicated": len(set(created) - acked),
        "api_unfinished": sum(1 for status in created.values() if status not in TERMINAL),
        "api_errors": dict(clients.errors),
        "api_creates_abandoned": clients.abandoned,
    }


def run(options: Options, *, say) -> dict:
    """Every round, then the figures; every process and server it started is stopped."""
    if options.mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    log_dir = Path(options.log_dir) / f"{options.mode}-{time.strftime('%Y%m%d-%H%M%S')}"
    log_dir.mkdir(parents=True, exist_ok=True)
    directory = options.directory or Path(f"/tmp/delaypay-failover-{uuid.uuid4().hex[:8]}")  # nosec B108
    redis_dir = directory.with_name(directory.name + "-redis")
    redis = None if options.mode == "redis" else PrivateRedis(port=pick_port(options.redis_port),
                                                                directory=log_dir / "redis")
    stack = clients = None
    rto: list[float] = []
    gaps: list[float] = []
    converged_after: list[float] = []  # from the fault to the burst's last payment finished
    readiness: list[dict] = []
    readyz = None
    started = time.monotonic()
    try:
        base_port, cluster_url = start_cluster(directory, options.base_port, say)
        say(f"failover: cluster in {directory} from port {base_port}; logs in {log_dir}")
        url = create_database(cluster_url, f"failover_{uuid.uuid4().hex[:8]}")
        use_cluster(url)
        call_command("migrate", interactive=False, verbosity=0)
        if redis is None:
            redis_url = ha.redis_up(redis_dir, base_port + 10)
        else:
            redis.start()
            redis_url = redis.url
        port = free_port()
        metrics_dir = log_dir / "metrics"  # the stack's own, never a test run's or `make run`'s
        metrics_dir.mkdir(exist_ok=True)
        env = {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir.resolve()), "DATABASE_URL": url, "REDIS_URL": redis_url,
               "DELAYPAY_REDIS_SENTINEL_MASTER": ha.MASTER_NAME,
               "DELAYPAY_LEASE_SECONDS": str(options.lease_seconds),
               "DELAYPAY_LOG_LEVEL": "INFO",
               # The clients stand for many users: one user's rate limit would be the figure.
               "DELAYPAY_THROTTLE_CREATE": "1000000/min",
               "DELAYPAY_THROTTLE_TOKEN": "1000000/min"}  # nosec B105: a rate limit, not a password
        if options.command_deadline is not None:
            env["DELAYPAY_DB_COMMAND_DEADLINE_SECONDS"] = str(options.command_deadline)
        stack = Stack(log_dir, env=env)
        stack.start_all(workers=options.workers, concurrency=options.concurrency)
        stack.start_web(port)
        stack.wait_ready([f"worker{i + 1}" for i in range(options.workers)] + ["promoter"], timeout=120)
        client_deposit = 10**9
        token, source, target = api_client_account(client_deposit)
        clients = ApiClients(f"http://127.0.0.1:{port}", token, source, target, options.clients)
        wait_web(clients.base_url)
        clients.start()
        readyz = ReadyzWatcher(clients.base_url).start()
        bursts: dict[str, tuple[str, str, int]] = {}
        deposits: Counter = Counter()
        for round_ in range(1, options.rounds + 1):
            chaos = ChaosOptions(payments=options.payments, seed=options.seed * 100 + round_, window=options.window,
                                 cancel_ratio=0.0, underfunded=0.05, payouts=0.0, webhooks=False)
            lead = 3.0 + options.payments / 2000
            workload = db_retry(lambda chaos=chaos, lead=lead: build_workload(chaos, lead_seconds=lead))
            bursts |= workload.payments
            deposits.update(workload.deposits)
            time.sleep(max(0.0, workload.first_due + options.window * options.fault_at - time.time()))
            fault_at = time.monotonic()
            node = inject(options, directory, redis_dir)
            first = wait_for(lambda at=fault_at: clients.first_ack_sent_after(at), timeout=120)
            rto.append(round(first - fault_at, 1) if first else float("inf"))
            say(f"failover: round {round_}: {options.mode} of {node}; first create acknowledged after "
                f"{rto[-1]} s")
            converged = converge(list(workload.payments), options.converge_timeout)
            wait_for(lambda: readyz.answers and readyz.answers[-1][1] == 200, timeout=30)
            readiness.append(readyz.round_figures(fault_at, time.monotonic()))
            converged_after.append(round(time.monotonic() - fault_at, 1) if converged else float("inf"))
            gaps.append(round(clients.longest_gap(fault_at, time.monotonic()), 1))
            say(f"failover: round {round_}: burst {'converged' if converged else 'NOT converged'} "
                f"{time.monotonic() - fault_at:.1f} s after the fault; longest gap between acknowledged "
                f"creates {gaps[-1]} s; /readyz not ready for {readiness[-1]['not_ready_seconds']} s; "
                f"healing the cluster")
            ha.resume(directory)
            ha.up(directory, base_port)
            if redis is None:
                ha.redis_up(redis_dir, base_port + 10)
        clients.finish()
        readyz.finish()
        converge([a.payment_id for a in clients.answers if a.payment_id], options.converge_timeout)
        figures = db_retry(lambda: measure(bursts, deposits, clients, (source, target), client_deposit))
        figures |= {"mode": options.mode, "rounds": options.rounds, "rto_seconds": rto,
                    "rto_p50": sorted(rto)[len(rto) // 2], "rto_max": max(rto),
                    "write_gap_seconds": gaps, "write_gap_max": max(gaps),
                    "burst_done_after_fault_seconds": converged_after,
                    "readyz_not_ready_seconds": [r["not_ready_seconds"] for r in readiness],
                    "readyz_ready_after_each_round": all(r["ready_at_end"] for r in readiness),
                    "total_seconds": round(time.monotonic() - started, 1)}
        figures["ok"] = not any(figures[k] for k in ("lost", "duplicated_transfers", "conservation_errors",
                                                     "api_acknowledged_missing", "api_creates_duplicated",
                                                     "api_unfinished", "api_creates_abandoned"))
        figures["ok"] = figures["ok"] and figures["rto_max"] < 60 and figures["readyz_ready_after_each_round"]
        (log_dir / "figures.json").write_text(json.dumps(figures, indent=2, default=str))
        return figures
    finally:
        if clients is not None:
            clients.finish()
        if readyz is not None:
            readyz.finish()
        if stack is not None:
            stack.stop()
        if redis is not None:
            redis.stop()
        elif redis_dir.exists():
            ha.redis_down(redis_dir)
        connections.close_all()
        with contextlib.suppress(Exception):
            ha.resume(directory)
        if options.directory is None:
            ha.down(directory)
            shutil.rmtree(directory, ignore_errors=True)
            shutil.rmtree(redis_dir, ignore_errors=True)


def start_cluster(directory: Path, preferred: int, say) -> tuple[int, str]:
    """(base port, URL) of a new cluster. Its ports (and the Redis set's, 10 up) lie in the
    kernel's ephemeral range, where another process's client socket can take one between
    the check and the bind: then a second range is tried."""
    base = preferred
    for attempt in (1, 2):
        while not all(port_is_free(p) for p in [*range(base, base + 3), *range(base + 10, base + 15)]):
            base += 20
        try:
            return base, ha.up(directory, base)
        except SandboxError as exc:
            if attempt == 2:
                raise
            say(f"failover: the cluster did not start on {base} ({str(exc).splitlines()[0][:120]}); another range")
            with contextlib.suppress(Exception):
                ha.down(directory)
            shutil.rmtree(directory, ignore_errors=True)
            base += 20
    raise AssertionError("unreachable")


def wait_web(base_url: str, timeout: float = 60) -> None:
    def answers() -> bool:
        try:
            return httpx.get(f"{base_url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    if not wait_for(answers, timeout=timeout):
        raise RuntimeError(f"the web process does not answer on {base_url}")


def wait_for(predicate, *, timeout: float, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None


def describe(figures: dict) -> str:
    keys = ("mode", "rounds", "payments", "lost", "duplicated_transfers", "conservation_errors",
            "reconcile_violations", "api_creates_acknowledged", "api_acknowledged_missing",
            "api_creates_duplicated", "rto_p50", "rto_max", "write_gap_max")
    return f"failover {'PASS' if figures['ok'] else 'FAIL'}: " + " ".join(f"{k}={figures[k]}" for k in keys) + (
        f" rto={figures['rto_seconds']} burst_done_after_fault={figures['burst_done_after_fault_seconds']}"
        f" readyz_not_ready={figures['readyz_not_ready_seconds']}"
        f" api_errors={figures['api_errors']} total_s={figures['total_seconds']}")


