"""Celery tasks: thin wrappers that take ids, call a service and handle retries.

Never an ETA or countdown to hold a payment until it is due: the table is the
schedule. The only countdowns here are a few seconds of retry backoff.
"""

import logging
import random

from celery import shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections

from . import execution, promoter, reconciliation

logger = logging.getLogger(__name__)

TRANSIENT_ERRORS = (OperationalError, InterfaceError)


def backoff_with_jitter(retries: int, base: float = 0.5, cap: float = 10.0) -> float:
    """Full-jitter exponential backoff (AWS architecture blog): uniform in [0, min(cap, base*2^n)]."""
    return random.uniform(0, min(cap, base * 2**retries))


def publish_messages(messages) -> None:
    """Publish every message of one claim over a single producer connection."""
    with execute_batch.app.producer_or_acquire() as producer:
        for pairs in messages:
            execute_batch.apply_async(args=[pairs], producer=producer, retry=False)


def _execute_in_process(pairs) -> None:
    apply_with_isolation([tuple(p) for p in pairs], worker=f"promoter:{execution.worker_name()}")


@shared_task(name="payments.tasks.promoter_tick", ignore_result=True, acks_late=False)
def promoter_tick() -> dict:
    """Claim due payments and publish them (beat sends this every second)."""
    result = promoter.promoter_tick(publish=publish_messages, execute_in_process=_execute_in_process)
    if result.claimed:
        logger.info(
            "promoter tick claimed=%d reclaimed=%d messages=%d in_process=%d in_flight=%d capped=%s %.3fs",
            result.claimed, result.reclaimed, result.messages, result.executed_in_process,
            result.in_flight, result.capped, result.seconds,
        )
    return {"claimed": result.claimed, "reclaimed": result.reclaimed}


def apply_with_isolation(pairs, *, worker: str | None = None) -> execution.BatchResult:
    """Apply a batch; if it fails unexpectedly, bisect so one poison payment cannot hold
    the healthy ones hostage. Transient database errors propagate (the caller retries
    the whole batch)."""
    try:
        return execution.execute_batch(pairs=pairs, worker=worker)
    except TRANSIENT_ERRORS:
        raise
    except Exception as exc:
        if len(pairs) == 1:
            logger.exception("payment %s attempt %s failed unexpectedly", pairs[0][0], pairs[0][1])
            return execution.record_error(pair=pairs[0], error=f"{type(exc).__name__}: {exc}", worker=worker)
        logger.warning("batch of %d failed (%s); bisecting", len(pairs), type(exc).__name__)
    middle = len(pairs) // 2
    result = apply_with_isolation(pairs[:middle], worker=worker)
    result.merge(apply_with_isolation(pairs[middle:], worker=worker))
    return result


@shared_task(
    bind=True,
    name="payments.tasks.execute_batch",
    ignore_result=True,
    acks_late=True,
    reject_on_worker_lost=True,
)
def execute_batch(self, pairs: list[list]) -> dict:
    """Execute a claimed batch ``[[payment_id, attempt], ...]`` exactly once in effect."""
    try:
        result = apply_with_isolation([(str(p[0]), int(p[1])) for p in pairs])
    except TRANSIENT_ERRORS as exc:
        close_old_connections()
        if self.request.retries >= settings.DELAYPAY_TRANSIENT_RETRIES:
            # Give up on this message; the leases expire and the claim takes them again.
            logger.error("batch of %d gave up after %d transient errors: %s", len(pairs), self.request.retries, exc)
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
    report = reconciliation.reconcile()
    for check in report.checks:
        if not check.ok:
            logger.error(
                "RECONCILIATION VIOLATION %s: %d (%s); e.g. %s",
                check.name, check.violations, check.description, ", ".join(check.samples[:10]),
            )
    if report.ok:
        logger.info("reconciliation clean: %d payments, %.2fs", report.payments, report.seconds)
    else:
        logger.error("reconciliation found %d violations in %d payments", report.violations, report.payments)
    return {"ok": report.ok, "violations": report.violations}
