"""Reconciliation: check, after the fact and from the database alone, every promise the
engine makes (exactly-once money movement, conservation, liveness, a coherent history).

Each check is one set-based SQL statement (hash joins and aggregates over whole tables,
never a Python loop per row), so a run over a million payments takes seconds. All checks
read one REPEATABLE READ snapshot: a batch that commits while the report runs cannot
make the ledger and the statuses look inconsistent.

Raw SQL because these are multi-table aggregates with FULL JOINs and FILTER clauses
that the ORM cannot say; every statement lives in this module.
"""

import time
from dataclasses import asdict, dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction


@dataclass(frozen=True)
class CheckResult:
    name: str
    description: str
    violations: int
    samples: list[str] = field(default_factory=list)  # "<id> <detail>", at most sample_limit

    @property
    def ok(self) -> bool:
        return self.violations == 0


@dataclass(frozen=True)
class Report:
    checks: list[CheckResult]
    checked_at: datetime
    seconds: float
    payments: int

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def violations(self) -> int:
        return sum(check.violations for check in self.checks)

    def get(self, name: str) -> CheckResult:
        return next(check for check in self.checks if check.name == name)

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "violations": self.violations,
            "payments": self.payments,
            "checked_at": self.checked_at.isoformat().replace("+00:00", "Z"),
            "seconds": round(self.seconds, 3),
            "checks": [{**asdict(check), "ok": check.ok} for check in self.checks],
        }


# name -> what a violation means. The order is the report's order.
CHECKS: dict[str, str] = {
    "executed_without_transfer": "EXECUTED payment with no ledger transfer under its id",
    "duplicate_transfers": "more than one ledger transfer under one key (money moved twice)",
    "transfer_mismatch": "EXECUTED payment whose transfer has another amount or other accounts",
    "transfer_without_execution": "SCHEDULED, CANCELLED or FAILED payment that has a ledger transfer",
    "transfer_for_missing_payment": "ledger transfer keyed by a payment id that does not exist",
    "balance_sum_nonzero": "the balances of all accounts do not sum to zero",
    "balance_mismatch": "account balance differs from its credits minus its debits",
    "negative_user_balance": "user account below zero",
    "stuck_executing": "EXECUTING with a lease expired for longer than the stuck threshold",
    "overdue_scheduled": "SCHEDULED and overdue by more than the overdue threshold (the sweep stalled)",
    "event_history": "payment events disagree with its status and attempt",
    "attempt_history": "execution attempts disagree with its status and attempt",
}

# Payment <-> ledger. The ledger knows keys, not payments: payment transfers are keyed
# by the payment id, whose prefix is "pay_".
PAYMENT_LEDGER_SQL = r"""
WITH j AS (
    SELECT p.id, p.status, p.amount AS p_amount, p.from_account_id, p.to_account_id,
           t.key, t.amount, t.debit_account_id AS debit, t.credit_account_id AS credit
      FROM payments_scheduledpayment p
      FULL JOIN ledger_transfer t ON t.key = p.id
     WHERE p.id IS NOT NULL OR t.key LIKE 'pay\_%%'
), v AS (
    SELECT 'executed_without_transfer' AS name, id AS subject FROM j WHERE status = 'EXECUTED' AND key IS NULL
    UNION ALL
    -- The unique index on key makes this a walk of the index; it only finds something
    -- if that constraint was lost.
    SELECT 'duplicate_transfers', key || ' ' || count(*) || ' transfers'
      FROM ledger_transfer GROUP BY key HAVING count(*) > 1
    UNION ALL
    SELECT DISTINCT 'transfer_mismatch',
           id || ' payment ' || p_amount || ' ' || from_account_id || '->' || to_account_id
              || ', transfer ' || amount || ' ' || debit || '->' || credit
      FROM j
     WHERE status = 'EXECUTED' AND key IS NOT NULL
       AND (amount <> p_amount OR debit <> from_account_id OR credit <> to_account_id)
    UNION ALL
    SELECT DISTINCT 'transfer_without_execution', id || ' ' || status
      FROM j WHERE status IN ('SCHEDULED', 'CANCELLED', 'FAILED') AND key IS NOT NULL
    UNION ALL
    SELECT 'transfer_for_missing_payment', key FROM j WHERE id IS NULL
)
SELECT name, count(*), (array_agg(subject ORDER BY subject))[1:%(limit)s] FROM v GROUP BY name
"""

