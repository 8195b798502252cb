"""Celery tasks: thin wrappers that take ids, call one service and handle retries.

Never an ETA or countdown to hold a payment until it is due: the table is the
schedule. The only countdowns here are a few seconds of retry backoff.
"""

import logging
import random

from celery import shared_task
from django.conf import settings
from django.db import close_old_connections

from . import metrics, promoter, reconciliation
from .worker import TRANSIENT_ERRORS, run_batch

logger = logging.getLogger(__name__)


def backoff_with_jitter(retries: int, base: float = 0.5, cap: float = 10.0) -> float:
    """Full-jitter exponential backoff (AWS architecture blog): uniform in [0, min(cap, base*2^n)]."""
    return random.uniform(0, min(cap, base * 2**retries))


@shared_task(name="payments.tasks.promoter_tick", ignore_result=True, acks_late=False)
def promoter_tick() -> dict:
    """Generate due recurring occurrences, then claim due payments and publish them
    (beat sends this every second)."""
    result = promoter.promoter_run_tick()
    return {"claimed": result.claimed, "reclaimed": result.reclaimed}


@shared_task(
    bind=True,
    name=promoter.EXECUTE_TASK,
    ignore_result=True,
    acks_late=True,
    reject_on_worker_lost=True,
)
def execute_batch(self, pairs: list[list]) -> dict:
    """Execute a claimed batch ``[[payment_id, attempt], ...]`` exactly once in effect."""
    try:
        result = run_batch([(str(p[0]), int(p[1])) for p in pairs])
    except TRANSIENT_ERRORS as exc:
        close_old_connections()
        metrics.record_transient_error()
        if self.request.retries >= settings.DELAYPAY_TRANSIENT_RETRIES:
            # Give up on this message; the leases expire and the claim takes them again.
            logger.error("batch gave up after transient errors", extra={
                "payments": len(pairs), "retries": self.request.retries, "error": type(exc).__name__,
                "error_detail": str(exc)[:500],
            })
            return {"gave_up": len(pairs)}
        raise self.retry(exc=exc, countdown=backoff_with_jitter(self.request.retries)) from exc
    return {
        "executed": len(result.executed),
        "already_applied": len(result.already_applied),
        "failed": len(result.failed),
        "stale": len(result.stale),
    }


@shared_task(name="payments.tasks.reconcile_daily", ignore_result=True)
def reconcile_daily() -> dict:
    """Run the reconciliation (beat, daily) and log every violated check at ERROR."""
    report = reconciliation.reconcile_and_report()
    return {"ok": report.ok, "violations": report.violations}
