"""Claim shards (``bench shards``): how fast 1, 2 and 4 promoter processes claim one burst,
with DELAYPAY_CLAIM_SHARDS equal to the number of promoters, pgbench in the same run.

Each drain runs in a fresh database with the real processes as the Procfile starts them
(``promoters`` promoter processes and beat, no worker): ``--payments`` payments (100,000)
over ``--accounts`` accounts (10,000), all due at one instant. Nothing executes them, so
what is timed is the claiming alone: the claim statements, their commits and the
publishes to Redis. The in-flight cap is lifted above the burst and the lease made long
(no re-claims), so neither paces the claims. Figures, from the payments' own ``claimed_at``:

* claims/s: the burst over (last claimed_at - due instant), side by side with pgbench's
  one-transfer-per-transaction rate measured before and after the drains;
* dispatch lateness (claimed_at - due) p50/p99/max;
* per promoter process: payments claimed and ticks served (its ``promoter tick`` log
  lines), and per shard: payments claimed, so an idle process or shard shows;
* correctness: every payment claimed once (attempt 1, one ``claimed`` event each).
"""

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from django.db import connection

from devtools.processes import Stack

from . import loader
from .measure import wait_drained
from .pgbench import run_pgbench
from .scratch import fresh_database, scratch_name
from .stats import per_second, summarize

# Every payment of the burst: its due instant, when it was claimed, its attempt, and its
# claim events (a first claim writes none: no "reclaimed" event and attempt 1 when
# nothing was claimed twice).
CLAIMED_SQL = """
SELECT extract(epoch FROM p.execute_at)::float8, extract(epoch FROM p.claimed_at)::float8, p.attempt, p.status,
       (SELECT count(*) FROM payments_paymentevent e
         WHERE e.payment_id = p.id AND e.kind IN ('claimed', 'reclaimed'))
  FROM payments_scheduledpayment p
"""
LEFT_SQL = "SELECT count(*) FROM payments_scheduledpayment WHERE status = 'SCHEDULED' AND execute_at <= %s"


@dataclass
class ShardOptions:
    payments: int = 100_000
    accounts: int = 10_000
    promoters: list[int] = field(default_factory=lambda: [1, 2, 4])
    pgbench_seconds: int = 15
    lead: float | None = None
    timeout: float = 600.0
    keep: bool = False


def ticks_by_process(stack: Stack, names: list[str]) -> dict[str, dict]:
    """Each promoter's ``promoter tick`` log lines (JSON): payments claimed, ticks, shards served."""
    out = {}
    for name in names:
        claimed, ticks, shards = 0, 0, Counter()
        for line in stack.log(name).splitlines():
            if '"promoter tick"' not in line:
                continue
            try:
                record = json.loads(line[line.index("{"):])
            except ValueError:
                continue
            claimed += int(record.get("claimed", 0))
            ticks += 1
            shards[record.get("shard", "0/1")] += int(record.get("claimed", 0))
        out[name] = {"claimed": claimed, "ticks_that_claimed": ticks, "claimed_by_shard": dict(shards)}
    return out


def count_unclaimed(*, due_to) -> int:
    with connection.cursor() as cur:
        cur.execute(LEFT_SQL, [due_to])
        return cur.fetchone()[0]


