"""The fault-injection run behind ``manage.py chaos`` (Jepsen-style, with a
TigerBeetle-style invariant check at the end).

1. Start a private PostgreSQL cluster and a private redis-server, migrate, and run the
   real processes (workers, promoter, beat) from the Procfile against them.
2. Schedule N payments across many accounts (some underfunded), all due within a short
   window; cancel some of them while they drain, racing the claim.
3. While they drain, inject faults at moments drawn from a seeded RNG: SIGKILL of worker
   parents and of single prefork children, SIGKILL and restart of the promoter and of
   beat, Redis killed (its messages lost) and restarted, PostgreSQL stopped with
   ``-m immediate`` and restarted, a worker SIGSTOPped past its lease and resumed, a
   duplicate promoter and a duplicate beat for a while. The plan is a pure function of
   the seed and the options, so a failing seed replays the same fault schedule.
4. Stop injecting, wait until every payment is terminal, run the reconciliation and an
   independent balance model, and print one line of figures.

Webhooks ride along (``--no-webhooks`` leaves them out): every chaos user has an endpoint
subscribed to every event type, pointing at a real receiver process
(devtools/webhook_receiver.py) that verifies each signature and answers 500 to the first
``--webhook-fail-first`` tries of a ``--webhook-fail-share`` of the events; the ``webhooks`` process runs under the
supervisor, is SIGKILLed by the plan (``kill_webhooks``) and the receiver goes away for a
while (``receiver_down``). At the end the harness waits for the webhook backlog to drain
and checks that every terminal payment produced exactly one event of its terminal type
and at least one verified, successful delivery.
"""

import contextlib
import hashlib
import json
import logging
import os
import random
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.core.management import call_command
from django.db import InterfaceError, OperationalError, connection, connections, transaction

from common.db import database_now
from common.ids import new_id
from devtools.chaos_replica import ReplicaRun, describe_replica, replica_ok
from devtools.gateway import SandboxGateway, free_port
from devtools.processes import Stack
from devtools.sandbox import PrivatePostgres, PrivateRedis, pick_port
from devtools.webhook_receiver import ReceiverProcess, Summary
from ledger.models import Account, PendingTransfer
from ledger.services import Posting, ledger_post_batch
from payments.exceptions import PaymentNotCancellable, PayoutOutcomeUnknown
from payments.models import IdempotencyKey, Payee, PaymentEvent, PaymentStatus, ScheduledPayment, StartMarker
from payments.reconciliation import reconcile
from payments.services import payment_cancel
from payments.tasks import execute_batch
from payouts.settlement import reconcile_settlement
from payouts.tasks import execute_payouts
from rails.registry import close_rails
from webhooks.events import EVENT_TYPES
from webhooks.models import Endpoint

logger = logging.getLogger("devtools.chaos")

DB_ERRORS = (OperationalError, InterfaceError)

# Every kind of fault, and how many of each a run injects at least (the list).
MINIMUM_FAULTS: dict[str, int] = {
    "kill_worker": 1,  # SIGKILL a worker's parent process; a supervisor restarts it
    "kill_child": 1,  # SIGKILL one prefork child; the parent forks a replacement
    "kill_promoter": 1,  # SIGKILL the promoter, restart it
    "kill_beat": 1,  # SIGKILL beat, restart it
    "restart_redis": 2,  # SIGKILL redis-server (no persistence: messages lost), restart it
    # Redis down for --broker-outage-seconds: the promoter executes from the database
    # (degraded mode); the run reports what executed during the outage and how late.
    "long_broker_outage": 1,
    "restart_postgres": 1,  # pg_ctlcluster stop -m immediate, then start (WAL replay)
    "pause_worker": 1,  # SIGSTOP a worker past its lease, then SIGCONT: the zombie
    "duplicate_promoter": 1,  # a second promoter for a while
    "duplicate_beat": 1,  # a second beat for a while (double ticks)
    "redeliver": 1,  # the broker delivers again: duplicates of current attempts, late stale ones
}
# Weights for the faults beyond the minimum: process kills are the common case.
EXTRA_WEIGHTS: dict[str, float] = {
    "kill_worker": 3, "kill_child": 4, "kill_promoter": 1, "kill_beat": 1, "restart_redis": 1,
    "restart_postgres": 0.7, "pause_worker": 1, "duplicate_promoter": 0.5, "duplicate_beat": 0.5,
    "redeliver": 1,
}


# With webhooks: faults drawn from their own RNG stream on top of the plan above, so a
# seed replays the same core plan with or without them.
WEBHOOK_FAULTS: dict[str, int] = {
    "kill_webhooks": 2,  # SIGKILL the webhooks (dispatcher) process; the supervisor restarts it
    "receiver_down": 1,  # the receiver killed (connections refused) and restarted on its port
}

# The processes' webhook settings in a run: a ladder of seconds, not hours, that still
# outlasts every outage the plan draws (3.5 minutes in all), and a lease short enough
# for a killed dispatcher's deliveries to come back within the run (lease > timeout + 5 s).
WEBHOOK_ENV = {
    "DELAYPAY_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
    "DELAYPAY_WEBHOOK_RETRY_DELAYS": "1,2,4,8,15,30,60,90",
    "DELAYPAY_WEBHOOK_TIMEOUT_SECONDS": "3",
    "DELAYPAY_WEBHOOK_LEASE_SECONDS": "10",
}

# With payouts: the gateway's faults (its control endpoint), its outage (the process
# stopped: connections refused) and kills of the payouts process, from their own stream.
PAYOUT_FAULTS: dict[str, int] = {
    "gateway_timeouts": 1,  # timeout_rate 0.3: payouts recorded, then the answer dropped
    "gateway_errors": 1,  # error_rate 0.5: 5xx before anything is recorded
    "gateway_latency": 1,  # latency_ms 300
    "gateway_down": 1,  # the gateway process stopped for --gateway-outage-seconds, then started again
    "kill_payouts": 2,  # SIGKILL the payouts process mid-flight; the supervisor restarts it
}

# The gateway faults set over its control endpoint: the setting and its value.
GATEWAY_SETTINGS = {
    "gateway_timeouts": ("timeout_rate", 0.3),
    "gateway_errors": ("error_rate", 0.5),
    "gateway_latency": ("latency_ms", 300),
}

# The processes' payout settings in a run: follow-ups of seconds whose sum (38 s) outlasts
# every fault window but the outage (during which the breaker holds them), a short
# cool-down, a rate limit that does not slow the run.
PAYOUT_ENV = {
    "DELAYPAY_RAIL_TIMEOUT_SECONDS": "2",
    "DELAYPAY_RAIL_FOLLOWUP_DELAYS": "1,2,5,10,20",
    "DELAYPAY_RAIL_BREAKER_COOLDOWN_SECONDS": "3",
    "DELAYPAY_RAIL_RATE_LIMIT": "2000",
}

SETTLEMENT_ACCOUNT = "acc_sandbox_settlement"

# With --replica (devtools/chaos_replica.py): the standby stopped, and its replay paused
# (the router must notice the lag), from their own stream.
REPLICA_FAULTS: dict[str, int] = {"replica_down": 1, "replica_lag": 1}

# The faults that take a service down, by service.
OUTAGE_KINDS = {"redis": ("restart_redis", "long_broker_outage"), "postgres": ("restart_postgres",)}


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the first payment is due
    kind: str
    target: int  # which worker (or child), modulo what exists
    duration: float  # down time / pause / overlap, seconds

    def describe(self) -> str:
        return f"t+{self.at:6.2f}s {self.kind:<18} target={self.target} for {self.duration:.2f}s"


