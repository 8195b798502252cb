"""The benchmark's scenarios. Each returns a JSON-able dict of figures.

Every timed scenario runs on the real processes (``devtools.processes.Stack``: the
Procfile's worker, promoter and beat lines) against a fresh database and a private
Redis, loads its payments set-based (not timed), waits for the due instant on the
database clock, and reads its figures back from the database's own timestamps.
"""

import contextlib
import os
import platform
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import redis
from django.conf import settings
from django.db import DatabaseError, connection, transaction

from common.db import database_now
from devtools.processes import Stack
from payments.promoter import claim_due, claim_params
from payments.sql import CLAIM_DUE

from . import loader
from .check import check_run
from .cpu import CpuMeter
from .measure import fetch_timings, figures, sleep_until, wait_drained
from .pgbench import run_pgbench
from .rss import RssSampler, snapshot
from .scratch import fresh_database, scratch_name, server_version
from .stats import percentile, summarize

SCENARIOS = ("burst", "hot-sender", "steady", "backlog", "memory")
DEFAULT_PAYMENTS = {"burst": 100_000, "hot-sender": 100_000, "backlog": 2_000_000, "memory": 1_000_000}
NAIVE_INCLUDE = "--include devtools.bench.naive_tasks"
NAIVE_QUEUE = "execute"  # the naive worker is the Procfile's worker line on a private Redis


class BenchError(RuntimeError):
    """A run that cannot produce honest figures (e.g. loading overran the due instant)."""


@dataclass
class Options:
    scenario: str
    payments: int | None = None
    accounts: int = 10_000
    workers: int = 1
    concurrency: int = 4
    rate: float = 300.0
    duration: float = 60.0
    jitter: int = 0
    lead: float | None = None
    timeout: float = 900.0
    pgbench_seconds: int = 15
    pgbench_clients: int = 8
    naive: bool = True
    naive_payments: int | None = None
    naive_budget: float = 300.0
    naive_rss_cap_mb: float = 3000.0
    profile: bool = False
    webhooks: bool = False  # drain twice: without the outbox, then with an endpoint, the dispatcher, a receiver
    history: int = 0  # finished payments loaded into past months' partitions before the burst
    burst: int = 0  # steady: this many more payments, all due at the middle of the stream
    redis_outage: float = 0.0  # steady: seconds the bench's Redis is down, from a third into the stream
    redis: object = None  # the bench's PrivateRedis (for --redis-outage)
    keep: bool = False
    run_id: str = field(default_factory=lambda: f"{os.getpid()}")
    say: Callable[[str], None] = print

    @property
    def n_payments(self) -> int:
        if self.payments:
            return self.payments
        if self.scenario == "steady":
            return int(self.rate * self.duration)
        return DEFAULT_PAYMENTS[self.scenario]


def machine() -> dict:
    """Context for reading the figures: the machine was shared, say how busy it was."""
    try:
        # git from PATH (bandit B607).
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,  # nosec B607
                                cwd=settings.BASE_DIR, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "postgresql": server_version(),
        "commit": commit,
    }


def knobs() -> dict:
    return {
        "claim_batch": settings.DELAYPAY_CLAIM_BATCH,
        "promoter_budget_s": settings.DELAYPAY_PROMOTER_BUDGET_SECONDS,
        "inflight_cap": settings.DELAYPAY_INFLIGHT_CAP,
        "tick_s": settings.PROMOTER_TICK_SECONDS,
        "lease_s": settings.DELAYPAY_LEASE_SECONDS,
    }


# --- processes --------------------------------------------------------------------------


def child_env(redis_url: str, **extra: str) -> dict[str, str]:
    """Environment of the Stack's processes: production settings (DEBUG off: no query
    log, no debug cursor), the private Redis, and a throw-away key if none is set."""
    return {
        "REDIS_URL": redis_url,
        "DJANGO_DEBUG": "0",
        "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY") or secrets.token_urlsafe(48),
        **extra,
    }


def flush_private_redis(url: str) -> None:
    client = redis.Redis.from_url(url)
    if client.connection_pool.connection_kwargs.get("port") == 6379:
        raise BenchError("refusing to flush the shared Redis: the bench runs on a private redis-server")
    client.flushdb()


def wait_ready(stack: Stack, names: list[str]) -> None:
    try:
        stack.wait_ready(names)
    except RuntimeError as exc:
        raise BenchError(str(exc)) from exc


def stack_pids(stack: Stack) -> dict[str, int]:
    return {name: proc.pid for name, proc in stack.procs.items() if proc.poll() is None}


