"""The payouts burst (``bench payouts``): payouts through the sandbox gateway at a paced
rate, and what they do to internal transfers due at the same instant.

Two drains, each in a fresh database with the real processes (worker, promoter, beat,
and for the second the Procfile's ``payouts`` and ``gateway``): first the internal
payments alone (the baseline), then the same internal payments plus the payouts, all
due at one instant, the gateway answering each call after ``--rail-latency-ms`` and the
rail paced at ``--rail-rate`` payouts a second. Figures:

* payouts/s: executed payouts over the span from the first to the last one the rail
  paid, against the configured limit (target: at least 90 % of it);
* internal transfers: their drain rate and lateness in the mixed burst against the
  baseline (target: not slowed, i.e. within the run-to-run noise);
* correctness: every payout EXECUTED with exactly one payout at the gateway (none for
  the planted declines), no reserve left pending, the reconciliation clean.
"""

import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from django.db import connection, transaction

from devtools.gateway import SandboxGateway
from devtools.processes import Stack
from ledger.models import ISSUANCE_ACCOUNT_ID
from payments.reconciliation import reconcile

from . import loader
from .measure import sleep_until
from .scratch import fresh_database, scratch_name
from .stats import per_second, summarize

DECLINE_EVERY = 100  # every 100th payout goes to a payee the gateway always declines

_PAYOUTS_SQL_HEAD = """
WITH src AS (
    SELECT g, 1 + floor(random() * %(accounts)s)::int AS f, 1 + floor(random() * %(max_amount)s)::bigint AS amount
      FROM generate_series(%(first)s, %(last)s) AS g
), ins AS (
    INSERT INTO payments_scheduledpayment
           (id, payer_id, from_account_id, to_payee_id, rail, amount, execute_at, requested_execute_at,
            jitter_seconds, status, failure_reason, attempt, version, created_at, updated_at)
    SELECT %(id_prefix)s || lpad(g::text, 16, '0'), %(payer)s, 'acc_bench_' || lpad(f::text, 8, '0'),
           CASE WHEN g %% %(decline_every)s = 0 THEN %(decline_payee)s ELSE %(payee)s END, 'sandbox',
           amount, %(due_at)s::timestamptz + (g - %(first)s) * make_interval(secs => %(step)s),
           %(due_at)s::timestamptz + (g - %(first)s) * make_interval(secs => %(step)s), 0, 'SCHEDULED', '', 0, 1,
           now(), now()
      FROM src
 RETURNING id, from_account_id, amount, execute_at
), created AS (
    INSERT INTO payments_paymentevent
           (payment_id, kind, from_status, to_status, attempt, actor, actor_user_id, data, created_at)
    SELECT id, 'created', '', 'SCHEDULED', 0, %(actor)s, %(payer)s,
           jsonb_build_object('amount', amount, 'execute_at', execute_at), now()
      FROM ins
), need AS (
    SELECT from_account_id AS account_id, sum(amount) AS total FROM ins GROUP BY from_account_id
"""
PAYOUTS_SQL = _PAYOUTS_SQL_HEAD + loader.FUND_PAYERS_SQL  # fixed fragments, never input

# Finished payments of the burst by kind: due, finished (executed_at or the failure's
# updated_at), status.
FINISHED_SQL = """
SELECT rail <> '' AS payout, extract(epoch FROM execute_at)::float8,
       extract(epoch FROM coalesce(executed_at, updated_at))::float8, status
  FROM payments_scheduledpayment WHERE status IN ('EXECUTED', 'FAILED')
"""

UNFINISHED_SQL = """
SELECT count(*) FILTER (WHERE rail = ''), count(*) FILTER (WHERE rail <> '')
  FROM payments_scheduledpayment WHERE status IN ('SCHEDULED', 'EXECUTING', 'NEEDS_REVIEW')
"""


@dataclass
class PayoutOptions:
    payouts: int = 20_000
    internal: int = 20_000
    accounts: int = 10_000
    rate: float = 1000.0  # DELAYPAY_RAIL_RATE_LIMIT
    latency_ms: int = 20  # the gateway's answer time
    workers: int = 1
    concurrency: int = 4
    payout_concurrency: int = 4  # prefork children of the payouts process
    rail_threads: int = 16  # DELAYPAY_RAIL_CONCURRENCY
    rail_batch: int = 200  # DELAYPAY_RAIL_CLAIM_BATCH
    lead: float = 15.0
    timeout: float = 600.0
    keep: bool = False
    steady_rate: float = 0.0  # payouts due per second, evenly (--payout-steady): the on-time run
    duration: float = 30.0