LEDGER_SQL = """
WITH e AS (
    SELECT account_id, sum(delta) AS net
      FROM (SELECT credit_account_id AS account_id, amount AS delta FROM ledger_transfer
            UNION ALL
            SELECT debit_account_id, -amount FROM ledger_transfer) entries
     GROUP BY account_id
), a AS (
    SELECT acc.id, acc.kind, acc.balance, coalesce(e.net, 0) AS net
      FROM ledger_account acc LEFT JOIN e ON e.account_id = acc.id
), v AS (
    SELECT 'balance_mismatch' AS name, id || ' balance ' || balance || ', entries ' || net AS subject
      FROM a WHERE balance <> net
    UNION ALL
    SELECT 'negative_user_balance', id || ' balance ' || balance FROM a WHERE kind = 'user' AND balance < 0
    UNION ALL
    SELECT 'balance_sum_nonzero', 'sum ' || s FROM (SELECT sum(balance) AS s FROM ledger_account) total WHERE s <> 0
)
SELECT name, count(*), (array_agg(subject ORDER BY subject))[1:%(limit)s] FROM v GROUP BY name
"""

# Served by the two partial indexes of the sweep.
LIVENESS_SQL = """
WITH v AS (
    SELECT 'stuck_executing' AS name,
           id || ' attempt ' || attempt || ', lease expired '
              || floor(extract(epoch FROM now() - lease_until))::bigint || 's ago' AS subject
      FROM payments_scheduledpayment
     WHERE status = 'EXECUTING' AND lease_until < now() - make_interval(secs => %(stuck)s)
    UNION ALL
    SELECT 'overdue_scheduled',
           id || ' due ' || floor(extract(epoch FROM now() - execute_at))::bigint || 's ago'
      FROM payments_scheduledpayment
     WHERE status = 'SCHEDULED' AND execute_at < now() - make_interval(secs => %(overdue)s)
)
SELECT name, count(*), (array_agg(subject ORDER BY subject))[1:%(limit)s] FROM v GROUP BY name
"""