@dataclass
class Options:
    payments: int = 20_000
    seed: int = 0
    faults: int = 30
    workers: int = 3
    concurrency: int = 2
    window: float = 60.0  # payments fall due over this many seconds; faults land in it
    accounts: int = 0  # 0: payments // 20
    underfunded: float = 0.1  # share of accounts funded below what they will send
    cancel_ratio: float = 0.03
    lease_seconds: float = 5.0
    batch: int = 100
    inflight_cap: int = 2000
    max_attempts: int = 5
    broker_outage_seconds: float = 20.0  # the long_broker_outage fault's length
    # >0: one workers_down fault besides the plan: every worker stopped for this many
    # leases from t+0.5 s (payments fall due while nobody executes them), then restarted.
    workers_down_leases: float = 0.0
    converge_timeout: float = 300.0
    webhooks: bool = True  # a receiver, an endpoint per user, the webhooks process and its checks
    webhook_fail_first: int = 1  # the receiver answers 500 to the first N tries of an event ...
    webhook_fail_share: float = 0.1  # ... for this share of the events (each failure is one more request)
    webhook_drain_timeout: float = 120.0  # after convergence, seconds for every event to be delivered
    # After convergence, wait up to this long for beat's every-minute purge to empty the
    # executor's start markers (no attempt needs one once nothing executes): the
    # housekeeping runs on its own, with no cron; 0 skips the check.
    housekeeping_timeout: float = 0.0
    payouts: float = 0.1  # share of the payments that are payouts (the sandbox gateway, its faults and checks)
    gateway_outage_seconds: float = 60.0  # the gateway_down fault: the gateway process stopped this long
    pg_port: int = 55432
    redis_port: int = 56379
    cluster: str = "delaypay_chaos"
    log_dir: Path = Path("var/chaos")
    keep: bool = False
    # DELAYPAY_CLAIM_SHARDS, and as many promoter processes (promoter, promoter2, ...): the
    # claim split by shard, each promoter killed and restarted by the plan in turn.
    shards: int = 1
    # A streaming standby, the web process reading from it and an API reader through the
    # run; the plan adds REPLICA_FAULTS (devtools/chaos_replica.py).
    replica: bool = False

    @property
    def promoters(self) -> list[str]:
        return ["promoter", *(f"promoter{n}" for n in range(2, self.shards + 1))]


def burst_offsets(window: float) -> list[float]:
    """Moments when a crowd of payments falls due at once: a backlog for the faults to hit."""
    return [window * 0.25, window * 0.5, window * 0.75]


BURST_SHARE = 0.4  # of the payments, split over the bursts; the rest fall due uniformly


def webhook_fault_plan(options: Options) -> list[Fault]:
    """The webhook faults (none without webhooks or without faults), from their own stream."""
    if not options.webhooks or options.faults == 0:
        return []
    rng = random.Random(f"webhook-faults:{options.seed}")
    durations = {"kill_webhooks": lambda: rng.uniform(0.5, 3.0), "receiver_down": lambda: rng.uniform(1.0, 4.0)}
    return [
        Fault(at=round(rng.uniform(0.5, options.window), 2), kind=kind, target=0, duration=round(durations[kind](), 2))
        for kind, n in WEBHOOK_FAULTS.items() for _ in range(n)
    ]


def payout_fault_plan(options: Options) -> list[Fault]:
    """The gateway's faults (none without payouts or without faults), from their own stream."""
    if options.payouts <= 0 or options.faults == 0:
        return []
    rng = random.Random(f"payout-faults:{options.seed}")
    durations = {
        "gateway_timeouts": lambda: rng.uniform(5.0, 12.0),
        "gateway_errors": lambda: rng.uniform(5.0, 12.0),
        "gateway_latency": lambda: rng.uniform(5.0, 10.0),
        "gateway_down": lambda: options.gateway_outage_seconds,
        "kill_payouts": lambda: rng.uniform(0.5, 3.0),
    }

    def moment(kind: str) -> float:
        # The outage comes last, so the gateway's other faults hit a gateway that runs.
        if kind == "gateway_down":
            return rng.uniform(0.6, 0.8) * options.window
        return rng.uniform(0.5, max(0.6, 0.55 * options.window))

    return [
        Fault(at=round(moment(kind), 2), kind=kind, target=0, duration=round(durations[kind](), 2))
        for kind, n in PAYOUT_FAULTS.items() for _ in range(n)
    ]


def replica_fault_plan(options: Options) -> list[Fault]:
    """The standby's faults (none without --replica or without faults): its replay paused
    in the first half of the window, the standby stopped in the second, never both."""
    if not options.replica or options.faults == 0:
        return []
    rng = random.Random(f"replica-faults:{options.seed}")
    half = options.window / 2
    return [
        Fault(at=round(rng.uniform(0.5, max(0.6, half - 12)), 2), kind="replica_lag", target=0,
              duration=round(rng.uniform(5.0, 10.0), 2)),
        Fault(at=round(rng.uniform(half, max(half + 0.1, options.window - 10)), 2), kind="replica_down", target=0,
              duration=round(rng.uniform(3.0, 8.0), 2)),
    ]


def fault_plan(options: Options) -> list[Fault]:
    """The run's faults: a pure function of the seed and the options."""
    down_for = round(options.workers_down_leases * options.lease_seconds, 2)
    workers_down = [Fault(at=0.5, kind="workers_down", target=0, duration=down_for)] if down_for > 0 else []
    if options.faults == 0:
        return workers_down
    minimum = sum(MINIMUM_FAULTS.values())
    if options.faults < minimum:
        raise ValueError(f"--faults must be 0 or at least {minimum} (one of every kind, Redis twice)")
    rng = random.Random(f"faults:{options.seed}")
    kinds = [kind for kind, n in MINIMUM_FAULTS.items() for _ in range(n)]
    extra = list(EXTRA_WEIGHTS)
    kinds += rng.choices(extra, weights=[EXTRA_WEIGHTS[k] for k in extra], k=options.faults - minimum)
    rng.shuffle(kinds)
    lease = options.lease_seconds
    durations = {
        "kill_worker": lambda: rng.uniform(0.5, 3.0),  # until the supervisor restarts it
        "kill_child": lambda: 0.0,
        "kill_promoter": lambda: rng.uniform(0.5, 4.0),
        "kill_beat": lambda: rng.uniform(0.5, 4.0),
        "restart_redis": lambda: rng.uniform(1.0, 4.0),
        "long_broker_outage": lambda: options.broker_outage_seconds,
        "restart_postgres": lambda: rng.uniform(0.5, 3.0),
        "pause_worker": lambda: 2 * lease + rng.uniform(1.0, 4.0),  # well past its lease
        "duplicate_promoter": lambda: rng.uniform(5.0, 15.0),
        "duplicate_beat": lambda: rng.uniform(5.0, 15.0),
        "redeliver": lambda: 0.0,
    }
    bursts = burst_offsets(options.window)

    def moment(kind: str) -> float:
        # The zombie is paused just after a burst, while it holds messages and batches.
        if kind == "pause_worker":
            return rng.choice(bursts) + rng.uniform(0.05, 0.6)
        # The long outage ends inside the window when it fits, so payments fall due all through it.
        if kind == "long_broker_outage":
            return rng.uniform(0.5, max(0.5, options.window - options.broker_outage_seconds))
        return rng.uniform(0.5, options.window)

    faults = [
        Fault(at=round(moment(kind), 2), kind=kind, target=rng.randrange(1000), duration=round(durations[kind](), 2))
        for kind in kinds
    ]
    # Outages of one service do not overlap (a crash of a server that is already down is
    # no fault): each starts at least 2 s after the previous one of that service ended.
    for service in (OUTAGE_KINDS["redis"], OUTAGE_KINDS["postgres"]):
        ready = 0.0
        for i, fault in sorted(enumerate(faults), key=lambda item: item[1].at):
            if fault.kind in service:
                if fault.at < ready:
                    faults[i] = fault = Fault(round(ready, 2), fault.kind, fault.target, fault.duration)
                ready = fault.at + fault.duration + 2.0
    return sorted(faults + workers_down + webhook_fault_plan(options) + payout_fault_plan(options)
                  + replica_fault_plan(options), key=lambda f: (f.at, f.kind))


def plan_digest(plan: list[Fault]) -> str:
    return hashlib.sha1("\n".join(f.describe() for f in plan).encode(), usedforsecurity=False).hexdigest()[:10]


@dataclass
class Workload:
    deposits: dict[str, int]  # account id -> amount deposited
    payments: dict[str, tuple[str, str, int]]  # payment id -> (from, to, amount)
    cancels: list[tuple[float, str]]  # (seconds after the first due time, payment id)
    first_due: float  # time.time() of the first due instant
    endpoint_secrets: list[str] = field(default_factory=list)  # one webhook endpoint per user
    payouts: set[str] = field(default_factory=set)  # the payments that are payouts (to: the settlement account)