def due_instant(lead: float):
    """A whole second at least ``lead`` seconds from now, on the database clock."""
    due = database_now() + timedelta(seconds=lead)
    return due.replace(microsecond=0) + timedelta(seconds=1)


def default_lead(payments: int) -> float:
    # Loading (with VACUUM ANALYZE) ran at ~30k payments/s on the shared 2-core machine;
    # allow for a busier one, and for the workers to settle.
    return 8.0 + payments / 10_000


def load_burst_and_wait(*, lead: float | None, payments: int, load: Callable[[object], None], label: str, say):
    """Load a burst due at one instant (``lead`` seconds from now, default_lead without
    one), refresh the planner's statistics, say how long it took, and sleep until the
    due instant. Returns the instant."""
    due_at = due_instant(lead if lead is not None else default_lead(payments))
    started = time.monotonic()
    load(due_at)
    loader.analyze()
    say(f"  {label} loaded in {time.monotonic() - started:.1f}s, due at {due_at:%H:%M:%S}")
    sleep_until(due_at)
    return due_at


def load_before(opts: Options, *, due_at, what: str, load: Callable[[], loader.Loaded]) -> tuple[loader.Loaded, float]:
    """Run ``load`` (not timed) and make sure it committed before the due instant."""
    started = time.monotonic()
    loaded = load()
    loader.analyze()
    seconds = time.monotonic() - started
    margin = (due_at - database_now()).total_seconds()
    opts.say(f"  loaded {loaded.payments:,} {what} in {seconds:.1f}s; due in {margin:.1f}s")
    if margin < 0.5:
        raise BenchError(
            f"loading took {seconds:.1f}s and overran the due instant; rerun with a larger --lead"
        )
    return loaded, seconds


# --- the drain scenarios: burst, hot-sender, steady --------------------------------------


def _timing(opts: Options) -> tuple[str, float]:
    if opts.scenario == "steady":
        return "even", opts.n_payments / opts.rate
    if opts.jitter:
        return "random", float(opts.jitter)
    return "at", 0.0


DRAIN_VARIANTS = ("delaypay", "no-outbox", "webhooks")


# What one payment leaves on disk: its row, its events and attempts, its transfer (with
# their indexes). The capacity model multiplies it by the rows kept.
STORED_TABLES = ("payments_scheduledpayment", "payments_paymentevent", "payments_executionattempt", "ledger_transfer")


def table_bytes() -> dict[str, int]:
    """Each table's size on disk with its indexes and TOAST (all its partitions), after the drain."""
    with connection.cursor() as cur:
        cur.execute("SELECT t, coalesce((SELECT sum(pg_total_relation_size(relid))"
                    " FROM pg_partition_tree(t::regclass)), pg_total_relation_size(t::regclass))::bigint"
                    " FROM unnest(%s::text[]) AS t", [list(STORED_TABLES)])
        return dict(cur.fetchall())


def load_history(opts: Options, log_dir: Path) -> dict:
    """Before a burst: ``opts.history`` finished payments in the past months' partitions,
    fresh statistics, a checkpoint, then the claim's latency over BACKLOG_DUE_ROWS due rows
    (each claim rolled back; the rows then drain with the burst)."""
    opts.say(f"  loading {opts.history:,} finished payments of the past 12 months")
    history = loader.load_history(payments=opts.history, accounts=opts.accounts, say=opts.say)
    loader.analyze()
    with connection.cursor() as cur:
        cur.execute("CHECKPOINT")
    loader.load_payments(payments=BACKLOG_DUE_ROWS, accounts=opts.accounts, first=BACKLOG_FIRST_DUE,
                         due_at=database_now() - timedelta(seconds=1))
    claim = claim_latency()
    (log_dir / f"history-claim-plan-{opts.history}.txt").write_text(claim.pop("plan"))
    history["claim"] = claim
    history["table_bytes"] = table_bytes()
    opts.say(f"  claim_due over {history['payments']:,} finished payments: {claim['claim_ms_p50']:.2f} ms p50 "
             f"({claim['claimed_per_call']} rows claimed)")
    return history