# What the writers guarantee, per payment:
# * one "created" event; one claim event (claimed, then reclaimed) per attempt, the
#   last one at the payment's attempt (claim and event are one statement);
# * EXECUTED/FAILED: exactly one executed/failed event, at the final attempt, and an
#   attempt row at the final attempt that says how it ended ("error" when the error
#   path ended it); CANCELLED: one cancelled event, never claimed; SCHEDULED: nothing
#   but "created"; EXECUTING: claimed, not finished;
# * only the final attempt may finish a payment, and at most one attempt moves money.
HISTORY_SQL = """
WITH ev AS (
    SELECT payment_id,
           count(*) FILTER (WHERE kind = 'created') AS created,
           count(*) FILTER (WHERE kind = 'claimed') AS first_claims,
           count(*) FILTER (WHERE kind IN ('claimed', 'reclaimed')) AS claims,
           max(attempt) FILTER (WHERE kind IN ('claimed', 'reclaimed')) AS last_claim,
           count(*) FILTER (WHERE kind = 'executed') AS executed,
           count(*) FILTER (WHERE kind = 'failed') AS failed,
           count(*) FILTER (WHERE kind = 'cancelled') AS cancelled,
           max(attempt) FILTER (WHERE kind IN ('executed', 'failed')) AS finished_at_attempt
      FROM payments_paymentevent
     GROUP BY payment_id
), at AS (
    -- Per payment, the highest attempt of each outcome; (payment, attempt) is unique, so
    -- the outcome of the final attempt is the one whose highest attempt equals it.
    SELECT payment_id,
           count(*) AS n,
           min(attempt) AS first_attempt,
           max(attempt) AS last_attempt,
           count(*) FILTER (WHERE outcome = 'executed') AS moved,
           count(*) FILTER (WHERE outcome IN ('executed', 'already_applied', 'failed')) AS finishing,
           max(attempt) FILTER (WHERE outcome IN ('executed', 'already_applied', 'failed')) AS last_finishing,
           max(attempt) FILTER (WHERE outcome = 'executed') AS executed_at,
           max(attempt) FILTER (WHERE outcome = 'already_applied') AS already_applied_at,
           max(attempt) FILTER (WHERE outcome = 'failed') AS failed_at,
           max(attempt) FILTER (WHERE outcome = 'error') AS error_at,
           max(attempt) FILTER (WHERE outcome = 'stale') AS stale_at
      FROM payments_executionattempt
     GROUP BY payment_id
), h AS (
    SELECT p.id, p.status, p.attempt,
           concat_ws('; ',
               CASE WHEN coalesce(ev.created, 0) <> 1 THEN coalesce(ev.created, 0) || ' created events' END,
               CASE WHEN coalesce(ev.claims, 0) <> p.attempt OR coalesce(ev.last_claim, 0) <> p.attempt
                         OR coalesce(ev.first_claims, 0) <> least(p.attempt, 1)
                    THEN coalesce(ev.claims, 0) || ' claim events for attempt ' || p.attempt END,
               CASE WHEN p.status = 'EXECUTED' AND (coalesce(ev.executed, 0) <> 1 OR coalesce(ev.failed, 0) <> 0)
                    THEN 'executed with ' || coalesce(ev.executed, 0) || ' executed and '
                         || coalesce(ev.failed, 0) || ' failed events' END,
               CASE WHEN p.status = 'FAILED' AND (coalesce(ev.failed, 0) <> 1 OR coalesce(ev.executed, 0) <> 0)
                    THEN 'failed with ' || coalesce(ev.failed, 0) || ' failed and '
                         || coalesce(ev.executed, 0) || ' executed events' END,
               CASE WHEN p.status IN ('EXECUTED', 'FAILED') AND ev.finished_at_attempt IS DISTINCT FROM p.attempt
                    THEN 'finished by an event of attempt ' || coalesce(ev.finished_at_attempt::text, 'none') END,
               CASE WHEN p.status NOT IN ('EXECUTED', 'FAILED')
                         AND coalesce(ev.executed, 0) + coalesce(ev.failed, 0) > 0
                    THEN p.status || ' with a finishing event' END,
               CASE WHEN (p.status = 'CANCELLED') <> (coalesce(ev.cancelled, 0) = 1)
                         OR coalesce(ev.cancelled, 0) > 1
                    THEN p.status || ' with ' || coalesce(ev.cancelled, 0) || ' cancelled events' END,
               CASE WHEN p.status = 'EXECUTING' AND p.attempt = 0 THEN 'EXECUTING without a claim' END
           ) AS event_problem,
           concat_ws('; ',
               CASE WHEN fin.out_of_range THEN 'attempt rows outside 1..' || p.attempt END,
               CASE WHEN at.moved > 1 THEN at.moved || ' attempts moved money' END,
               CASE WHEN fin.finished_by_old_attempt > 0
                    THEN fin.finished_by_old_attempt || ' earlier attempts finished it' END,
               CASE WHEN p.status = 'EXECUTED'
                         AND fin.final_outcome IS DISTINCT FROM 'executed'
                         AND fin.final_outcome IS DISTINCT FROM 'already_applied'
                         AND fin.final_outcome IS DISTINCT FROM 'error'
                    THEN 'EXECUTED but attempt ' || p.attempt || ' is ' || coalesce(fin.final_outcome, 'missing') END,
               CASE WHEN p.status = 'FAILED'
                         AND fin.final_outcome IS DISTINCT FROM 'failed' AND fin.final_outcome IS DISTINCT FROM 'error'
                    THEN 'FAILED but attempt ' || p.attempt || ' is ' || coalesce(fin.final_outcome, 'missing') END,
               CASE WHEN p.status IN ('SCHEDULED', 'CANCELLED') AND coalesce(at.n, 0) > 0
                    THEN p.status || ' with ' || at.n || ' attempt rows' END,
               CASE WHEN p.status = 'EXECUTING'
                         AND fin.final_outcome IN ('executed', 'already_applied', 'failed')
                    THEN 'EXECUTING but attempt ' || p.attempt || ' is ' || fin.final_outcome END
           ) AS attempt_problem
      FROM payments_scheduledpayment p
      LEFT JOIN ev ON ev.payment_id = p.id
      LEFT JOIN at ON at.payment_id = p.id
      CROSS JOIN LATERAL (
          SELECT CASE p.attempt WHEN at.executed_at THEN 'executed' WHEN at.already_applied_at THEN 'already_applied'
                                WHEN at.failed_at THEN 'failed' WHEN at.error_at THEN 'error'
                                WHEN at.stale_at THEN 'stale' END AS final_outcome,
                 at.first_attempt < 1 OR at.last_attempt > p.attempt AS out_of_range,
                 at.finishing - CASE WHEN at.last_finishing = p.attempt THEN 1 ELSE 0 END AS finished_by_old_attempt
      ) fin
), v AS (
    SELECT 'event_history' AS name, id || ' ' || status || ': ' || event_problem AS subject
      FROM h WHERE event_problem <> ''
    UNION ALL
    SELECT 'attempt_history', id || ' ' || status || ': ' || attempt_problem FROM h WHERE attempt_problem <> ''
)
SELECT name, count(*), (array_agg(subject ORDER BY subject))[1:%(limit)s] FROM v GROUP BY name
"""