def db_retry(fn, *, timeout: float = 120.0):
    """Call ``fn`` until it gets through a database restart (reconnecting each time)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except DB_ERRORS:
            connection.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def build_workload(options: Options, *, lead_seconds: float, webhook_url: str | None = None) -> Workload:
    """Accounts, deposits and payments, written the way the services write them but in
    bulk (one service call per payment would take longer than the due window); with a
    ``webhook_url``, an endpoint per user subscribed to every event type."""
    rng = random.Random(f"workload:{options.seed}")
    n_accounts = options.accounts or max(20, options.payments // 20)
    User = get_user_model()
    run_tag = new_id("run")[-8:].lower()
    with transaction.atomic():
        users = User.objects.bulk_create(
            [User(username=f"chaos-{run_tag}-{i}", password=make_password(None)) for i in range(n_accounts)]
        )
        accounts = Account.objects.bulk_create(
            [Account(id=new_id("acc"), owner=u, name=f"chaos {i}", kind=Account.Kind.USER) for i, u in enumerate(users)]
        )
        # One sandbox payee per user; a few of them at destinations the gateway always declines.
        prng = random.Random(f"payouts:{options.seed}")
        payee_rows = Payee.objects.bulk_create(
            [Payee(id=new_id("pye"), owner=u, name=f"chaos payee {i}", rail="sandbox",
                   destination=f"decline-{i}" if prng.random() < 0.05 else f"acct_{i}")
             for i, u in enumerate(users)] if options.payouts > 0 else []
        )
        endpoints = Endpoint.objects.bulk_create(
            [Endpoint(owner=u, url=webhook_url, events=list(EVENT_TYPES), description="chaos") for u in users]
            if webhook_url else []
        )
    ids = [a.id for a in accounts]
    owners = {a.id: a.owner for a in accounts}
    payee_of = {p.owner_id: p.id for p in payee_rows}

    # Most accounts hold what they will send; the underfunded hold a third of it and
    # receive nothing, so some of their payments fail with insufficient_funds (which
    # ones depends on due order).
    poor = set(rng.sample(ids, int(len(ids) * options.underfunded)))
    payees = sorted(set(ids) - poor)
    bursts = burst_offsets(options.window)
    offsets = sorted(
        rng.choice(bursts) if rng.random() < BURST_SHARE else rng.uniform(0, options.window)
        for _ in range(options.payments)
    )
    planned = []
    outflow: Counter = Counter()
    for offset in offsets:
        source = rng.choice(ids)
        target = rng.choice([a for a in rng.sample(payees, 2) if a != source])
        amount = rng.randint(1, 100)
        planned.append((offset, source, target, amount))
        outflow[source] += amount
    deposits = {a: outflow[a] // 3 if a in poor else outflow[a] for a in ids}
    with transaction.atomic():
        ledger_post_batch(
            postings=[Posting(new_id("dep"), "acc_issuance", a, amount) for a, amount in deposits.items() if amount]
        )

    start = database_now() + timedelta(seconds=lead_seconds)
    first_due = time.time() + lead_seconds
    payments: dict[str, tuple[str, str, int]] = {}
    payout_ids: set[str] = set()
    chunk = 5000
    for i in range(0, len(planned), chunk):
        rows, events = [], []
        for offset, source, target, amount in planned[i:i + chunk]:
            pid = new_id("pay")
            execute_at = start + timedelta(seconds=offset)
            owner = owners[source]
            if payee_of and prng.random() < options.payouts:
                rows.append(ScheduledPayment(id=pid, payer=owner, from_account_id=source, rail="sandbox",
                                             to_payee_id=payee_of[owner.pk], amount=amount, execute_at=execute_at))
                payout_ids.add(pid)
                target = SETTLEMENT_ACCOUNT  # where its money ends when the rail pays it
            else:
                rows.append(ScheduledPayment(id=pid, payer=owner, from_account_id=source, to_account_id=target,
                                             amount=amount, execute_at=execute_at))
            events.append(PaymentEvent(payment_id=pid, kind=PaymentEvent.Kind.CREATED,
                                       to_status=PaymentStatus.SCHEDULED, actor=f"user:{owner.pk}",
                                       actor_user=owner,
                                       data={"amount": amount, "execute_at": execute_at.isoformat()}))
            payments[pid] = (source, target, amount)
        with transaction.atomic():
            ScheduledPayment.objects.bulk_create(rows)
            PaymentEvent.objects.bulk_create(events)
    # Cancel some just around their due time, so the cancel races the claim.
    chosen = rng.sample(range(len(planned)), int(len(planned) * options.cancel_ratio))
    pids = list(payments)
    cancels = sorted((max(0.0, planned[i][0] + rng.uniform(-1.0, 0.5)), pids[i]) for i in chosen)
    return Workload(deposits=deposits, payments=payments, cancels=cancels, first_due=first_due,
                    endpoint_secrets=[e.secret for e in endpoints], payouts=payout_ids)


@dataclass
class Figures:
    injected: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)
    restarts_unexpected: int = 0
    redelivered: int = 0  # (payment, attempt) pairs the redeliver faults sent again
    cancels_won: int = 0
    cancels_lost: int = 0
    cancels_unknown: int = 0
    cancel_answers: dict[str, str] = field(default_factory=dict)  # payment id -> answered status
    redis_outages: list[tuple] = field(default_factory=list)  # (db time down, db time up)
    postgres_outages: list[tuple] = field(default_factory=list)  # (time.time() down, time.time() up)
    long_outages: list[int] = field(default_factory=list)  # which of redis_outages were long_broker_outage
    webhooks_drained: bool = False
    webhook_drain_seconds: float = 0.0


class Injector:
    """Carries out the plan against the stack and the private services, and keeps the
    core processes running the way a supervisor (systemd, Kubernetes) would."""

    def __init__(self, *, stack: Stack, pg: PrivatePostgres, redis: PrivateRedis, options: Options,
                 figures: Figures, workers: list[str], receiver: ReceiverProcess | None = None,
                 gateway: SandboxGateway | None = None, replica: ReplicaRun | None = None):
        self.stack, self.pg, self.redis, self.options, self.figures = stack, pg, redis, options, figures
        self.workers = workers
        self.receiver = receiver
        self.gateway = gateway  # a control client of the gateway process the stack runs
        self.replica = replica
        self.core = [*workers, *options.promoters, "beat", *(["webhooks"] if receiver is not None else []),
                     *(["payouts", "gateway"] if gateway is not None else []),
                     *(["web"] if replica is not None else [])]
        self.down: set[str] = set()  # deliberately stopped, not for the supervisor to restart
        self.paused: dict[str, int] = {}  # name -> process group we stopped
        self.lock = threading.RLock()  # the zombie thread and the plan both touch the stack
        self.stopping = False
        self.log = open(stack.log_dir / "faults.log", "a")

    def note(self, text: str) -> None:
        self.log.write(f"{time.strftime('%H:%M:%S')} {text}\n")
        self.log.flush()

    def start(self, name: str) -> None:
        if name.startswith("worker"):
            self.stack.start_worker(name, concurrency=self.options.concurrency)
        elif name.startswith("promoter"):
            self.stack.start_promoter(name)
        elif name.startswith("webhooks"):
            self.stack.start_webhooks(name)
        elif name.startswith("payouts"):
            self.stack.start_payouts(name)
        elif name == "gateway":
            self.stack.start_gateway(self.gateway.port)
        elif name == "web":
            self.replica.start_web()
        else:
            self.stack.start_beat(name)

    def _reap(self, name: str) -> None:
        proc = self.stack.procs.get(name)
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the orphans a dead parent left
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def _worker(self, fault: Fault) -> str | None:
        """The fault's worker, or the next one that is running and not paused."""
        n = len(self.workers)
        for i in range(n):
            name = self.workers[(fault.target + i) % n]
            proc = self.stack.procs.get(name)
            if proc is not None and proc.poll() is None and name not in self.paused and name not in self.down:
                return name
        return None

    def _zombie(self, fault: Fault) -> None:
        """Pause a worker caught inside a transaction (waiting up to 10 s for one, without
        holding up the rest of the plan), keep it stopped past its lease, resume it."""
        name = self._busy_worker(timeout=10.0)
        with self.lock:
            name = name or self._worker(fault)
            if name is None or self.stopping:
                return
            pgid = self.stack.procs[name].pid
            os.killpg(pgid, signal.SIGSTOP)
            self.paused[name] = pgid
        self.note(f"        paused {name}")
        time.sleep(fault.duration)
        with self.lock:
            if self.paused.pop(name, None) == pgid:
                try:
                    os.killpg(pgid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        self.note(f"        resumed {name}")

    def _redeliver(self, fault: Fault) -> bool:
        """What an at-least-once broker does on a bad day: deliver recently claimed
        payments again, each current attempt twice at once and each superseded attempt
        late, on the queue they were claimed for (internal payments to the executor,
        payouts to the payouts worker). Exactly-once must make every one of these change
        nothing. (A message on the wrong queue is tested apart: tests/payments/test_payouts.py.)"""
        rng = random.Random(fault.target)
        try:
            with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
                recent = conn.execute(
                    "SELECT id, attempt, rail <> '' FROM payments_scheduledpayment WHERE attempt > 0"
                    " ORDER BY claimed_at DESC, id LIMIT 300"
                ).fetchall()
        except psycopg.Error:
            return False
        if not recent:
            return False
        chosen = rng.sample(recent, min(60, len(recent)))
        messages = []
        for task, payout in ((execute_batch, False), (execute_payouts, True)):
            current = [[pid, attempt] for pid, attempt, is_payout in chosen if is_payout == payout]
            stale = [[pid, attempt - 1] for pid, attempt in current if attempt > 1]
            batches = [current[i:i + 10] for i in range(0, len(current), 10)]
            messages += [(task, m) for m in batches for _ in range(2)] + [(task, [pair]) for pair in stale]
        try:
            with execute_batch.app.connection_for_write(self.redis.url) as conn:
                producer = execute_batch.app.amqp.Producer(conn)
                for task, pairs in messages:
                    task.apply_async(args=[pairs], producer=producer, retry=False)
        except Exception as exc:  # Redis is down: nothing was (re)delivered
            self.note(f"        redeliver failed: {type(exc).__name__}: {exc}")
            return False
        self.figures.redelivered += sum(len(m) for _, m in messages)
        return True

    def _busy_worker(self, *, timeout: float) -> str | None:
        """Wait for a worker with a process inside a transaction, so that the pause freezes
        it mid-batch holding row locks (the worst moment for a zombie)."""
        candidates = [n for n in self.workers if n not in self.paused and n not in self.down]
        deadline = time.monotonic() + timeout
        try:
            with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
                while time.monotonic() < deadline:
                    row = conn.execute(
                        "SELECT application_name FROM pg_stat_activity WHERE application_name = ANY(%s)"
                        " AND xact_start IS NOT NULL AND state <> 'idle' LIMIT 1", [candidates],
                    ).fetchone()
                    if row:
                        return row[0]
                    time.sleep(0.002)
        except psycopg.Error:
            pass
        return None

    def _db_clock(self):
        try:
            return db_retry(database_now, timeout=5)
        except DB_ERRORS:
            # PostgreSQL is restarting too: its clock is this machine's (a private local cluster).
            return datetime.now(UTC)

    def begin(self, fault: Fault) -> list[tuple[float, str]] | str | None:
        """Inject one fault; return the follow-up actions (delay, action) it needs, None
        when its target was not there to hit (a dead or paused worker), or "later" to be
        tried again in a second."""
        kind = fault.kind
        if kind == "kill_worker":
            name = self._worker(fault)
            if name is None:
                return self._skip(fault)
            self.down.add(name)
            os.kill(self.stack.procs[name].pid, signal.SIGKILL)  # the parent only; its children are orphaned
            return [(min(1.0, fault.duration), f"reap:{name}"), (fault.duration, f"restart:{name}")]
        if kind == "workers_down":
            # The whole fleet stopped (a bad deploy, a lost node pool): claims expire every
            # lease with no worker to start them; none of that may cost a payment a try.
            follow = []
            for name in self.workers:
                proc = self.stack.procs.get(name)
                if proc is None or proc.poll() is not None or name in self.paused:
                    continue
                self.down.add(name)
                os.kill(proc.pid, signal.SIGKILL)
                follow += [(1.0, f"reap:{name}"), (fault.duration, f"restart:{name}")]
            return follow or self._skip(fault)
        if kind == "kill_child":
            name = self._worker(fault)
            children = child_pids(self.stack.procs[name].pid) if name is not None else []
            if not children:
                return self._skip(fault)
            os.kill(children[fault.target % len(children)], signal.SIGKILL)
            return []
        if kind in ("kill_promoter", "kill_beat", "kill_webhooks"):
            name = kind.removeprefix("kill_")
            if kind == "kill_promoter":
                name = self.options.promoters[fault.target % len(self.options.promoters)]
            if kind == "kill_webhooks" and (name not in self.core or name in self.down):
                return self._skip(fault)
            self.down.add(name)
            self.stack.kill(name, signal.SIGKILL)
            return [(fault.duration, f"restart:{name}")]
        if kind in OUTAGE_KINDS["redis"]:
            if not self.redis.running:
                return "later"  # still down from the previous outage
            self.redis.crash()
            if kind == "long_broker_outage":
                self.figures.long_outages.append(len(self.figures.redis_outages))
            self.figures.redis_outages.append((self._db_clock(), None))
            return [(fault.duration, "redis_up")]
        if kind == "restart_postgres":
            if not self.pg.is_up():
                return "later"
            self.pg.crash()
            self.figures.postgres_outages.append((time.time(), None))
            return [(fault.duration, "postgres_up")]
        if kind == "pause_worker":
            if self._worker(fault) is None:
                return self._skip(fault)
            threading.Thread(target=self._zombie, args=(fault,), name="zombie", daemon=True).start()
            return []
        if kind == "redeliver":
            if not self.redis.running:
                return "later"  # nothing to deliver through while the broker is down
            return [] if self._redeliver(fault) else self._skip(fault)
        if kind in GATEWAY_SETTINGS:
            if self.gateway is None or "gateway" in self.down:
                return self._skip(fault)
            name, value = GATEWAY_SETTINGS[kind]
            try:
                self.gateway.faults(**{name: value})
            except Exception:  # the gateway is restarting
                return "later"
            return [(fault.duration, f"gateway_clear:{name}")]
        if kind in ("gateway_down", "kill_payouts"):
            name = "gateway" if kind == "gateway_down" else "payouts"
            if name not in self.core or name in self.down:
                return self._skip(fault)
            self.down.add(name)
            self.stack.kill(name, signal.SIGKILL)
            return [(fault.duration, f"restart:{name}")]
        if kind == "replica_down":
            if self.replica is None or not self.replica.standby.running():
                return self._skip(fault)
            self.replica.standby.stop()
            return [(fault.duration, "replica_up")]
        if kind == "replica_lag":
            if self.replica is None or not self.replica.standby.pause_replay():
                return self._skip(fault)
            return [(fault.duration, "replica_resume")]
        if kind == "receiver_down":
            if self.receiver is None or not self.receiver.running:
                return self._skip(fault)
            self.receiver.kill()
            return [(fault.duration, "receiver_up")]
        if kind in ("duplicate_promoter", "duplicate_beat"):
            name = f"{kind.removeprefix('duplicate_')}-dup"
            proc = self.stack.procs.get(name)
            if proc is not None and proc.poll() is None:
                return self._skip(fault)
            self.start(name)
            return [(fault.duration, f"stop:{name}")]
        raise ValueError(kind)

    def _skip(self, fault: Fault) -> None:
        self.figures.skipped[fault.kind] += 1
        self.note(f"skipped {fault.describe()} (target not running or paused)")
        return None

    def follow_up(self, action: str) -> None:
        verb, _, name = action.partition(":")
        if verb == "reap":
            self._reap(name)
        elif verb == "restart":
            self._reap(name)
            self.down.discard(name)
            self.start(name)
        elif verb == "redis_up":
            self.redis.start()
            down_at, _ = self.figures.redis_outages[-1]
            self.figures.redis_outages[-1] = (down_at, self._db_clock())
        elif verb == "postgres_up":
            self.pg.start()
            down_at, _ = self.figures.postgres_outages[-1]
            self.figures.postgres_outages[-1] = (down_at, time.time())
        elif verb == "replica_up":
            self.replica.standby.start()
        elif verb == "replica_resume":
            self.replica.standby.resume_replay()
        elif verb == "receiver_up":
            self.receiver.start()
        elif verb == "gateway_clear":
            with contextlib.suppress(Exception):  # restarted meanwhile: its faults are gone with it
                self.gateway.faults(**{name: 0})
        elif verb == "stop":
            self.stack.kill(name, signal.SIGTERM)
        self.note(f"        {action}")

    def supervise(self) -> None:
        """Restart a core process that died on its own (e.g. lost its broker)."""
        with self.lock:
            self._supervise()

    def _supervise(self) -> None:
        for name in self.core:
            proc = self.stack.procs.get(name)
            if name in self.down or name in self.paused or proc is None or proc.poll() is None:
                continue
            self.note(f"supervisor: {name} exited with {proc.returncode}; restarting")
            self.figures.restarts_unexpected += 1
            self._reap(name)
            self.start(name)

    def run(self, plan: list[Fault], *, first_due: float, stop: threading.Event) -> None:
        """Inject the plan on schedule; return once every fault has ended."""
        pending: list[tuple[float, int, object]] = [(first_due + f.at, i, f) for i, f in enumerate(plan)]
        seq = len(pending)
        deferred: Counter = Counter()
        while pending and not stop.is_set():
            pending.sort(key=lambda item: (item[0], item[1]))
            when, _, item = pending[0]
            if time.time() < when:
                self.supervise()
                time.sleep(min(0.2, max(0.0, when - time.time())))
                continue
            pending.pop(0)
            with self.lock:
                if isinstance(item, Fault):
                    self.note(f"inject  {item.describe()}")
                    follow = self.begin(item)
                    if follow == "later" and deferred[item] < 20:
                        deferred[item] += 1
                        seq += 1
                        pending.append((time.time() + 1.0, seq, item))
                        continue
                    if follow is None or follow == "later":
                        continue
                    self.figures.injected[item.kind] += 1
                    for delay, action in follow:
                        seq += 1
                        pending.append((time.time() + delay, seq, action))
                else:
                    self.follow_up(item)
        # A zombie may still be paused: the faults are over when it has been resumed.
        while any(t.name == "zombie" and t.is_alive() for t in threading.enumerate()) and not stop.is_set():
            self.supervise()
            time.sleep(0.2)

    def resume_everything(self) -> None:
        with self.lock:
            self.stopping = True
            self._resume_all()

    def _resume_all(self) -> None:
        for pgid in self.paused.values():
            try:
                os.killpg(pgid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.paused.clear()


def child_pids(pid: int) -> list[int]:
    """The direct children of ``pid`` (a Celery worker's prefork pool)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def cancel_while_draining(workload: Workload, figures: Figures, stop: threading.Event) -> None:
    """Cancel the chosen payments at their moments, racing the claim; remember each answer
    (the cancelled payment, or "not cancellable: <status>") to check against the end state."""
    try:
        for offset, payment_id in workload.cancels:
            while not stop.is_set() and time.time() < workload.first_due + offset:
                # max(0, ...): the moment may pass between the check and the subtraction.
                time.sleep(max(0.0, min(0.05, workload.first_due + offset - time.time())))
            if stop.is_set():
                return
            answer = None
            for _ in range(20):
                try:
                    owner = ScheduledPayment.objects.select_related("payer").get(pk=payment_id).payer
                    answer = payment_cancel(payment_id=payment_id, actor=owner).status
                    break
                except (PaymentNotCancellable, PayoutOutcomeUnknown) as exc:
                    answer = exc.status
                    break
                except DB_ERRORS:
                    connection.close()  # PostgreSQL is restarting; a repeated cancel is idempotent
                    time.sleep(0.5)
            if answer is None:
                figures.cancels_unknown += 1
                continue
            figures.cancel_answers[payment_id] = answer
            if answer == PaymentStatus.CANCELLED:
                figures.cancels_won += 1
            else:
                figures.cancels_lost += 1
    finally:
        connections.close_all()


def use_private_database(pg: PrivatePostgres) -> None:
    """Point this process's default connection at the private cluster (the settings dict
    is shared by every thread's connection)."""
    connections.close_all()
    connections.settings["default"].update(pg.settings_overrides())


def stack_env(options: Options, redis: PrivateRedis) -> dict[str, str]:
    """The processes' environment; DATABASE_URL is the private cluster's (Stack takes it
    from this process's connection, repointed by use_private_database)."""
    return {
        "REDIS_URL": redis.url,
        "DELAYPAY_LEASE_SECONDS": str(options.lease_seconds),
        "DELAYPAY_CLAIM_BATCH": str(options.batch),
        "DELAYPAY_INFLIGHT_CAP": str(options.inflight_cap),
        "DELAYPAY_MAX_ATTEMPTS": str(options.max_attempts),
        "DELAYPAY_CLAIM_SHARDS": str(options.shards),
        "DELAYPAY_LOG_LEVEL": "INFO",
        **(WEBHOOK_ENV if options.webhooks else {}),
    }



def unfinished() -> int:
    return ScheduledPayment.objects.filter(
        status__in=[PaymentStatus.SCHEDULED, PaymentStatus.EXECUTING]
    ).count()


def webhook_backlog() -> int:
    """Events not fanned out yet plus deliveries still pending."""
    with connection.cursor() as cur:
        cur.execute("SELECT (SELECT count(*) FROM webhooks_event WHERE fanned_out_at IS NULL)"
                    " + (SELECT count(*) FROM webhooks_delivery WHERE status = 'pending')")
        return cur.fetchone()[0]


# Claims made in a window (a short Redis outage, 2 s after it began: a tick already
# running when Redis died may finish its claim). A claim leaves the row's claimed_at
# until a later claim supersedes it; the superseding "reclaimed" event keeps its time
# (previous_claimed_at). A first claim writes no event (decision record 0010).
CLAIMS_BETWEEN_SQL = """
SELECT (SELECT count(*) FROM payments_scheduledpayment
         WHERE claimed_at > %(after)s + interval '2 seconds' AND claimed_at < %(before)s)
     + (SELECT count(*) FROM payments_paymentevent
         WHERE kind = 'reclaimed'
           AND (data ->> 'previous_claimed_at')::timestamptz > %(after)s + interval '2 seconds'
           AND (data ->> 'previous_claimed_at')::timestamptz < %(before)s)
"""


# Per terminal payment: its events of its terminal type, and whether one of them has a
# successful delivery.
TERMINAL_EVENTS_SQL = """
WITH terminal AS (
    SELECT id, CASE status WHEN 'EXECUTED' THEN 'payment.executed'
                           WHEN 'FAILED' THEN 'payment.failed'
                           ELSE 'payment.cancelled' END AS type
      FROM payments_scheduledpayment
     WHERE status IN ('EXECUTED', 'FAILED', 'CANCELLED')
), counted AS (
    SELECT t.id, count(e.id) AS events, min(e.id) AS event_id,
           coalesce(bool_or(EXISTS (SELECT 1 FROM webhooks_delivery d
                                     WHERE d.event_id = e.id AND d.status = 'succeeded')), false) AS delivered
      FROM terminal t
      LEFT JOIN webhooks_event e ON e.payment_id = t.id AND e.type = t.type
     GROUP BY t.id
)
SELECT count(*),
       count(*) FILTER (WHERE events = 0),
       coalesce(sum(events - 1) FILTER (WHERE events > 1), 0),
       count(*) FILTER (WHERE events > 0 AND NOT delivered),
       coalesce(array_agg(event_id) FILTER (WHERE events > 0), '{}')
  FROM counted
"""

# A terminal event whose payment ended otherwise: an event without its change.
STRAY_EVENTS_SQL = """
SELECT count(*)
  FROM webhooks_event e
  JOIN payments_scheduledpayment p ON p.id = e.payment_id
 WHERE e.type IN ('payment.executed', 'payment.failed', 'payment.cancelled')
   AND e.type <> CASE p.status WHEN 'EXECUTED' THEN 'payment.executed'
                               WHEN 'FAILED' THEN 'payment.failed'
                               WHEN 'CANCELLED' THEN 'payment.cancelled'
                               ELSE '' END
"""


def webhook_figures(received: Summary, figures: Figures) -> dict:
    """The webhook checks: every terminal payment has exactly one event of its terminal
    type, none is stray, and each was delivered (the database's record) and received
    verified with a 2xx answer (the receiver's log)."""
    with connection.cursor() as cur:
        cur.execute(TERMINAL_EVENTS_SQL)
        terminal, missing, duplicated, undelivered, event_ids = cur.fetchone()
        cur.execute(STRAY_EVENTS_SQL)
        (stray,) = cur.fetchone()
        cur.execute("SELECT count(*), count(*) FILTER (WHERE status = 'succeeded'),"
                    " count(*) FILTER (WHERE status = 'failed') FROM webhooks_delivery")
        deliveries, succeeded, failed = cur.fetchone()
        cur.execute("SELECT (SELECT count(*) FROM webhooks_event), (SELECT count(*) FROM webhooks_deliveryattempt)")
        events, attempts = cur.fetchone()
    not_received = sum(1 for pk in event_ids if f"evt_{pk}" not in received.delivered)
    received_twice = sum(1 for entries in received.by_id.values()
                         if sum(e["verified"] and 200 <= e["status"] < 300 for e in entries) > 1)
    return {
        "events": events,
        "terminal_payments": terminal,
        "missing_events": missing,
        "duplicate_events": duplicated,
        "stray_events": stray,
        "deliveries": deliveries,
        "deliveries_succeeded": succeeded,
        "deliveries_failed": failed,
        "attempts": attempts,
        "requests_received": received.requests,
        "unverified": received.unverified,
        "incomplete": received.incomplete,
        "received_twice": received_twice,
        "undelivered": undelivered,
        "not_received": not_received,
        "drained": figures.webhooks_drained,
        "drain_seconds": round(figures.webhook_drain_seconds, 1),
    }


def webhooks_ok(hooks: dict | None) -> bool:
    return hooks is None or (
        hooks["drained"]
        and not (hooks["missing_events"] or hooks["duplicate_events"] or hooks["stray_events"]
                 or hooks["undelivered"] or hooks["not_received"] or hooks["unverified"])
    )


def describe_webhooks(hooks: dict | None) -> str:
    if hooks is None:
        return ""
    return (
        f" webhooks: events={hooks['events']} delivered={hooks['deliveries_succeeded']}/{hooks['deliveries']}"
        f" requests={hooks['requests_received']} received_twice={hooks['received_twice']}"
        f" unverified={hooks['unverified']} missing_events={hooks['missing_events']}"
        f" duplicate_events={hooks['duplicate_events']} stray_events={hooks['stray_events']}"
        f" undelivered={hooks['undelivered']} not_received={hooks['not_received']}"
        f" drain_s={hooks['drain_seconds']}{'' if hooks['drained'] else ' (NOT DRAINED)'}"
    )


def payout_figures(workload: Workload, gateway: SandboxGateway) -> dict:
    """The payout checks, against the gateway's own storage: for every key it holds at most
    one payout; every EXECUTED payout has exactly one there, every other none; no reserve
    is left pending; settlement reconciliation of the run's day(s) finds no mismatch, and
    finds the one then injected at the gateway (a payout paid there that we never made)."""
    paid: Counter = Counter(r["idempotency_key"] for r in gateway.all_payouts() if r["status"] == "paid")
    statuses = dict(ScheduledPayment.objects.filter(pk__in=list(workload.payouts)).values_list("id", "status"))
    reasons = Counter(ScheduledPayment.objects.filter(pk__in=list(workload.payouts), status=PaymentStatus.FAILED)
                      .values_list("failure_reason", flat=True))
    start = datetime.fromtimestamp(workload.first_due - 60, UTC).date()
    days = [start + timedelta(days=i) for i in range((datetime.now(UTC).date() - start).days + 1)]
    mismatches = sum(reconcile_settlement(rail="sandbox", day=day).mismatches for day in days)
    gateway.inject(kind="unknown_payout", amount=7, destination="acct_chaos_injected")
    injected = reconcile_settlement(rail="sandbox", day=datetime.now(UTC).date())
    return {
        "payouts": len(workload.payouts),
        "executed": sum(1 for st in statuses.values() if st == PaymentStatus.EXECUTED),
        "failed_by_reason": dict(reasons),
        "gateway_paid": sum(paid.values()),
        "keys_paid_twice": sum(1 for n in paid.values() if n > 1),
        "executed_not_paid_once": sum(1 for pid, st in statuses.items()
                                      if st == PaymentStatus.EXECUTED and paid.get(pid, 0) != 1),
        "not_executed_but_paid": sum(1 for pid, st in statuses.items()
                                     if st != PaymentStatus.EXECUTED and paid.get(pid, 0) > 0),
        "pending_reserves": PendingTransfer.objects.filter(state=PendingTransfer.State.PENDING).count(),
        "settlement_days": [d.isoformat() for d in days],
        "settlement_mismatches": mismatches,
        "injected_mismatch_found": injected.get("paid_at_rail_not_executed").count == 1 and injected.mismatches == 1,
    }


def payouts_ok(figures: dict | None) -> bool:
    return figures is None or (
        not (figures["keys_paid_twice"] or figures["executed_not_paid_once"] or figures["not_executed_but_paid"]
             or figures["pending_reserves"] or figures["settlement_mismatches"])
        and figures["injected_mismatch_found"]
    )


def describe_payouts(figures: dict | None) -> str:
    if figures is None:
        return ""
    return (
        f" payouts: {figures['executed']}/{figures['payouts']} executed gateway_paid={figures['gateway_paid']}"
        f" keys_paid_twice={figures['keys_paid_twice']} executed_not_paid_once={figures['executed_not_paid_once']}"
        f" not_executed_but_paid={figures['not_executed_but_paid']} pending_reserves={figures['pending_reserves']}"
        f" settlement_mismatches={figures['settlement_mismatches']}"
        f" injected_mismatch_found={figures['injected_mismatch_found']}"
    )


@dataclass
class Outcome:
    line: str
    ok: bool
    figures: dict


def stale_rejections_logged(log_dir: Path) -> int:
    """(payment, attempt) pairs the executors refused as stale, from their logs: duplicates
    of an attempt that already finished as well as superseded attempts (only the latter
    leave a "stale" audit row, the former find the finished attempt's row in place)."""
    count = 0
    for log in log_dir.glob("*.log"):
        with open(log, errors="replace") as lines:
            count += sum(line.count("('pay_") for line in lines if "stale attempts rejected" in line)
    return count


def long_outage_figures(figures: Figures) -> dict | None:
    """What happened to the payments due during the (first) long broker outage: how many
    were decided (executed or failed) before Redis came back, how many of those the
    promoter executed in-process, and the execution lateness of the executed ones."""
    if not figures.long_outages:
        return None
    down_at, up_at = figures.redis_outages[figures.long_outages[0]]
    if down_at is None or up_at is None:
        return None
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT count(*) FILTER (WHERE status <> 'CANCELLED'),
                   count(*) FILTER (WHERE status IN ('EXECUTED', 'FAILED') AND updated_at < %(up)s),
                   count(*) FILTER (WHERE status = 'EXECUTED' AND executed_at < %(up)s),
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM executed_at - execute_at)::float8)
                       FILTER (WHERE status = 'EXECUTED' AND executed_at < %(up)s),
                   max(extract(epoch FROM executed_at - execute_at)::float8) FILTER (WHERE status = 'EXECUTED'
                       AND executed_at < %(up)s)
              FROM payments_scheduledpayment
             WHERE execute_at >= %(down)s AND execute_at < %(up)s
            """,
            {"down": down_at, "up": up_at},
        )
        due, decided, executed, p99, worst = cur.fetchone()
        cur.execute(
            "SELECT count(*) FROM payments_executionattempt a JOIN payments_scheduledpayment p ON p.id = a.payment_id"
            " WHERE a.worker LIKE 'promoter:%%' AND a.outcome = 'executed' AND a.finished_at < %(up)s"
            " AND p.execute_at >= %(down)s AND p.execute_at < %(up)s",
            {"down": down_at, "up": up_at},
        )
        (in_process,) = cur.fetchone()
    return {
        "seconds": round((up_at - down_at).total_seconds(), 1),
        "due": due,
        "decided_during": decided,
        "executed_during": executed,
        "executed_in_process": in_process,
        "lateness_p99_s": round(p99, 2) if p99 is not None else None,
        "lateness_max_s": round(worst, 2) if worst is not None else None,
    }


def describe_long_outage(outage: dict | None) -> str:
    if outage is None:
        return ""
    p99 = "n/a" if outage["lateness_p99_s"] is None else f"{outage['lateness_p99_s']}s"
    return (
        f" long_outage={outage['seconds']}s (due={outage['due']} decided_during={outage['decided_during']}"
        f" executed_during={outage['executed_during']} in_process={outage['executed_in_process']}"
        f" lateness_p99={p99})"
    )


def duplicated_transfers() -> int:
    """Ledger transfers written more than once for one key (each extra one counts)."""
    with connection.cursor() as cur:
        cur.execute("SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM ledger_transfer"
                    " GROUP BY key HAVING count(*) > 1) d")
        return int(cur.fetchone()[0])


def early_executions() -> int:
    """Payments claimed or executed before their due instant, by the database's clock
    (there must be none: payments/release.py claims at the instant, never before)."""
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM payments_scheduledpayment"
                    " WHERE claimed_at < execute_at OR executed_at < execute_at")
        return int(cur.fetchone()[0])


def expected_balances(deposits: dict[str, int], payments: dict[str, tuple[str, str, int]],
                      statuses: dict[str, str]) -> Counter:
    """The model: deposits plus the executed payments, from the harness's own records."""
    expected = Counter(deposits)
    for pid, (source, target, amount) in payments.items():
        if statuses.get(pid) == PaymentStatus.EXECUTED:
            expected[source] -= amount
            expected[target] += amount
    return expected


