"""Per-sender fairness (``bench fairness``): one hot sender's burst and everyone else's
payments due at the same instant, with DELAYPAY_CLAIM_PER_SENDER on and off.

Two drains, each in a fresh database with the real processes (promoter, beat and the
workers, as ``bench burst``): one sender (account 1) with ``--payments`` payments (50,000)
and ``--others`` senders (1,000) with one payment each, all due at one instant, their
ids (and so their places in the due order) shuffled together; every payer funded with
exactly what it pays, recipients spread over the remaining accounts. The first drain
runs with the per-sender cap (``--cap``), the second with it off (0: plain due order).
Figures, from the payments' own timestamps:

* the other senders' execution lateness (finish - due) p50/p99/max: what the cap is for
  (target: a few seconds at most, against the hot sender's whole drain without it);
* the hot sender's, and payments/s over the whole burst (target: the cap costs at most
  about 5 %);
* correctness as every bench run: every payment EXECUTED once, the ledger balanced.
"""

import statistics
from dataclasses import dataclass
from pathlib import Path

from django.db import connection, transaction

from devtools.processes import Stack
from ledger.models import ISSUANCE_ACCOUNT_ID

from . import loader
from .check import check_run
from .measure import wait_drained
from .scratch import fresh_database, scratch_name
from .stats import per_second, summarize

HOT_ACCOUNT = 1  # acc_bench_00000001; the others are 2 .. others + 1, recipients above them
RECIPIENTS = 9_000

# The hot sender's and the others' payments, shuffled together in id order (all due at
# one instant, so the due order is the id order), to recipients above the senders.
_LOAD_SQL_HEAD = """
WITH src AS (
    SELECT g,
           CASE WHEN r <= %(others)s THEN 1 + r ELSE %(hot)s END AS f,
           %(others)s + 2 + floor(random() * (%(accounts)s - %(others)s - 1))::int AS t,
           1 + floor(random() * %(max_amount)s)::bigint AS amount
      FROM (SELECT g, row_number() OVER (ORDER BY random()) AS r
              FROM generate_series(%(first)s, %(last)s) AS g) AS s
), ins AS (
    INSERT INTO payments_scheduledpayment
           (id, payer_id, from_account_id, to_account_id, amount, execute_at, requested_execute_at,
            jitter_seconds, status, failure_reason, attempt, version, created_at, updated_at)
    SELECT 'pay_bench_' || lpad(g::text, 10, '0'), %(payer)s,
           'acc_bench_' || lpad(f::text, 8, '0'), 'acc_bench_' || lpad(t::text, 8, '0'),
           amount, %(due_at)s, %(due_at)s, 0, 'SCHEDULED', '', 0, 1, now(), now()
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
LOAD_SQL = _LOAD_SQL_HEAD + loader.FUND_PAYERS_SQL  # fixed fragments, never input

# Every finished payment of the burst: the hot sender's or not, due, claimed, finished.
FINISHED_SQL = """
SELECT from_account_id = %(hot)s, extract(epoch FROM execute_at)::float8, extract(epoch FROM claimed_at)::float8,
       extract(epoch FROM coalesce(executed_at, updated_at))::float8, status
  FROM payments_scheduledpayment WHERE status IN ('EXECUTED', 'FAILED')