def drain(opts: ShardOptions, *, promoters: int, redis_url: str, log_dir: Path, run_id: str, say) -> dict:
    from .scenarios import child_env, flush_private_redis, load_burst_and_wait, wait_ready

    name = f"shards-{promoters}"
    out: dict = {"promoters": promoters, "shards": promoters}
    with fresh_database(scratch_name(run_id, name), keep=opts.keep):
        loader.load_accounts(accounts=opts.accounts)
        flush_private_redis(redis_url)
        env = child_env(
            redis_url,
            DELAYPAY_CLAIM_SHARDS=str(promoters),
            DELAYPAY_INFLIGHT_CAP=str(2 * opts.payments),
            DELAYPAY_LEASE_SECONDS="3600",
        )
        stack = Stack(log_dir / name, env=env)
        names = [f"promoter{n + 1}" for n in range(promoters)]
        try:
            for process in names:
                stack.start_promoter(process)
            stack.start_beat()
            wait_ready(stack, [*names, "beat"])
            due_at = load_burst_and_wait(
                lead=opts.lead, payments=opts.payments, say=say,
                load=lambda due: loader.load_payments(payments=opts.payments, accounts=opts.accounts, due_at=due),
                label=f"{promoters} promoter(s), {promoters} shard(s): {opts.payments:,} payments",
            )
            observed = wait_drained(due_to=due_at, timeout=opts.timeout, poll=0.25, count=count_unclaimed)
            out["claimed_observed_s"] = None if observed is None else round(observed, 1)
            time.sleep(1.5)  # the last ticks' log lines
        finally:
            stack.stop()
        with connection.cursor() as cur:
            cur.execute(CLAIMED_SQL)
            rows = cur.fetchall()
        due = due_at.timestamp()
        claimed = sorted(c for _, c, *_ in rows if c is not None)
        last = claimed[-1] if claimed else due
        out["payments"] = len(rows)
        out["claimed"] = len(claimed)
        out["claim_s"] = round(last - due, 3)
        out["claims_per_s"] = round(len(claimed) / (last - due), 1) if last > due else None
        out["dispatch_lateness_s"] = summarize([c - d for d, c, *_ in rows if c is not None])
        out["series"] = {"claimed_per_s": per_second(claimed, start=due, end=last)}
        out["by_process"] = ticks_by_process(stack, names)
        once = all(attempt == 1 and status == "EXECUTING" and events == 0 for _, _, attempt, status, events in rows)
        out["correct"] = observed is not None and len(claimed) == opts.payments and once
    say(f"  {promoters} promoter(s): {out.get('claims_per_s')} claims/s; dispatch lateness p99 "
        f"{out['dispatch_lateness_s'].get('p99')} s; correct={out['correct']}")
    return out


def run(opts: ShardOptions, *, redis_url: str, log_dir: Path, run_id: str, say) -> dict:
    say(f"shards: {opts.payments:,} payments due at one instant, claimed by {opts.promoters} promoter(s), "
        f"as many shards; no workers")
    pgbench = []

    def measure_pgbench(when: str) -> None:
        say(f"pgbench ({when}): one transfer per transaction, 8 clients, {opts.pgbench_seconds}s")
        result = run_pgbench(run_id=run_id, accounts=opts.accounts, seconds=opts.pgbench_seconds,
                             log_dir=log_dir, tag=when)
        say(f"  pgbench {result['tps']:,.0f} tps")
        pgbench.append(result["tps"])

    measure_pgbench("before")
    drains = [drain(opts, promoters=n, redis_url=redis_url, log_dir=log_dir, run_id=run_id, say=say)
              for n in opts.promoters]
    measure_pgbench("after")
    tps = sum(pgbench) / len(pgbench)
    for d in drains:
        d["ratio_vs_pgbench"] = round(d["claims_per_s"] / tps, 3) if d.get("claims_per_s") else None
    base = drains[0].get("claims_per_s")
    for d in drains:
        d["speedup_vs_first"] = round(d["claims_per_s"] / base, 3) if base and d.get("claims_per_s") else None
    return {
        "scenario": "shards",
        "options": dict(vars(opts)),
        "pgbench_tps": round(tps, 1),
        "pgbench_runs": pgbench,
        "drains": drains,
        "correct": all(d["correct"] for d in drains),
    }


def summary(result: dict) -> str:
    lines = [f"{'promoters':>9} {'claims/s':>9} {'vs pgbench':>10} {'vs 1':>6} {'claim s':>8}   "
             f"{'dispatch p50/p99 s':>18}   per process (claimed)"]
    for d in result["drains"]:
        lat = d["dispatch_lateness_s"]
        per = ", ".join(f"{k}: {v['claimed']:,}" for k, v in d["by_process"].items())
        lines.append(f"{d['promoters']:>9} {d.get('claims_per_s')!s:>9} {d.get('ratio_vs_pgbench')!s:>10} "
                     f"{d.get('speedup_vs_first')!s:>6} {d.get('claim_s')!s:>8}   "
                     f"{lat.get('p50')!s:>8} {lat.get('p99')!s:>8}   {per}")
    lines.append(f"pgbench {result['pgbench_tps']:,.0f} tps (mean of {result['pgbench_runs']}); "
                 f"correct={result['correct']}")
    return "\n".join(lines)