def wal_position() -> int:
    """The server's WAL insert position in bytes (for the WAL a drain writes)."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
        return int(cur.fetchone()[0])


def drain_delaypay(opts: Options, *, redis_url: str, log_dir: Path, variant: str = "delaypay") -> dict:
    """delaypay on the real stack: load, wait for the due instant, drain, measure, check.
    ``variant``: "delaypay" as deployed with no endpoint (the triggers ask for a
    subscriber and write no event: webhooks/0006);
    "no-outbox" with the outbox triggers disabled; "webhooks" with an endpoint for every
    payment's payer, the webhooks process and a receiver, and the delivery figures."""
    from . import webhooks

    if variant not in DRAIN_VARIANTS:
        raise ValueError(variant)
    n = opts.n_payments
    timing, window = _timing(opts)
    result: dict = {}
    name = "delaypay" if variant == "delaypay" else f"delaypay-{variant}"
    hooks = variant == "webhooks"
    with fresh_database(scratch_name(opts.run_id, name), keep=opts.keep), contextlib.ExitStack() as context:
        loader.load_accounts(accounts=opts.accounts)
        extra_failed: set[str] = set()
        if opts.history:
            result["history"] = load_history(opts, log_dir)
            extra_failed = loader.underfunded_ids(BACKLOG_FIRST_DUE, BACKLOG_FIRST_DUE + BACKLOG_DUE_ROWS - 1)
        if variant == "no-outbox":
            webhooks.disable_outbox()
        receiver = context.enter_context(webhooks.receiver(log_dir / name)) if hooks else None
        if receiver is not None:
            receiver.add_secrets(webhooks.subscribe(receiver.url))
        flush_private_redis(redis_url)
        stack = Stack(log_dir / name, env=child_env(redis_url, **(webhooks.WEBHOOK_ENV if hooks else {})))
        sampler = None
        profiler = None
        observed_hooks = None
        try:
            stack.start_all(workers=opts.workers, concurrency=opts.concurrency)
            if hooks:
                stack.start_webhooks()
            wait_ready(stack, list(stack.procs))
            sampler = RssSampler(lambda: stack_pids(stack)).start()
            due_at = due_instant(opts.lead or default_lead(n))
            burst_at = due_at + timedelta(seconds=window / 2) if opts.scenario == "steady" and opts.burst else None
            loaded, load_s = load_before(
                opts, due_at=due_at, what="payments",
                load=lambda: loader.load_payments(
                    payments=n, accounts=opts.accounts, due_at=due_at, timing=timing,
                    window_seconds=window, hot_sender=opts.scenario == "hot-sender",
                    jitter_seconds=opts.jitter if opts.scenario != "steady" else 0,
                ) if burst_at is None else loader.load_stream_and_burst(
                    payments=n, burst=opts.burst, accounts=opts.accounts, due_at=due_at, window_seconds=window,
                    burst_at=burst_at,
                ),
            )
            last_due = due_at + timedelta(seconds=window)
            sleep_until(due_at)
            meter = CpuMeter(lambda: stack_pids(stack), database=connection.settings_dict["NAME"]).start()
            wal_before = wal_position()
            if opts.profile:
                from .profile import Profiler

                profiler = Profiler(
                    {k: v for k, v in stack_pids(stack).items() if k.startswith("worker")}, log_dir / "delaypay"
                ).start()
            outage = None
            if opts.scenario == "steady" and opts.redis_outage and opts.redis is not None:
                outage = RedisOutage(opts.redis, down_at=due_at + timedelta(seconds=window / 3),
                                     seconds=opts.redis_outage, say=opts.say).start()
            opts.say(f"  due at {due_at:%H:%M:%S}: draining {loaded.payments:,} payments")
            progress = _progress_printer(opts, loaded.payments)
            observed = wait_drained(due_to=last_due, timeout=window + opts.timeout, on_poll=progress)
            if hooks:
                opts.say("  payments drained; waiting for every event to be delivered")
                observed_hooks = webhooks.wait_delivered(timeout=opts.timeout, on_poll=_backlog_printer(opts))
            # The per-payment costs of the capacity model (devtools/capacity.py): CPU seconds
            # per process kind and the WAL written, over the drain.
            result["cpu_seconds"] = meter.stop()
            result["wal_bytes"] = wal_position() - wal_before
            if profiler is not None:
                result["profile_files"] = [str(p) for p in profiler.stop()]
                profiler = None
            result.update(sampler.stop())
            sampler = None
        finally:
            if profiler is not None:
                profiler.stop()
            if sampler is not None:
                sampler.stop()
            stack.stop()
        if observed is None:
            opts.say(f"  timed out after {window + opts.timeout:.0f}s; figures cover what finished")
        timings = fetch_timings(due_from=due_at, due_to=last_due)
        result.update(figures(timings))
        if burst_at is not None:
            result["stream_and_burst"] = stream_and_burst_figures(timings, burst_at=burst_at.timestamp())
        if outage is not None:
            outage.join()
            result["redis_outage"] = outage.figures(timings)
        check = check_run(expected_failed=loader.underfunded_ids(loaded.first, loaded.last) | extra_failed)
        result.update({
            "table_bytes": table_bytes(),
            "load_s": round(load_s, 1),
            "drain_observed_s": None if observed is None else round(observed, 2),
            "expected_failed": loaded.underfunded,
            "correct": check.correct and observed is not None,
            "check": check.as_dict(),
        })
        if receiver is not None:
            receiver.stop()
            payments_done = result["drain_s"] + due_at.timestamp() if result.get("drain_s") is not None else None
            delivery = webhooks.delivery_figures(due_at=due_at.timestamp(), payments_done_at=payments_done,
                                                 received=receiver.summary())
            delivery["drain_observed_s"] = None if observed_hooks is None else round(observed_hooks, 2)
            result["webhooks"] = delivery
            result["correct"] = result["correct"] and delivery["correct"] and observed_hooks is not None
    return result