def load_payouts(*, payouts: int, accounts: int, due_at, first: int, step: float = 0.0) -> None:
    """``payouts`` SCHEDULED payouts numbered from ``first``, to one payee of the bench
    user (every DECLINE_EVERY-th to a payee the gateway declines), funded by deposits;
    all due at ``due_at``, or one every ``step`` seconds from it."""
    from payments.models import Payee

    payer = loader.bench_user()
    payee = Payee.objects.create(owner=payer, name="bench payee", rail="sandbox", destination="acct_bench")
    decline = Payee.objects.create(owner=payer, name="bench decline", rail="sandbox", destination="decline-bench")
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT setseed(0.24)")
        cur.execute(PAYOUTS_SQL, {
            "accounts": accounts, "max_amount": loader.MAX_AMOUNT, "first": first, "last": first + payouts - 1,
            "payer": payer.pk, "payee": payee.id, "decline_payee": decline.id, "decline_every": DECLINE_EVERY,
            "due_at": due_at, "actor": f"user:{payer.pk}", "issuance": ISSUANCE_ACCOUNT_ID,
            "id_prefix": loader.BENCH_ID_PREFIX, "step": step,
        })


def unfinished() -> tuple[int, int]:
    with connection.cursor() as cur:
        cur.execute(UNFINISHED_SQL)
        return cur.fetchone()


def kind_figures(rows: list[tuple[float, float, str]], *, due: float) -> dict:
    """Drain, rate and lateness of one kind of payment."""
    if not rows:
        return {"payments": 0}
    finished = sorted(f for _, f, _ in rows)
    first, last = finished[0], finished[-1]
    return {
        "payments": len(rows),
        "executed": sum(1 for *_, s in rows if s == "EXECUTED"),
        "failed": sum(1 for *_, s in rows if s == "FAILED"),
        "drain_s": round(last - due, 3),
        "payments_per_s": round(len(rows) / (last - due), 1) if last > due else None,
        # From the first to the last finish: the paced rate, without the wait for the first tick.
        "paced_per_s": round((len(rows) - 1) / (last - first), 1) if last > first else None,
        "execution_lateness_s": summarize([f - d for d, f, _ in rows]),
        "series": {"finished_per_s": per_second(finished, start=due, end=last)},
    }


def gateway_check(gateway: SandboxGateway) -> dict:
    """Every EXECUTED payout has exactly one payout at the gateway, every FAILED one none;
    and when each payout reached the rail: the gateway's ``created`` of its first record
    (paid or declined) minus its ``execute_at``, on this machine's one clock (issue 35's
    "a payout reaches the rail within 250 ms of its due time")."""
    paid: dict[str, int] = {}
    reached: dict[str, float] = {}
    for row in gateway.all_payouts():
        key = row["idempotency_key"]
        if row["status"] == "paid":
            paid[key] = paid.get(key, 0) + 1
        at = datetime.fromisoformat(row["created"].replace("Z", "+00:00")).timestamp()
        reached[key] = min(at, reached.get(key, at))
    with connection.cursor() as cur:
        cur.execute("SELECT id, status, extract(epoch FROM execute_at)::float8 FROM payments_scheduledpayment"
                    " WHERE rail <> ''")
        rows = cur.fetchall()
        cur.execute("SELECT count(*) FROM ledger_pendingtransfer WHERE state = 'pending'")
        (pending,) = cur.fetchone()
    wrong = sum(1 for pid, st, _ in rows if paid.get(pid, 0) != (1 if st == "EXECUTED" else 0))
    return {"gateway_paid": sum(paid.values()), "keys_paid_twice": sum(1 for n in paid.values() if n > 1),
            "wrong": wrong, "pending_reserves": pending,
            "reached_rail_s": summarize([reached[pid] - due for pid, _, due in rows if pid in reached])}


