"""The correctness check run after every scenario, entirely in SQL.

A run is correct when
* every payment is terminal (EXECUTED, FAILED or CANCELLED);
* every EXECUTED payment has exactly one transfer, with its own accounts and amount,
  and no FAILED or CANCELLED payment has one;
* the sum of all balances is zero;
* every balance equals its credits minus its debits;
* every finished payment has the attempt row and the event of its outcome (the audit);
* optionally, exactly the payments planted as underfunded ended FAILED.
"""

from dataclasses import dataclass, field

from django.db import connection

SAMPLE = 5  # offending ids shown per violation

CHECKS: dict[str, str] = {
    "not_terminal": """
        SELECT id FROM payments_scheduledpayment
         WHERE status NOT IN ('EXECUTED', 'FAILED', 'CANCELLED')""",
    "executed_without_transfer": """
        SELECT p.id FROM payments_scheduledpayment p
         WHERE p.status = 'EXECUTED'
           AND NOT EXISTS (SELECT 1 FROM ledger_transfer t WHERE t.key = p.id)""",
    "transfer_differs_from_payment": """
        SELECT p.id FROM payments_scheduledpayment p JOIN ledger_transfer t ON t.key = p.id
         WHERE (t.debit_account_id, t.credit_account_id, t.amount)
               IS DISTINCT FROM (p.from_account_id, p.to_account_id, p.amount)""",
    "transfer_for_unexecuted_payment": """
        SELECT p.id FROM payments_scheduledpayment p JOIN ledger_transfer t ON t.key = p.id
         WHERE p.status <> 'EXECUTED'""",
    "balance_differs_from_transfers": """
        SELECT a.id FROM ledger_account a
          LEFT JOIN (SELECT credit_account_id AS id, sum(amount) AS total
                       FROM ledger_transfer GROUP BY credit_account_id) c ON c.id = a.id
          LEFT JOIN (SELECT debit_account_id AS id, sum(amount) AS total
                       FROM ledger_transfer GROUP BY debit_account_id) d ON d.id = a.id
         WHERE a.balance <> coalesce(c.total, 0) - coalesce(d.total, 0)""",
    "finished_without_attempt_row": """
        SELECT p.id FROM payments_scheduledpayment p
         WHERE p.status IN ('EXECUTED', 'FAILED')
           AND NOT EXISTS (SELECT 1 FROM payments_executionattempt x
                            WHERE x.payment_id = p.id AND x.attempt = p.attempt
                              AND x.outcome IN ('executed', 'already_applied', 'failed', 'error'))""",
    "finished_without_event": """
        SELECT p.id FROM payments_scheduledpayment p
         WHERE p.status IN ('EXECUTED', 'FAILED')
           AND NOT EXISTS (SELECT 1 FROM payments_paymentevent e
                            WHERE e.payment_id = p.id AND e.to_status = p.status)""",
}

# Transfers are unique on key, so "more than one transfer" cannot happen; the check
# above for "exactly one" is therefore "at least one".


@dataclass
class CheckResult:
    violations: dict[str, dict] = field(default_factory=dict)  # name -> {"count", "sample"}
    sum_of_balances: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # payments per status

    @property
    def correct(self) -> bool:
        return not self.violations and self.sum_of_balances == 0

    def as_dict(self) -> dict:
        return {
            "correct": self.correct,
            "violations": self.violations,
            "sum_of_balances": self.sum_of_balances,
            "status_counts": self.counts,
        }


def check_run(*, expected_failed: set[str] | None = None, audit: bool = True) -> CheckResult:
    """Check the invariants over the whole database (see the module docstring).

    ``expected_failed``: the payment ids planted as underfunded; when given, exactly
    those must be FAILED(insufficient_funds). ``audit=False`` skips the attempt/event
    checks (the naive baseline writes no audit rows).
    """
    result = CheckResult()
    with connection.cursor() as cur:
        for name, query in CHECKS.items():
            if not audit and name.startswith("finished_without_"):
                continue
            # Our own check queries, never input (bandit B608).
            cur.execute(f"SELECT count(*), (array_agg(id ORDER BY id))[1:{SAMPLE}] FROM ({query}) AS v")  # nosec B608
            count, sample = cur.fetchone()
            if count:
                result.violations[name] = {"count": count, "sample": sample}
        cur.execute("SELECT coalesce(sum(balance), 0) FROM ledger_account")
        result.sum_of_balances = int(cur.fetchone()[0])
        cur.execute("SELECT status, count(*) FROM payments_scheduledpayment GROUP BY status")
        result.counts = dict(cur.fetchall())
        if expected_failed is not None:
            cur.execute("SELECT id, failure_reason FROM payments_scheduledpayment WHERE status = 'FAILED'")
            failed = dict(cur.fetchall())
            underfunded = {pid for pid, reason in failed.items() if reason == "insufficient_funds"}
            for name, ids in (
                ("planted_underfunded_not_failed", expected_failed - underfunded),
                ("failed_but_not_planted", failed.keys() - expected_failed),
            ):
                if ids:
                    result.violations[name] = {"count": len(ids), "sample": sorted(ids)[:SAMPLE]}
    return result