def reconcile(
    *,
    stuck_after_seconds: float | None = None,
    overdue_after_seconds: float | None = None,
    sample_limit: int = 20,
) -> Report:
    """Run every check over one snapshot and return the report (read-only)."""
    stuck = settings.DELAYPAY_RECONCILE_STUCK_SECONDS if stuck_after_seconds is None else stuck_after_seconds
    overdue = (
        settings.DELAYPAY_RECONCILE_OVERDUE_SECONDS if overdue_after_seconds is None else overdue_after_seconds
    )
    params = {"limit": max(int(sample_limit), 0), "stuck": float(stuck), "overdue": float(overdue)}
    started = time.monotonic()
    found: dict[str, tuple[int, list[str]]] = {}
    outermost = not connection.in_atomic_block
    with transaction.atomic(), connection.cursor() as cur:
        if outermost:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        # Whole-table hash aggregates: memory instead of spilling to disk; no JIT (seconds
        # of compiling for one run); no parallel workers (each would build the same hashes).
        cur.execute("SET LOCAL work_mem = '256MB'")
        cur.execute("SET LOCAL jit = off")
        cur.execute("SET LOCAL max_parallel_workers_per_gather = 0")
        cur.execute("SELECT now(), count(*) FROM payments_scheduledpayment")
        checked_at, payments = cur.fetchone()
        for sql in (PAYMENT_LEDGER_SQL, LEDGER_SQL, LIVENESS_SQL, HISTORY_SQL):
            cur.execute(sql, params)
            for name, count, samples in cur.fetchall():
                found[name] = (count, [s.strip() for s in samples or []])
    checks = [
        CheckResult(name, description, *found.get(name, (0, []))) for name, description in CHECKS.items()
    ]
    return Report(checks=checks, checked_at=checked_at, seconds=time.monotonic() - started, payments=payments)