def drain(opts: PayoutOptions, *, redis_url: str, log_dir: Path, run_id: str, with_payouts: bool, say,
          latency_ms: int = 0, step: float = 0.0) -> dict:
    from .scenarios import child_env, due_instant, flush_private_redis, wait_ready

    name = f"payouts-mixed-{latency_ms}ms" if with_payouts else "payouts-baseline"
    out: dict = {}
    with fresh_database(scratch_name(run_id, name), keep=opts.keep):
        loader.load_accounts(accounts=opts.accounts)
        flush_private_redis(redis_url)
        gateway = SandboxGateway(db_path=log_dir / name / "gateway.db") if with_payouts else None
        env = child_env(redis_url, DELAYPAY_RAIL_RATE_LIMIT=str(opts.rate),
                        DELAYPAY_RAIL_CONCURRENCY=str(opts.rail_threads),
                        DELAYPAY_RAIL_CLAIM_BATCH=str(opts.rail_batch),
                        **({"DELAYPAY_RAIL_SANDBOX_URL": gateway.url} if gateway else {}))
        stack = Stack(log_dir / name, env=env)
        try:
            stack.start_all(workers=opts.workers, concurrency=opts.concurrency)
            if gateway is not None:
                stack.start_gateway(gateway.port)
                stack.start_payouts(concurrency=opts.payout_concurrency)
            wait_ready(stack, [n for n in stack.procs if n != "gateway"])
            if gateway is not None:
                for _ in range(100):
                    try:
                        gateway.faults(latency_ms=latency_ms)
                        break
                    except Exception:
                        time.sleep(0.1)
            due_at = due_instant(opts.lead)
            if opts.internal:
                loader.load_payments(payments=opts.internal, accounts=opts.accounts, due_at=due_at)
            if with_payouts:
                load_payouts(payouts=opts.payouts, accounts=opts.accounts, due_at=due_at, first=opts.internal + 1,
                             step=step)
            loader.analyze()
            say(f"  {name}: {opts.internal:,} internal" + (f" + {opts.payouts:,} payouts" if with_payouts else "")
                + f" due at {due_at:%H:%M:%S}")
            payout_env = {k: v for k, v in env.items() if k.startswith("DELAYPAY_RAIL")}
            out["settings"] = {**payout_env, "PAYOUT_CONCURRENCY": str(opts.payout_concurrency)}
            sleep_until(due_at)
            started = time.monotonic()
            while time.monotonic() - started < opts.timeout:
                internal_left, payouts_left = unfinished()
                if internal_left == 0 and payouts_left == 0:
                    break
                time.sleep(0.5)
            out["drain_observed_s"] = round(time.monotonic() - started, 1)
            with connection.cursor() as cur:
                cur.execute(FINISHED_SQL)
                rows = cur.fetchall()
            due = due_at.timestamp()
            out["internal"] = kind_figures([(d, f, s) for p, d, f, s in rows if not p], due=due)
            if with_payouts:
                out["payouts"] = kind_figures([(d, f, s) for p, d, f, s in rows if p], due=due)
                out["gateway"] = gateway_check(gateway)
            report = reconcile(stuck_after_seconds=600, overdue_after_seconds=600)
            out["reconcile_violations"] = report.violations
        finally:
            stack.stop()
            if gateway is not None:
                gateway.close()
    return out


def run_steady(opts: PayoutOptions, *, redis_url: str, log_dir: Path, run_id: str, say) -> dict:
    """On time: ``opts.steady_rate`` payouts a second due evenly for ``opts.duration``
    seconds, no internal payment, the gateway answering at once. A payout's execution
    lateness (executed_at, after the rail's answer, minus execute_at) bounds from above
    how late it reached the rail."""
    payouts = max(1, int(opts.steady_rate * opts.duration))
    opts = PayoutOptions(**{**vars(opts), "payouts": payouts, "internal": 0})
    say(f"payouts on time: {payouts:,} payouts due evenly at {opts.steady_rate:g}/s, the gateway answering at once")
    result = drain(opts, redis_url=redis_url, log_dir=log_dir, run_id=run_id, with_payouts=True, say=say,
                   latency_ms=0, step=1 / opts.steady_rate)
    figures = result.get("payouts", {})
    gateway = result.get("gateway", {})
    return {
        "scenario": "payouts",
        "mode": "steady",
        "options": dict(vars(opts)),
        "steady_rate": opts.steady_rate,
        "payouts": figures,
        "gateway": gateway,
        "execution_lateness_s": figures.get("execution_lateness_s"),
        "reached_rail_s": gateway.get("reached_rail_s"),
        "correct": result["reconcile_violations"] == 0 and figures.get("payments") == payouts
        and figures.get("failed") == payouts // DECLINE_EVERY
        and not (gateway.get("keys_paid_twice") or gateway.get("wrong") or gateway.get("pending_reserves")),
    }