class RedisOutage:
    """Kill the bench's Redis at ``down_at`` (database clock) and start it again
    ``seconds`` later, in a thread; then the lateness of the payments due meanwhile."""

    def __init__(self, redis, *, down_at, seconds: float, say):
        self.redis, self.down_at, self.seconds, self.say = redis, down_at, seconds, say
        self.thread = threading.Thread(target=self._run, name="bench-redis-outage", daemon=True)
        self.down = self.up = None

    def start(self) -> "RedisOutage":
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            sleep_until(self.down_at)
        finally:
            connection.close()  # this thread's: the scratch database is dropped after the run
        self.down = time.time()
        self.redis.crash()
        self.say(f"  Redis killed for {self.seconds:g} s")
        time.sleep(self.seconds)
        self.redis.start()
        self.up = time.time()
        self.say("  Redis back")

    def join(self) -> None:
        self.thread.join()

    def figures(self, timings: list) -> dict:
        during = [t for t in timings if self.down <= t.due <= self.up]
        return {"seconds": round(self.up - self.down, 1), "payments_due": len(during),
                "execution_lateness_s": summarize([t.finished - t.due for t in during])}


def stream_and_burst_figures(timings: list, *, burst_at: float) -> dict:
    """The steady stream's lateness apart from the burst's (the burst's payments are the
    ones due at its instant), and the stream's while the burst drained: its payments due
    from the burst's instant to the burst's last finish."""
    burst = [t for t in timings if t.due == burst_at]
    stream = [t for t in timings if t.due != burst_at]
    burst_done = max((t.finished for t in burst), default=burst_at)
    during = [t for t in stream if burst_at <= t.due <= burst_done]
    return {
        "burst_payments": len(burst),
        "burst_drain_s": round(burst_done - burst_at, 3),
        "burst_payments_per_s": round(len(burst) / (burst_done - burst_at), 1) if burst_done > burst_at else None,
        "burst_execution_lateness_s": summarize([t.finished - t.due for t in burst]),
        "stream_payments": len(stream),
        "stream_execution_lateness_s": summarize([t.finished - t.due for t in stream]),
        "stream_during_burst_payments": len(during),
        "stream_during_burst_execution_lateness_s": summarize([t.finished - t.due for t in during]),
    }


def _backlog_printer(opts: Options) -> Callable[[int], None]:
    last = {"at": 0.0}

    def show(left: int) -> None:
        now = time.monotonic()
        if now - last["at"] >= 5 or left == 0:
            last["at"] = now
            opts.say(f"    webhook backlog {left:,}")

    return show


def _progress_printer(opts: Options, total: int) -> Callable[[int], None]:
    last = {"at": 0.0}

    def show(left: int) -> None:
        now = time.monotonic()
        if now - last["at"] >= 5 or left == 0:
            last["at"] = now
            opts.say(f"    {total - left:,}/{total:,} finished")

    return show