def conservation_errors(expected: Counter, report) -> int:
    """Accounts whose balance is not the model's, plus reconciliation's balance checks."""
    balances = dict(Account.objects.values_list("id", "balance"))
    return (
        sum(1 for acc, amount in expected.items() if balances.get(acc) != amount)
        + report.get("balance_sum_nonzero").violations
        + report.get("balance_mismatch").violations
        + report.get("negative_user_balance").violations
    )


def measure(workload: Workload, figures: Figures, *, converged: bool, converge_seconds: float,
            options: Options, total_seconds: float, log_dir: Path, received: Summary | None = None,
            payouts: dict | None = None, replica: dict | None = None,
            housekeeping: dict | None = None) -> Outcome:
    """Every figure of the run, from the database, the reconciliation and an independent
    model of what the balances must be given the final statuses."""
    report = reconcile(stuck_after_seconds=0, overdue_after_seconds=0, sample_limit=5)
    statuses = dict(ScheduledPayment.objects.values_list("id", "status"))
    reasons = Counter(
        ScheduledPayment.objects.filter(status=PaymentStatus.FAILED).values_list("failure_reason", flat=True)
    )
    by_status = Counter(statuses.values())
    lost = sum(1 for pid in workload.payments if statuses.get(pid) not in
               (PaymentStatus.EXECUTED, PaymentStatus.FAILED, PaymentStatus.CANCELLED))
    duplicated = duplicated_transfers()
    early = early_executions()
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FILTER (WHERE outcome = 'stale'),"
                    " count(*) FILTER (WHERE worker LIKE 'promoter:%%' AND outcome <> 'stale')"
                    " FROM payments_executionattempt")
        stale_rows, in_process = cur.fetchone()
        claims_while_redis_down = 0
        for i, (down_at, up_at) in enumerate(figures.redis_outages):
            # Short outages only: in a long one the promoter claims by design (degraded mode).
            if down_at is not None and up_at is not None and i not in figures.long_outages:
                # A tick already running when Redis died may finish its claim: allow 2 s.
                cur.execute(CLAIMS_BETWEEN_SQL, {"after": down_at, "before": up_at})
                claims_while_redis_down += cur.fetchone()[0]
    outage = long_outage_figures(figures)
    hooks = webhook_figures(received, figures) if received is not None else None
    conservation = conservation_errors(expected_balances(workload.deposits, workload.payments, statuses), report)
    cancel_mismatches = sum(
        1 for pid, answer in figures.cancel_answers.items()
        if (answer == PaymentStatus.CANCELLED) != (statuses.get(pid) == PaymentStatus.CANCELLED)
    )
    injected = sum(figures.injected.values())
    kinds = " ".join(
        f"{k}={figures.injected[k]}"
        for k in [*MINIMUM_FAULTS, "workers_down", *WEBHOOK_FAULTS, *PAYOUT_FAULTS, *REPLICA_FAULTS]
        if figures.injected[k]
    )
    failed = " ".join(f"{k}={v}" for k, v in sorted(reasons.items()))
    numbers = {
        "seed": options.seed,
        "payments": len(workload.payments),
        "executed": by_status[PaymentStatus.EXECUTED],
        "failed": by_status[PaymentStatus.FAILED],
        "failed_by_reason": dict(reasons),
        "cancelled": by_status[PaymentStatus.CANCELLED],
        "needs_review": by_status[PaymentStatus.NEEDS_REVIEW],
        "faults": injected,
        "faults_by_kind": dict(figures.injected),
        "faults_skipped": dict(figures.skipped),
        "lost": lost,
        "duplicated_transfers": duplicated,
        "early_executions": early,
        "conservation_errors": conservation,
        "stale_writes_rejected": stale_rejections_logged(log_dir),
        "stale_audit_rows": stale_rows,
        "reconcile_violations": report.violations,
        "cancel_mismatches": cancel_mismatches,
        "claims_while_redis_down": claims_while_redis_down,
        "long_broker_outage": outage,
        "executed_in_process": in_process,
        "unexpected_exits": figures.restarts_unexpected,
        "redelivered": figures.redelivered,
        "webhooks": hooks,
        "payouts": payouts,
        "replica": replica,
        "housekeeping": housekeeping,
        "converged": converged,
        "converge_seconds": round(converge_seconds, 1),
        "total_seconds": round(total_seconds, 1),
        "reconcile": {c.name: c.samples for c in report.checks if not c.ok},
    }
    ok = (
        converged
        and not (lost or duplicated or early or conservation or report.violations or cancel_mismatches)
        and webhooks_ok(hooks)
        and payouts_ok(payouts)
        and replica_ok(replica)
        and (housekeeping is None or housekeeping["start_markers_left"] == 0)
    )
    line = (
        f"chaos {'PASS' if ok else 'FAIL'}: seed={options.seed} payments={numbers['payments']}"
        f" executed={numbers['executed']} failed={numbers['failed']} ({failed or 'none'})"
        f" cancelled={numbers['cancelled']} needs_review={numbers['needs_review']}"
        f" faults={injected} ({kinds or 'none'})"
        f" lost={lost} duplicated_transfers={duplicated} early={early} conservation_errors={conservation}"
        f" stale_writes_rejected={numbers['stale_writes_rejected']} (audited {stale_rows})"
        f" redelivered={figures.redelivered}"
        f" reconcile_violations={report.violations}"
        f" cancel_mismatches={cancel_mismatches} claims_while_redis_down={claims_while_redis_down}"
        f" in_process={in_process}{describe_long_outage(outage)}{describe_webhooks(hooks)}{describe_payouts(payouts)}"
        f"{describe_replica(replica)}{describe_housekeeping(housekeeping)}"
        f" converge_s={numbers['converge_seconds']}"
        f"{'' if converged else ' (NOT CONVERGED)'} total_s={numbers['total_seconds']}"
    )
    return Outcome(line=line, ok=ok, figures=numbers)


