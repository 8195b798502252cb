"""Reconciliation: check, after the fact and from the database alone, every promise the
engine makes (exactly-once money movement, conservation, liveness, a coherent history).

Each check is one set-based SQL statement (hash joins and aggregates over whole tables,
never a Python loop per row), so a run over a million payments takes seconds. All checks
read one REPEATABLE READ snapshot: a batch that commits while the report runs cannot
make the ledger and the statuses look inconsistent.

Raw SQL because these are multi-table aggregates with FULL JOINs and FILTER clauses
that the ORM cannot say; every statement lives in this module.
"""

import logging
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction

from . import services, sql_reconcile
from .models import Heartbeat

logger = logging.getLogger(__name__)


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
    "archived_totals": "archived month whose executed payments disagree with the ledger's transfers in its id range",
    "balance_sum_nonzero": "the balances of all accounts do not sum to zero",
    "balance_mismatch": "account balance differs from its credits minus its debits",
    "negative_user_balance": "user account below zero",
    "transfer_unknown_account": "ledger transfers to or from an account that does not exist",
    "stuck_executing": "EXECUTING with a lease expired for longer than the stuck threshold",
    "overdue_scheduled": "SCHEDULED and overdue by more than the overdue threshold (the sweep stalled)",
    "event_history": "payment events disagree with its status and attempt",
    "orphan_history": "payment events or attempts whose payment does not exist",
    "lookup_keys": "payment without its lookup row (payer, accounts, due time), with one that disagrees, or a lookup "
    "row without its payment",
    "attempt_history": "execution attempts disagree with its status and attempt",
    "payout_ledger": "payout whose reserve (two-phase transfer) or rail record disagrees with its status",
    "two_phase_transfers": "pending transfer without exactly its pend: transfer and the post: or void: its state says",
    "pending_transfer_stale": "funds reserved for a payout for longer than DELAYPAY_RECONCILE_PENDING_SECONDS "
    "(not parked for review)",
    "payout_to_deleted_payee": "payout pending to a deleted payee, or executed after its payee was deleted",
    "clearing_mismatch": "a rail's clearing account does not hold exactly its pending reserves",
    "webhook_events": "terminal payment with more than one webhook event, or one not of its terminal type, or none "
    "while its owner's endpoint was subscribed (or a payment not terminal with such an event)",
}

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
    params = {"limit": max(int(sample_limit), 0), "stuck": float(stuck), "overdue": float(overdue),
              "pending": float(settings.DELAYPAY_RECONCILE_PENDING_SECONDS)}
    started = time.monotonic()
    found: dict[str, tuple[int, list[str]]] = {}
    outermost = not connection.in_atomic_block
    with transaction.atomic(), connection.cursor() as cur:
        if outermost:
            cur.execute(sql_reconcile.RECONCILE_SNAPSHOT)
        for setting in sql_reconcile.RECONCILE_SESSION:
            cur.execute(setting)
        cur.execute(sql_reconcile.RECONCILE_COUNT)
        checked_at, payments = cur.fetchone()
        for check_sql in (sql_reconcile.RECONCILE_PAYMENT_LEDGER, sql_reconcile.RECONCILE_LEDGER,
                          sql_reconcile.RECONCILE_LIVENESS, sql_reconcile.RECONCILE_HISTORY,
                          sql_reconcile.RECONCILE_LOOKUP, sql_reconcile.RECONCILE_PAYOUTS,
                          sql_reconcile.RECONCILE_WEBHOOK_EVENTS):
            cur.execute(check_sql, params)
            for name, count, samples in cur.fetchall():
                found[name] = (count, [s.strip() for s in samples or []])
    checks = [
        CheckResult(name, description, *found.get(name, (0, []))) for name, description in CHECKS.items()
    ]
    return Report(checks=checks, checked_at=checked_at, seconds=time.monotonic() - started, payments=payments)


def reconcile_and_report() -> Report:
    """Reconcile (the daily beat task), feed the violations gauge, and log every violated
    check at ERROR so that a log alert fires even without Prometheus."""
    report = reconcile(sample_limit=10)
    record_reconcile_result(violations=report.violations)
    for check in report.checks:
        if not check.ok:
            logger.error(
                "RECONCILIATION VIOLATION %s: %d (%s); e.g. %s",
                check.name, check.violations, check.description, ", ".join(check.samples),
            )
    if report.ok:
        logger.info("reconciliation clean: %d payments, %.2fs", report.payments, report.seconds)
    else:
        logger.error("reconciliation found %d violations in %d payments", report.violations, report.payments)
    return report


def record_reconcile_result(*, violations: int) -> None:
    """The hook for ``reconcile``: call it after every run with the number of invariant
    violations found (0 when the ledger and the payments agree). It becomes
    ``delaypay_reconcile_violations`` and ``delaypay_reconcile_last_run_timestamp``
    (payments/collector.py reads the heartbeat at scrape time)."""
    services.heartbeat_record(name=Heartbeat.RECONCILE, value=violations)