def drain_naive(opts: Options, *, redis_url: str, log_dir: Path) -> dict:
    """The naive approach on the same stack shape: one ETA task per payment."""
    from .naive import enqueue, wait_received

    n = opts.naive_payments or min(opts.n_payments, 20_000)
    timing, window = _timing(opts)
    if opts.scenario == "steady":
        n = opts.n_payments  # the same steady load, so lateness compares
    result: dict = {"payments_loaded": n}
    with fresh_database(scratch_name(opts.run_id, "naive"), keep=opts.keep):
        loader.load_accounts(accounts=opts.accounts)
        flush_private_redis(redis_url)
        # ETA messages sit unacknowledged until due: keep Redis from redelivering them.
        stack = Stack(log_dir / "naive", env=child_env(redis_url, DELAYPAY_VISIBILITY_TIMEOUT="7200"))
        sampler = None
        try:
            for i in range(opts.workers):
                stack.start_worker(f"worker{i + 1}", concurrency=opts.concurrency, extra_args=NAIVE_INCLUDE)
            wait_ready(stack, list(stack.procs))
            sampler = RssSampler(lambda: stack_pids(stack)).start()
            # Publishing ran at 1,000-2,500 ETA tasks/s here while the naive worker was
            # taking them in; allow for 500/s.
            due_at = due_instant(opts.lead or (default_lead(n) + n / 500))
            loaded, _ = load_before(
                opts, due_at=due_at, what="payments (naive)",
                load=lambda: loader.load_payments(
                    payments=n, accounts=opts.accounts, due_at=due_at, timing=timing,
                    window_seconds=window, hot_sender=opts.scenario == "hot-sender",
                ),
            )
            # Each ETA is its payment's execute_at, whatever the timing (even, jittered).
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT id, execute_at FROM payments_scheduledpayment WHERE id BETWEEN %s AND %s ORDER BY id",
                    [loader.payment_id(loaded.first), loader.payment_id(loaded.last)],
                )
                rows = cur.fetchall()
            enqueue_s, _ = enqueue([r[0] for r in rows], etas=[r[1] for r in rows], broker_url=redis_url)
            margin = (due_at - database_now()).total_seconds()
            opts.say(f"  enqueued {n:,} ETA tasks in {enqueue_s:.1f}s; due in {margin:.1f}s")
            if margin < 0.5:
                raise BenchError("enqueueing the naive ETA tasks overran the due instant; rerun with a larger --lead")
            wait_received(redis_url, NAIVE_QUEUE, timeout=max(1.0, margin - 0.5))
            result["rss_holding_mb"] = {k: round(v["rss_mb"], 1) for k, v in snapshot(stack_pids(stack)).items()}
            last_due = due_at + timedelta(seconds=window)
            sleep_until(due_at)
            opts.say(f"  due at {due_at:%H:%M:%S}: naive workers draining {n:,} payments")
            observed = wait_drained(due_to=last_due, timeout=window + opts.timeout,
                                    on_poll=_progress_printer(opts, n))
            result.update(sampler.stop())
            sampler = None
        finally:
            if sampler is not None:
                sampler.stop()
            stack.stop()
        result.update(figures(fetch_timings(due_from=due_at, due_to=last_due)))
        check = check_run(expected_failed=loader.underfunded_ids(loaded.first, loaded.last), audit=False)
        result.update({
            "enqueue_s": round(enqueue_s, 1),
            "enqueue_per_s": round(n / enqueue_s, 1) if enqueue_s else None,
            "drain_observed_s": None if observed is None else round(observed, 2),
            "correct": check.correct and observed is not None,
            "check": check.as_dict(),
        })
    return result


