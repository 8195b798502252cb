"""Celery tasks: thin wrappers that take ids, call one service and handle retries.
The payouts' tasks are in payouts/tasks.py, the API tokens' purge in api/tasks.py; every
task keeps its name (``payments.tasks.*``): messages in flight during a deploy name it.

Never an ETA or countdown to hold a payment until it is due: the table is the
schedule. The only countdowns here are a few seconds of retry backoff.
"""

import logging

from celery import shared_task
from django.conf import settings
from django.db import close_old_connections

from common import db_deadline
from common.backoff import TASK_RETRY
from payments import execution, idempotency, metrics, partitions, promoter, reconciliation, services
from payments.models import Heartbeat

from .worker import TRANSIENT_ERRORS, run_batch

logger = logging.getLogger(__name__)


@shared_task(name="payments.tasks.promoter_tick", ignore_result=True, acks_late=False)
def promoter_tick(shard: int = 0, shards: int = 1) -> dict:
    """Generate due recurring occurrences, then claim due payments and publish them
    (beat sends this every second, once per claim shard: DELAYPAY_CLAIM_SHARDS). The
    message names its shard and the shard count, so every promoter agrees on what it
    claims whatever its own settings say."""
    result = promoter.run_tick(shard=promoter.Shard(int(shard), int(shards)))
    return {"claimed": result.claimed, "reclaimed": result.reclaimed}


@shared_task(name="payments.tasks.process_heartbeat", ignore_result=True)
def process_heartbeat(process: str) -> None:
    """Record that a process of type ``process`` took this message from its queue (beat
    sends one to the worker, payouts and webhooks queues every PROCESS_HEARTBEAT_SECONDS:
    nothing else those processes do writes a heartbeat)."""
    services.heartbeat_record(name=Heartbeat.process_name(process))


@shared_task(name="payments.tasks.purge_start_markers", ignore_result=True)
def purge_start_markers() -> dict:
    """Delete the executor's start markers no attempt needs any more (beat: every minute)."""
    return {"deleted": execution.purge_start_markers()}


@shared_task(name="payments.tasks.purge_idempotency_keys", ignore_result=True)
def purge_idempotency_keys() -> dict:
    """Delete Idempotency-Key records past their 24 hours (beat: hourly)."""
    return {"deleted": idempotency.idempotency_keys_purge()}


@shared_task(name="payments.tasks.ensure_partitions", ignore_result=True)
def ensure_partitions() -> dict:
    """Create the schedule's partitions for the months ahead that lack one (beat: hourly)."""
    with db_deadline.unbounded():  # DDL may wait behind the schedule's transactions
        return {"created": partitions.ensure_partitions()}


@shared_task(name="payments.tasks.archive_partitions", ignore_result=True)
def archive_partitions() -> dict:
    """Archive the months past DELAYPAY_RETENTION_DAYS whose payments all finished (beat: daily)."""
    with db_deadline.unbounded():  # a month's export takes as long as the month is large
        return {"archived": partitions.archive_due_months()}


def run_claimed(task, pairs: list[list], run) -> dict:
    """Run one claimed batch with ``run`` (``run_batch`` or ``run_payout_batch``); a
    transient database error retries the message with backoff, at most
    DELAYPAY_TRANSIENT_RETRIES times, then gives up on it: the leases expire and the
    claim takes the payments again."""
    try:
        result = run([(str(p[0]), int(p[1])) for p in pairs])
    except TRANSIENT_ERRORS as exc:
        close_old_connections()
        metrics.record_transient_error()
        if task.request.retries >= settings.DELAYPAY_TRANSIENT_RETRIES:
            logger.error("batch gave up after transient errors", extra={
                "task": task.name, "payments": len(pairs), "retries": task.request.retries,
                "error": type(exc).__name__, "error_detail": str(exc)[:500],
            })
            return {"gave_up": len(pairs)}
        raise task.retry(exc=exc, countdown=TASK_RETRY.delay(task.request.retries + 1)) from exc
    return {
        "executed": len(result.executed),
        "already_applied": len(result.already_applied),
        "failed": len(result.failed),
        "unknown": len(result.unknown),
        "stale": len(result.stale),
    }


# Both acknowledge late and reject on a lost worker: a message whose worker died is
# delivered again, and the attempt fence makes the redelivery harmless.
CLAIMED_BATCH = {"bind": True, "ignore_result": True, "acks_late": True, "reject_on_worker_lost": True}


@shared_task(name=promoter.EXECUTE_TASK, **CLAIMED_BATCH)
def execute_batch(self, pairs: list[list]) -> dict:
    """Execute a claimed batch ``[[payment_id, attempt], ...]`` exactly once in effect."""
    return run_claimed(self, pairs, run_batch)


@shared_task(name="payments.tasks.reconcile_daily", ignore_result=True)
def reconcile_daily() -> dict:
    """Run the reconciliation (beat, daily) and log every violated check at ERROR."""
    with db_deadline.unbounded():  # whole-table checks: minutes on a large database
        report = reconciliation.reconcile_and_report()
    return {"ok": report.ok, "violations": report.violations}