"""


@dataclass
class FairnessOptions:
    hot: int = 50_000
    others: int = 1_000
    cap: int = 50  # DELAYPAY_CLAIM_PER_SENDER of the first drain
    workers: int = 1
    concurrency: int = 4
    rounds: int = 1  # pairs of drains; the order alternates (on/off, off/on, ...): the machine may be shared
    lead: float | None = None
    timeout: float = 900.0
    keep: bool = False

    @property
    def accounts(self) -> int:
        return self.others + 1 + RECIPIENTS


def load(opts: FairnessOptions, *, due_at) -> None:
    payer = loader.bench_user()
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT setseed(0.17)")
        cur.execute(LOAD_SQL, {
            "others": opts.others, "hot": HOT_ACCOUNT, "accounts": opts.accounts, "max_amount": loader.MAX_AMOUNT,
            "first": 1, "last": opts.hot + opts.others, "payer": payer.pk, "actor": f"user:{payer.pk}",
            "due_at": due_at, "issuance": ISSUANCE_ACCOUNT_ID,
        })


def group_figures(rows: list[tuple[float, float | None, float]], *, due: float) -> dict:
    """Lateness of one group of payments: (due, claimed, finished) each."""
    if not rows:
        return {"payments": 0}
    finished = sorted(f for _, _, f in rows)
    return {
        "payments": len(rows),
        "execution_lateness_s": summarize([f - d for d, _, f in rows]),
        "dispatch_lateness_s": summarize([c - d for d, c, _ in rows if c is not None]),
        "last_finished_s": round(finished[-1] - due, 3),
        "series": {"finished_per_s": per_second(finished, start=due, end=finished[-1])},
    }


def drain(opts: FairnessOptions, *, cap: int, index: int, redis_url: str, log_dir: Path, run_id: str, say) -> dict:
    from .scenarios import child_env, flush_private_redis, load_burst_and_wait, wait_ready

    name = f"fairness-{index + 1}-cap{cap}"
    total = opts.hot + opts.others
    out: dict = {"cap": cap}
    with fresh_database(scratch_name(run_id, name), keep=opts.keep):
        loader.load_accounts(accounts=opts.accounts)
        flush_private_redis(redis_url)
        stack = Stack(log_dir / name, env=child_env(redis_url, DELAYPAY_CLAIM_PER_SENDER=str(cap)))
        try:
            stack.start_all(workers=opts.workers, concurrency=opts.concurrency)
            wait_ready(stack, list(stack.procs))
            due_at = load_burst_and_wait(
                lead=opts.lead, payments=total, say=say, load=lambda due: load(opts, due_at=due),
                label=f"{name}: {opts.hot:,} from one sender + {opts.others:,} from others",
            )
            observed = wait_drained(due_to=due_at, timeout=opts.timeout)
            out["drain_observed_s"] = None if observed is None else round(observed, 1)
        finally:
            stack.stop()
        with connection.cursor() as cur:
            cur.execute(FINISHED_SQL, {"hot": loader.account_id(HOT_ACCOUNT)})
            rows = cur.fetchall()
        due = due_at.timestamp()
        last = max((f for *_, f, _ in rows), default=due)
        out["payments"] = len(rows)
        out["drain_s"] = round(last - due, 3)
        out["payments_per_s"] = round(len(rows) / (last - due), 1) if last > due else None
        out["others"] = group_figures([(d, c, f) for hot, d, c, f, _ in rows if not hot], due=due)
        out["hot"] = group_figures([(d, c, f) for hot, d, c, f, _ in rows if hot], due=due)
        check = check_run(expected_failed=set())
        out["correct"] = check.correct and observed is not None and len(rows) == total
        out["check"] = check.as_dict()
    return out


def run(opts: FairnessOptions, *, redis_url: str, log_dir: Path, run_id: str, say) -> dict:
    """The same burst with the per-sender cap and without it, ``opts.rounds`` times."""
    say(f"fairness: one sender with {opts.hot:,} payments and {opts.others:,} senders with one each, all due "
        f"at one instant; cap {opts.cap} and off, {opts.rounds} round(s)")
    common = {"redis_url": redis_url, "log_dir": log_dir, "run_id": run_id, "say": say}
    rounds = []
    for n in range(opts.rounds):
        caps = (opts.cap, 0) if n % 2 == 0 else (0, opts.cap)
        drains = {cap: drain(opts, cap=cap, index=n, **common) for cap in caps}
        rounds.append({"cap_on": drains[opts.cap], "cap_off": drains[0]})
    ratios = [r["cap_on"]["payments_per_s"] / r["cap_off"]["payments_per_s"] for r in rounds
              if r["cap_on"].get("payments_per_s") and r["cap_off"].get("payments_per_s")]
    return {
        "scenario": "fairness",
        "options": dict(vars(opts)),
        "rounds": rounds,
        "cap_on": rounds[0]["cap_on"],
        "cap_off": rounds[0]["cap_off"],
        "payments_per_s_ratio_on_vs_off": [round(r, 3) for r in ratios],
        "payments_per_s_ratio_median": round(statistics.median(ratios), 3) if ratios else None,
        "correct": all(r["cap_on"]["correct"] and r["cap_off"]["correct"] for r in rounds),
    }


def summary(result: dict) -> str:
    lines = [f"{'':12} {'payments/s':>10} {'drain s':>8}   {'others p50/p99/max s':>22}   "
             f"{'hot p50/p99/max s':>22}"]
    for n, round_ in enumerate(result["rounds"], 1):
        for label, key in (("cap on", "cap_on"), ("cap off", "cap_off")):
            run = round_[key]
            o = run["others"].get("execution_lateness_s", {})
            h = run["hot"].get("execution_lateness_s", {})
            lines.append(
                f"{n}: {label:9} {run.get('payments_per_s')!s:>10} {run.get('drain_s')!s:>8}   "
                f"{o.get('p50')!s:>6} {o.get('p99')!s:>7} {o.get('max')!s:>7}   "
                f"{h.get('p50')!s:>6} {h.get('p99')!s:>7} {h.get('max')!s:>7}"
            )
    lines.append(f"cap {result['options']['cap']}: payments/s on/off = {result['payments_per_s_ratio_on_vs_off']} "
                 f"(median {result['payments_per_s_ratio_median']}); correct={result['correct']}")
    return "\n".join(lines)