def run_drain(opts: Options, *, redis_url: str, log_dir: Path) -> dict:
    out: dict = {"scenario": opts.scenario, "payments": opts.n_payments, "accounts": opts.accounts,
                 "workers": opts.workers, "concurrency": opts.concurrency, "jitter_s": opts.jitter,
                 "cores": os.cpu_count(), "knobs": knobs()}
    if opts.scenario == "steady":
        out["rate"] = opts.rate
    pgb_before = _pgbench(opts, log_dir, "before")
    opts.say(f"delaypay: {opts.scenario}, {opts.n_payments:,} payments, {opts.accounts:,} accounts, "
             f"{opts.workers} worker(s) x {opts.concurrency}")
    if opts.webhooks:
        # The baseline is the engine without the outbox; the run that counts has it all.
        opts.say("  without webhooks: the outbox triggers disabled")
        delaypay = drain_delaypay(opts, redis_url=redis_url, log_dir=log_dir, variant="no-outbox")
        # The executor's own cost of the triggers when nobody listens (the subscription test,
        # no row: webhooks/0006), without the dispatcher and the receiver taking cores.
        opts.say("  with the triggers only: on, no endpoint (no event written), no webhooks process")
        outbox_only = drain_delaypay(opts, redis_url=redis_url, log_dir=log_dir, variant="delaypay")
        opts.say("  with webhooks: one endpoint for every event, the webhooks process, a loopback receiver")
        with_hooks = drain_delaypay(opts, redis_url=redis_url, log_dir=log_dir, variant="webhooks")
    else:
        delaypay = drain_delaypay(opts, redis_url=redis_url, log_dir=log_dir)
    out.update(delaypay)
    if opts.webhooks:
        without_pps, with_pps = delaypay.get("payments_per_s"), with_hooks.get("payments_per_s")
        outbox_pps = outbox_only.get("payments_per_s")
        out["webhooks"] = {
            **with_hooks.pop("webhooks", {}),
            "run": with_hooks,
            "payments_per_s_without": without_pps,
            "payments_per_s_with": with_pps,
            "ratio_with_vs_without": round(with_pps / without_pps, 3) if with_pps and without_pps else None,
            "payments_per_s_outbox_only": outbox_pps,
            "ratio_outbox_only_vs_without": round(outbox_pps / without_pps, 3) if outbox_pps and without_pps else None,
        }
        out["correct"] = delaypay.get("correct") and outbox_only.get("correct") and with_hooks.get("correct")
    pgb_after = _pgbench(opts, log_dir, "after")
    # The machine is shared: pgbench runs right before and right after delaypay's drain and
    # the ratio uses their mean, so a neighbour's load shifts both sides of it alike.
    pgb = {**pgb_before, "tps": round((pgb_before["tps"] + pgb_after["tps"]) / 2, 1),
           "tps_before": pgb_before["tps"], "tps_after": pgb_after["tps"]}
    out["pgbench"] = pgb
    out["pgbench_tps"] = pgb["tps"]
    pps = delaypay.get("payments_per_s")
    out["ratio_vs_pgbench"] = round(pps / pgb["tps"], 3) if pps and pgb["tps"] else None
    if opts.naive:
        opts.say("naive: one apply_async(eta=execute_at) per payment")
        try:
            naive = drain_naive(opts, redis_url=redis_url, log_dir=log_dir)
        except BenchError as exc:  # the baseline failing must not lose delaypay's figures
            opts.say(f"  naive baseline abandoned: {exc}")
            naive = {"error": str(exc)}
        naive["ratio_vs_pgbench"] = (
            round(naive["payments_per_s"] / pgb["tps"], 3) if naive.get("payments_per_s") else None
        )
        out["naive"] = naive
        out["ratio_vs_naive"] = (
            round(pps / naive["payments_per_s"], 2) if pps and naive.get("payments_per_s") else None
        )
    return out


def _pgbench(opts: Options, log_dir: Path, when: str) -> dict:
    opts.say(f"pgbench ({when}): one transfer per transaction, {opts.pgbench_clients} clients, "
             f"{opts.pgbench_seconds}s")
    result = run_pgbench(run_id=opts.run_id, accounts=opts.accounts, clients=opts.pgbench_clients,
                         seconds=opts.pgbench_seconds, log_dir=log_dir, tag=when)
    opts.say(f"  pgbench {result['tps']:,.0f} tps")
    return result


# --- backlog: claim latency as the schedule grows ----------------------------------------


BACKLOG_DUE_ROWS = 100  # "a few due rows on top of the backlog"
BACKLOG_FIRST_DUE = 9_000_000_000  # numbering of the due rows, apart from the backlog's
BACKLOG_REPEATS = 30


def claim_latency(*, repeats: int = BACKLOG_REPEATS, batch: int | None = None) -> dict:
    """Time the real ``claim_due`` and EXPLAIN ANALYZE its statement, each time in a
    transaction that is rolled back, so every repeat claims the same due rows."""
    batch = batch or settings.DELAYPAY_CLAIM_BATCH
    params = claim_params(batch=batch, lease_seconds=60, actor="bench")
    wall_ms, plan_ms, claimed = [], [], []
    plan_text = ""
    for i in range(repeats):
        with transaction.atomic():
            started = time.perf_counter()
            claim = claim_due(batch=batch, lease_seconds=60)
            wall_ms.append((time.perf_counter() - started) * 1000)
            claimed.append(len(claim))
            transaction.set_rollback(True)
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + CLAIM_DUE, params)
            plan = cur.fetchone()[0]
            plan = plan[0] if isinstance(plan, list) else plan
            plan_ms.append(plan["Execution Time"] + plan.get("Planning Time", 0.0))
            if i == 0:
                cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + CLAIM_DUE, params)
                plan_text = "\n".join(row[0] for row in cur.fetchall())
            transaction.set_rollback(True)
    return {
        "claimed_per_call": max(claimed),
        "claim_ms_p50": round(percentile(wall_ms, 50), 3),
        "claim_ms_p95": round(percentile(wall_ms, 95), 3),
        "explain_ms_p50": round(percentile(plan_ms, 50), 3),
        "explain_ms_p95": round(percentile(plan_ms, 95), 3),
        "plan": plan_text,
    }