def wait_for_housekeeping(injector: "Injector", timeout: float) -> dict:
    """Wait for beat's purge (every minute) to empty the start markers, with the
    supervisor on duty; the rows left and how long it took, and the idempotency keys held."""
    started = time.monotonic()
    left = None
    while time.monotonic() < started + timeout:
        injector.supervise()
        left = db_retry(lambda: StartMarker.objects.count())
        if left == 0:
            break
        time.sleep(1)
    return {"start_markers_left": left, "seconds": round(time.monotonic() - started, 1),
            "idempotency_keys": db_retry(lambda: IdempotencyKey.objects.count())}


def describe_housekeeping(housekeeping: dict | None) -> str:
    if housekeeping is None:
        return ""
    return (f" start_markers_left={housekeeping['start_markers_left']}"
            f" (beat's purge, {housekeeping['seconds']}s after convergence)"
            f" idempotency_keys={housekeeping['idempotency_keys']}")


def run(options: Options, *, say) -> Outcome:
    """The whole run; every process and service it started is gone when it returns."""
    started = time.monotonic()
    plan = fault_plan(options)
    log_dir = Path(options.log_dir) / f"seed-{options.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "plan.txt").write_text("".join(f"{f.describe()}\n" for f in plan))
    say(f"chaos: seed={options.seed} plan={plan_digest(plan)} ({len(plan)} faults, {log_dir / 'plan.txt'}); "
        f"{options.shards} claim shard(s), {len(options.promoters)} promoter(s)")

    taken = {port for _, _, port in PrivatePostgres.clusters()}
    pg = PrivatePostgres(
        name=options.cluster, port=pick_port(options.pg_port, taken), database="delaypay_chaos",
        # A stalled worker (the zombie) must not hold its row locks for ever: PostgreSQL
        # ends a session idle inside a transaction after one lease, so the rows can be
        # re-claimed and the zombie's late commit fails and retries as a stale attempt.
        settings={"idle_in_transaction_session_timeout": str(int(options.lease_seconds * 1000))},
    )
    redis = PrivateRedis(port=pick_port(options.redis_port, {pg.port}), directory=log_dir / "redis")
    stack = None
    receiver = None
    gateway = None
    stop = threading.Event()
    canceller = None
    injector = None
    replica = None
    try:
        say(f"chaos: private PostgreSQL {pg.version}/{pg.name} on 127.0.0.1:{pg.port}, "
            f"redis-server on 127.0.0.1:{redis.port}, logs in {log_dir}")
        pg.create()
        redis.start()
        use_private_database(pg)
        call_command("migrate", interactive=False, verbosity=0)
        if options.webhooks:
            # The client's side: a receiver that knows every endpoint's secret once they exist.
            receiver = ReceiverProcess(log=log_dir / "webhooks-received.jsonl", secret_file=log_dir / "webhook-secrets",
                                       fail_first=options.webhook_fail_first,
                                       fail_share=options.webhook_fail_share).start()

        env = stack_env(options, redis)
        if options.payouts > 0:
            # The sandbox gateway, a process of the stack (the Procfile's line), and a control
            # client of it for the faults and the checks.
            gateway = SandboxGateway(port=free_port(), db_path=log_dir / "gateway-control.db")
            env |= {**PAYOUT_ENV, "DELAYPAY_RAIL_SANDBOX_URL": gateway.url}
            settings.DELAYPAY_RAIL_SANDBOX_URL = gateway.url  # this process's settlement checks
            close_rails()
        stack = Stack(log_dir, env=env)
        if options.replica:
            # Made from the migrated primary before the workload: it streams every write after.
            replica = ReplicaRun(pg, stack=stack, log_dir=log_dir, seed=options.seed)
            replica.start()
            say(f"chaos: streaming standby on 127.0.0.1:{replica.standby.cluster.port}, "
                f"web reading from it on {replica.web_url}")
        workers = [f"worker{i + 1}" for i in range(options.workers)]
        stack.start_all(workers=options.workers, concurrency=options.concurrency)
        for name in options.promoters[1:]:
            stack.start_promoter(name)
        if receiver is not None:
            stack.start_webhooks()
        if gateway is not None:
            stack.start_gateway(gateway.port)
            stack.start_payouts()
        figures = Figures()
        injector = Injector(stack=stack, pg=pg, redis=redis, options=options, figures=figures, workers=workers,
                            receiver=receiver, gateway=gateway, replica=replica)

        # Booting Celery is CPU-heavy: let it finish before timing the workload.
        stack.wait_ready([*workers, *options.promoters, *(["webhooks"] if receiver else []),
                          *(["payouts"] if gateway else [])], timeout=120)
        lead = 3.0 + options.payments / 2000  # time to write the payments before the first is due
        workload = build_workload(options, lead_seconds=lead, webhook_url=receiver.url if receiver else None)
        if receiver is not None:
            receiver.add_secrets(*workload.endpoint_secrets)
        say(f"chaos: {len(workload.payments)} payments over {len(workload.deposits)} accounts due in "
            f"{options.window:.0f}s from t+{max(0.0, workload.first_due - time.time()):.1f}s; "
            f"{len(workload.cancels)} cancels; injecting")

        if replica is not None:
            replica.start_reading(workload.payments)
        canceller = threading.Thread(target=cancel_while_draining, args=(workload, figures, stop), daemon=True)
        canceller.start()
        injector.run(plan, first_due=workload.first_due, stop=stop)
        injector.resume_everything()
        injector.supervise()
        injected_until = time.monotonic()
        say(f"chaos: faults over ({sum(figures.injected.values())} injected); converging")
        canceller.join()
        # Converge with the supervisor still on duty.
        converged = False
        deadline = time.monotonic() + options.converge_timeout
        while time.monotonic() < deadline:
            injector.supervise()
            if db_retry(unfinished) == 0:
                converged = True
                break
            time.sleep(0.25)
        waited = time.monotonic() - injected_until
        received = None
        if receiver is not None:
            # Then every event must reach the receiver, still under the supervisor.
            drain_started = time.monotonic()
            deadline = drain_started + options.webhook_drain_timeout
            while time.monotonic() < deadline:
                injector.supervise()
                if db_retry(webhook_backlog) == 0:
                    figures.webhooks_drained = True
                    break
                time.sleep(0.25)
            figures.webhook_drain_seconds = time.monotonic() - drain_started
            say(f"chaos: webhooks {'drained' if figures.webhooks_drained else 'NOT drained'} "
                f"{figures.webhook_drain_seconds:.1f}s after convergence")
        housekeeping = None
        if options.housekeeping_timeout > 0:
            housekeeping = wait_for_housekeeping(injector, options.housekeeping_timeout)
            say(f"chaos:{describe_housekeeping(housekeeping)}")
        payouts = None
        if gateway is not None:
            injector.supervise()  # the gateway must answer the checks
            payouts = db_retry(lambda: payout_figures(workload, gateway))
        replicated = None
        if replica is not None:
            injector.supervise()  # the web process must answer /metrics
            final = dict(db_retry(lambda: list(ScheduledPayment.objects.values_list("id", "status"))))
            down = [(at, up or time.time()) for at, up in figures.postgres_outages]
            replicated = replica.finish(final, primary_down=down)
            say(f"chaos: replica{describe_replica(replicated)}")
        stack.stop()
        if receiver is not None:
            receiver.stop()
            received = receiver.summary()
        outcome = measure(workload, figures, converged=converged, converge_seconds=waited, options=options,
                          total_seconds=time.monotonic() - started, log_dir=log_dir, received=received,
                          payouts=payouts, replica=replicated, housekeeping=housekeeping)
        (log_dir / "figures.json").write_text(json.dumps(outcome.figures, indent=2, default=str))
        return outcome
    finally:
        stop.set()
        if injector is not None:
            injector.resume_everything()
        if stack is not None:
            stack.stop()
        if receiver is not None:
            receiver.stop()
        if gateway is not None:
            gateway.close()
            close_rails()
        if canceller is not None:
            canceller.join(timeout=10)
        connections.close_all()
        if replica is not None:
            replica.close()
        redis.stop()
        if options.keep:
            say(f"chaos: kept cluster {pg.version}/{pg.name} (port {pg.port}); drop it with "
                f"pg_dropcluster --stop {pg.version} {pg.name}")
        elif pg.created:
            pg.drop()