def run(opts: PayoutOptions, *, redis_url: str, log_dir: Path, run_id: str, say) -> dict:
    """Three drains of the same burst: the internal payments alone; with the payouts and a
    gateway answering at once; with the payouts and the gateway at ``opts.latency_ms``.
    The last two differ only in the rail's latency (the payouts are paced alike): their
    internal figures side by side are what the latency costs internal transfers; against
    the first, what running payouts at all costs them on the same cores."""
    if opts.steady_rate:
        return run_steady(opts, redis_url=redis_url, log_dir=log_dir, run_id=run_id, say=say)
    say(f"payouts: {opts.payouts:,} payouts at {opts.rate:g}/s (gateway {opts.latency_ms} ms) with "
        f"{opts.internal:,} internal payments due at the same instant")
    common = {"redis_url": redis_url, "log_dir": log_dir, "run_id": run_id, "say": say}
    baseline = drain(opts, with_payouts=False, **common)
    instant = drain(opts, with_payouts=True, latency_ms=0, **common)
    mixed = drain(opts, with_payouts=True, latency_ms=opts.latency_ms, **common)
    payouts = mixed.get("payouts", {})
    paced = payouts.get("paced_per_s")
    pps = {name: run["internal"].get("payments_per_s") for name, run in
           (("alone", baseline), ("gateway_0ms", instant), ("gateway_latency", mixed))}
    p99 = {name: run["internal"].get("execution_lateness_s", {}).get("p99") for name, run in
           (("alone", baseline), ("gateway_0ms", instant), ("gateway_latency", mixed))}
    expected_declines = opts.payouts // DECLINE_EVERY

    def run_correct(run: dict, with_payouts: bool) -> bool:
        gateway = run.get("gateway", {})
        ok = run["reconcile_violations"] == 0
        if with_payouts:
            p = run.get("payouts", {})
            ok = ok and p.get("payments") == opts.payouts and p.get("failed") == expected_declines and not (
                gateway.get("keys_paid_twice") or gateway.get("wrong") or gateway.get("pending_reserves"))
        return ok

    ratio = lambda a, b: round(a / b, 3) if a and b else None  # noqa: E731
    return {
        "scenario": "payouts",
        "options": dict(vars(opts)),
        "rate_limit": opts.rate,
        "payouts_per_s": paced,
        "share_of_limit": ratio(paced, opts.rate),
        "payouts_per_s_gateway_0ms": instant.get("payouts", {}).get("paced_per_s"),
        "internal_per_s": pps,
        "internal_lateness_p99_s": p99,
        "internal_ratio_latency_vs_0ms": ratio(pps["gateway_latency"], pps["gateway_0ms"]),
        "internal_ratio_latency_vs_alone": ratio(pps["gateway_latency"], pps["alone"]),
        "baseline": baseline,
        "instant": instant,
        "mixed": mixed,
        "correct": run_correct(baseline, False) and run_correct(instant, True) and run_correct(mixed, True),
    }


def summary(result: dict) -> str:
    if result.get("mode") == "steady":
        p, g, late = result["payouts"], result["gateway"], result.get("execution_lateness_s") or {}
        return (
            f"payouts on time: {p.get('executed', 0):,} executed, {p.get('failed', 0):,} declined, due evenly at "
            f"{result['steady_rate']:g}/s; execution lateness (s) p50 / p95 / p99 / max "
            + " / ".join(f"{late.get(k, 0):.3f}" for k in ("p50", "p95", "p99", "max"))
            + "\nreached the rail (s, the gateway's record minus execute_at) p50 / p95 / p99 / max "
            + " / ".join(f"{(result.get('reached_rail_s') or {}).get(k, 0):.3f}" for k in ("p50", "p95", "p99", "max"))
            + f"\ngateway: {g.get('gateway_paid')} paid, keys paid twice {g.get('keys_paid_twice')}, wrong "
            f"{g.get('wrong')}, reserves pending {g.get('pending_reserves')}; correct={result['correct']}"
        )
    p = result["mixed"].get("payouts", {})
    g = result["mixed"].get("gateway", {})
    pps, p99 = result["internal_per_s"], result["internal_lateness_p99_s"]
    return (
        f"payouts: {p.get('executed', 0):,} executed, {p.get('failed', 0):,} declined; paced "
        f"{result['payouts_per_s']}/s = {result['share_of_limit']} of the {result['rate_limit']:g}/s limit "
        f"(gateway answering at once: {result['payouts_per_s_gateway_0ms']}/s; drain {p.get('drain_s')} s)\n"
        f"internal: {pps['gateway_latency']}/s with payouts and the gateway's latency, {pps['gateway_0ms']}/s with "
        f"payouts and no latency ({result['internal_ratio_latency_vs_0ms']}), {pps['alone']}/s alone "
        f"({result['internal_ratio_latency_vs_alone']}); lateness p99 {p99['gateway_latency']} / {p99['gateway_0ms']}"
        f" / {p99['alone']} s\n"
        f"gateway: {g.get('gateway_paid')} paid, keys paid twice {g.get('keys_paid_twice')}, wrong {g.get('wrong')}, "
        f"reserves pending {g.get('pending_reserves')}; correct={result['correct']}"
    )