def run_backlog(opts: Options, *, redis_url: str, log_dir: Path) -> dict:
    sizes = sorted({min(100_000, opts.n_payments), opts.n_payments})
    out: dict = {"scenario": "backlog", "payments": opts.n_payments, "accounts": opts.accounts,
                 "due_rows": BACKLOG_DUE_ROWS, "repeats": BACKLOG_REPEATS, "knobs": knobs(), "levels": {},
                 "payments_per_s": None, "pgbench_tps": None, "ratio_vs_pgbench": None,
                 "dispatch_lateness_s": None, "execution_lateness_s": None, "peak_rss_mb": None}
    with fresh_database(scratch_name(opts.run_id, "backlog"), keep=opts.keep):
        loader.load_accounts(accounts=opts.accounts)
        now = database_now()
        loader.load_payments(payments=BACKLOG_DUE_ROWS, accounts=opts.accounts, first=BACKLOG_FIRST_DUE,
                             due_at=now - timedelta(seconds=1))
        loaded = 0
        for size in sizes:
            started = time.monotonic()
            loader.load_payments(payments=size - loaded, accounts=opts.accounts, first=loaded + 1,
                                 due_at=now + timedelta(days=1), timing="random", window_seconds=30 * 86400)
            loader.analyze()
            # The load wrote gigabytes of WAL: without this, the checkpoint it triggered
            # may still be flushing (spread over minutes) while the claim is timed at one
            # size and not at the other.
            try:
                with connection.cursor() as cur:
                    cur.execute("CHECKPOINT")  # superuser or pg_checkpoint
            except DatabaseError as exc:
                opts.say(f"  (no CHECKPOINT before timing: {exc})")
            opts.say(f"  {size:,} future payments pending (loaded in {time.monotonic() - started:.0f}s)")
            loaded = size
            level = claim_latency()
            (log_dir / f"backlog-plan-{size}.txt").write_text(level.pop("plan"))
            opts.say(f"    claim_due {level['claim_ms_p50']:.2f} ms p50, EXPLAIN ANALYZE "
                     f"{level['explain_ms_p50']:.2f} ms p50 ({level['claimed_per_call']} rows claimed)")
            out["levels"][str(size)] = level
    small, large = out["levels"][str(sizes[0])], out["levels"][str(sizes[-1])]
    out["claim_ms"] = {"small": small["claim_ms_p50"], "large": large["claim_ms_p50"]}
    out["claim_latency_ratio"] = round(large["claim_ms_p50"] / small["claim_ms_p50"], 3)
    out["explain_latency_ratio"] = round(large["explain_ms_p50"] / small["explain_ms_p50"], 3)
    out["correct"] = all(level["claimed_per_call"] == BACKLOG_DUE_ROWS for level in out["levels"].values())
    return out


# --- memory: worker RSS while N future payments wait --------------------------------------


MEMORY_SMALL = 10_000
SETTLE_SECONDS = 10.0


