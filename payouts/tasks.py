"""The payouts' Celery tasks. Their names are ``payments.tasks.*`` as they were when they
lived in payments/tasks.py: messages in flight, the routes and beat's schedule name them."""

from datetime import date

from celery import shared_task

from common import db_deadline
from payments import promoter
from payments.tasks import CLAIMED_BATCH, run_claimed
from rails.base import SettlementReportUnavailable

from . import executor, settlement


@shared_task(name=promoter.PAYOUT_TASK, **CLAIMED_BATCH)
def execute_payouts(self, pairs: list[list]) -> dict:
    """Work a claimed batch of payouts ``[[payment_id, attempt], ...]``: reserve, call the
    rail outside any transaction, post or void (payouts/executor.py)."""
    return run_claimed(self, pairs, executor.run_payout_batch)


@shared_task(name="payments.tasks.reconcile_settlement_daily", bind=True, ignore_result=True, max_retries=12)
def reconcile_settlement_daily(self, day: str | None = None) -> dict:
    """Reconcile every rail's settlement report of ``day`` (default yesterday, UTC; beat,
    daily). A rail that does not answer is tried again every 10 minutes for two hours,
    the day pinned so that a retry after midnight checks the same day."""
    target = date.fromisoformat(day) if day else settlement.yesterday_utc()
    try:
        with db_deadline.unbounded():  # a day's payouts against the rail's report
            reports = settlement.reconcile_settlement_all(day=target)
    except SettlementReportUnavailable as exc:
        raise self.retry(exc=exc, countdown=600, kwargs={"day": target.isoformat()}) from exc
    return {"day": target.isoformat(), "mismatches": sum(r.mismatches for r in reports)}
