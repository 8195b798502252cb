"""Celery tasks: thin wrappers that take ids, call a service and handle retries.

Never an ETA or countdown to hold a payment until it is due: the table is the
schedule. The only countdowns here are a few seconds of retry backoff.
"""

import logging
import random
import time

from celery import shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections

from . import execution, metrics, promoter, reconciliation, services
from .models import Heartbeat
from .recurring import recurring_generate_due

logger = logging.getLogger(__name__)
# One line per payment outcome (payment_id, attempt, worker, outcome, timings): failures,
# stale attempts and re-claims at INFO; every successful execution at DEBUG (thousands a
# second at full speed; the attempt rows in the database keep the same record).
outcome_logger = logging.getLogger("payments.outcomes")

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
    run_batch([tuple(p) for p in pairs], worker=f"promoter:{execution.worker_name()}")


@shared_task(name="payments.tasks.promoter_tick", ignore_result=True, acks_late=False)
def promoter_tick() -> dict:
    """Generate due recurring occurrences, then claim due payments and publish them
    (beat sends this every second)."""
    recurring_generate_due()
    result = promoter.promoter_tick(publish=publish_messages, execute_in_process=_execute_in_process)
    services.heartbeat_record(name=Heartbeat.PROMOTER)
    metrics.record_tick(result)
    for payment_id, attempt in result.reclaimed_pairs:
        outcome_logger.info(
            "payment reclaimed after its lease expired",
            extra={"payment_id": payment_id, "attempt": attempt, "outcome": "reclaimed"},
        )
    if result.claimed:
        logger.info(
            "promoter tick",
            extra={
                "claimed": result.claimed,
                "reclaimed": result.reclaimed,
                "messages": result.messages,
                "executed_in_process": result.executed_in_process,
                "in_flight": result.in_flight,
                "capped": result.capped,
                "tick_ms": round(result.seconds * 1000, 1),
                "max_dispatch_lateness_s": round(max(result.dispatch_lateness, default=0.0), 3),
            },
        )
    return {"claimed": result.claimed, "reclaimed": result.reclaimed}


def log_outcomes(result: execution.BatchResult, pairs, *, worker: str, seconds: float) -> None:
    """The batch's summary line, and one line per payment outcome."""
    stale = set(result.stale)
    attempts = {payment_id: attempt for payment_id, attempt in pairs if (payment_id, attempt) not in stale}
    common = {"worker": worker}
    if outcome_logger.isEnabledFor(logging.DEBUG):
        for payment_id, lateness in zip(result.executed, result.execution_lateness, strict=False):
            outcome_logger.debug("payment executed", extra={
                **common, "payment_id": payment_id, "attempt": attempts.get(payment_id), "outcome": "executed",
                "execution_lateness_s": round(lateness, 3),
            })
        for payment_id in result.already_applied:
            outcome_logger.debug("payment already applied", extra={
                **common, "payment_id": payment_id, "attempt": attempts.get(payment_id), "outcome": "already_applied",
            })
    for payment_id, reason in result.failed.items():
        outcome_logger.info("payment failed", extra={
            **common, "payment_id": payment_id, "attempt": attempts.get(payment_id), "outcome": "failed",
            "failure_reason": reason,
        })
    for payment_id, attempt in result.stale:
        outcome_logger.info("stale attempt changed nothing", extra={
            **common, "payment_id": payment_id, "attempt": attempt, "outcome": "stale",
        })
    logger.info("batch applied", extra={
        **common,
        "payments": len(pairs),
        "executed": len(result.executed),
        "already_applied": len(result.already_applied),
        "failed": len(result.failed),
        "stale": len(result.stale),
        "apply_ms": round(seconds * 1000, 1),
        "max_execution_lateness_s": round(max(result.execution_lateness, default=0.0), 3),
    })


def run_batch(pairs, *, worker: str | None = None) -> execution.BatchResult:
    """apply_with_isolation, timed, counted and logged (the one place a batch is recorded)."""
    worker = worker or execution.worker_name()
    started = time.perf_counter()
    result = apply_with_isolation(pairs, worker=worker)
    seconds = time.perf_counter() - started
    metrics.record_batch(result, seconds=seconds)
    log_outcomes(result, pairs, worker=worker, seconds=seconds)
    return result


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
            metrics.record_error()
            outcome_logger.exception("payment failed unexpectedly", extra={
                "payment_id": pairs[0][0], "attempt": pairs[0][1], "worker": worker, "outcome": "error",
            })
            return execution.record_error(pair=pairs[0], error=f"{type(exc).__name__}: {exc}", worker=worker)
        logger.warning("batch failed; bisecting", extra={"payments": len(pairs), "error": type(exc).__name__})
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
    report = reconciliation.reconcile(sample_limit=10)
    metrics.record_reconcile_result(violations=report.violations)
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
    return {"ok": report.ok, "violations": report.violations}