def run_memory(opts: Options, *, redis_url: str, log_dir: Path) -> dict:
    """Worker RSS with 10K and N future payments: delaypay (in the table) vs naive (ETA
    tasks held in the worker). The naive side stops growing when ``naive_budget``
    seconds of enqueueing are spent and reports how far it got."""
    from .naive import enqueue, wait_received

    large = opts.n_payments
    out: dict = {"scenario": "memory", "payments": large, "accounts": opts.accounts, "workers": opts.workers,
                 "concurrency": opts.concurrency, "knobs": knobs(), "delaypay": {}, "naive": {},
                 "payments_per_s": None, "pgbench_tps": None, "ratio_vs_pgbench": None,
                 "dispatch_lateness_s": None, "execution_lateness_s": None}
    with fresh_database(scratch_name(opts.run_id, "memory"), keep=opts.keep):
        loader.load_accounts(accounts=opts.accounts)
        future = database_now() + timedelta(days=1)
        flush_private_redis(redis_url)
        stack = Stack(log_dir / "memory-delaypay", env=child_env(redis_url))
        try:
            stack.start_all(workers=opts.workers, concurrency=opts.concurrency)
            wait_ready(stack, list(stack.procs))
            loaded = 0
            for size in sorted({MEMORY_SMALL, large}):
                loader.load_payments(payments=size - loaded, accounts=opts.accounts, first=loaded + 1,
                                     due_at=future, timing="random", window_seconds=30 * 86400)
                loader.analyze()
                loaded = size
                time.sleep(SETTLE_SECONDS)  # several promoter ticks over the grown table
                snap = snapshot(stack_pids(stack))
                out["delaypay"][str(size)] = {k: round(v["rss_mb"], 1) for k, v in snap.items()}
                opts.say(f"  delaypay, {size:,} future payments: " + _rss_line(snap))
        finally:
            stack.stop()

        flush_private_redis(redis_url)
        stack = Stack(log_dir / "memory-naive", env=child_env(redis_url, DELAYPAY_VISIBILITY_TIMEOUT="7200"))
        try:
            for i in range(opts.workers):
                stack.start_worker(f"worker{i + 1}", concurrency=opts.concurrency, extra_args=NAIVE_INCLUDE)
            wait_ready(stack, list(stack.procs))
            eta = database_now() + timedelta(hours=1)
            held, started = 0, time.monotonic()
            deadline = started + opts.naive_budget

            def enough() -> str | None:
                """Why the naive side must stop growing now, if it must."""
                if time.monotonic() > deadline:
                    return f"the --naive-budget of {opts.naive_budget:.0f}s is spent"
                worker_mb = snapshot(stack_pids(stack)).get("worker", {}).get("rss_mb", 0.0)
                if worker_mb > opts.naive_rss_cap_mb:
                    return f"the worker holds {worker_mb:,.0f} MB (--naive-rss-cap-mb {opts.naive_rss_cap_mb:,.0f})"
                return None

            for size in sorted({MEMORY_SMALL, min(100_000, large), large}):
                ids = [loader.payment_id(i) for i in range(held + 1, size + 1)]
                _, sent = enqueue(ids, etas=[eta] * len(ids), broker_url=redis_url, stop=enough)
                received = wait_received(redis_url, NAIVE_QUEUE, timeout=max(60.0, deadline - time.monotonic()))
                held += sent
                size = held
                time.sleep(SETTLE_SECONDS / 2)
                snap = snapshot(stack_pids(stack))
                out["naive"][str(size)] = {
                    **{k: round(v["rss_mb"], 1) for k, v in snap.items()},
                    "all_received": received,
                    "redis_mb": round(redis.Redis.from_url(redis_url).info("memory")["used_memory"] / 2**20, 1),
                }
                opts.say(f"  naive, {size:,} ETA tasks held{'' if received else ' (not all received yet)'}: "
                         + _rss_line(snap) + f"; {time.monotonic() - started:.0f}s of enqueueing so far")
                reason = enough()
                if reason and held < large:
                    out["naive_stopped_because"] = reason
                    opts.say(f"  naive: stopped at {held:,} tasks: {reason}")
                    break
        finally:
            stack.stop()
    out["naive_reached"] = max((int(k) for k in out["naive"]), default=0)
    for side in ("delaypay", "naive"):
        levels = out[side]
        if len(levels) >= 2:
            lo, hi = levels[min(levels, key=int)], levels[max(levels, key=int)]
            out[f"{side}_worker_rss_growth"] = round(hi["worker"] / lo["worker"], 2) if lo.get("worker") else None
    naive_levels = sorted((int(k), v) for k, v in out["naive"].items())
    if len(naive_levels) >= 2 and out["naive_reached"] < large:
        # Held tasks cost memory linearly (one Request and one timer entry each): say what
        # the largest level would take, clearly marked as an extrapolation.
        (n0, lo), (n1, hi) = naive_levels[0], naive_levels[-1]
        per_task_kb = (hi["worker"] - lo["worker"]) * 1024 / (n1 - n0)
        out["naive_kb_per_task"] = round(per_task_kb, 2)
        out["naive_worker_mb_extrapolated"] = {str(large): round(lo["worker"] + per_task_kb * (large - n0) / 1024, 0)}
    out["peak_rss_mb"] = {"delaypay_worker": out["delaypay"].get(str(large), {}).get("worker"),
                          "naive_worker": out["naive"].get(str(out["naive_reached"]), {}).get("worker")}
    out["correct"] = True  # nothing executes here; there is nothing to check
    return out


def _rss_line(snap: dict) -> str:
    return ", ".join(f"{kind} {v['rss_mb']:.0f} MB ({v['processes']} proc)" for kind, v in sorted(snap.items()))


RUNNERS = {
    "burst": run_drain,
    "hot-sender": run_drain,
    "steady": run_drain,
    "backlog": run_backlog,
    "memory": run_memory,
}
