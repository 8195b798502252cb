"""What a worker does with one execute message: apply the batch (``execution``), keep a
poison payment from holding the healthy ones hostage, and record the batch (metrics,
one log line per outcome). The execute task calls ``run_batch``; so does the promoter
when it cannot publish (Redis down) and executes a claim in-process.
"""

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import InterfaceError, OperationalError

from common.backoff import LOCK_CONFLICT

from . import execution, metrics
from .execution import BatchResult, Pair

logger = logging.getLogger(__name__)
# One line per payment outcome (payment_id, attempt, worker, outcome, timings): failures,
# stale attempts and re-claims at INFO; every successful execution at DEBUG (thousands a
# second at full speed; the attempt rows in the database keep the same record).
outcome_logger = logging.getLogger("payments.outcomes")

# Errors of the connection, not of a payment: the whole batch is retried, never bisected.
TRANSIENT_ERRORS = (OperationalError, InterfaceError)

# deadlock_detected and serialization_failure: PostgreSQL rolled the batch back so another
# transaction could go on. Nothing was written; applying the batch again at once (the
# fence is unchanged) is the whole remedy, without a trip through the broker and without
# spending a try of the payments' budget on it.
CONFLICT_SQLSTATES = frozenset({"40P01", "40001"})
CONFLICT_RETRIES = 3

T = TypeVar("T")


def is_conflict(exc: BaseException) -> bool:
    """A deadlock or serialization failure (Django wraps psycopg's error: the SQLSTATE is
    on the cause)."""
    cause = exc.__cause__ or exc
    return getattr(cause, "sqlstate", None) in CONFLICT_SQLSTATES


def retry_conflicts(apply: Callable[[], T], *, attempts: int = CONFLICT_RETRIES) -> T:
    """Run ``apply`` (one transaction); when the database aborts it as a deadlock victim
    or a serialization failure, run it again after a short jittered pause, at most
    ``attempts`` times in all. Other errors, and the last conflict, propagate."""
    for n in range(attempts):
        try:
            return apply()
        except OperationalError as exc:
            if not is_conflict(exc) or n == attempts - 1:
                raise
            metrics.record_conflict_retry()
            logger.warning("batch hit a lock conflict; applying it again", extra={
                "error": type(exc.__cause__ or exc).__name__, "retry": n + 1,
            })
            time.sleep(LOCK_CONFLICT.delay(n + 1))
    raise AssertionError("unreachable")


def run_batch(pairs: list[Pair], *, worker: str | None = None) -> BatchResult:
    """Start a batch (one try each, committed first: the budget counts worker starts),
    apply it (isolating a poison payment; a deadlock victim is applied again at once),
    timed, counted and logged: the one place a batch is recorded. Other transient
    database errors propagate (the task retries)."""
    worker = worker or execution.worker_name()
    started = time.perf_counter()
    execution.mark_started(pairs)
    result = retry_conflicts(lambda: apply_with_isolation(pairs, worker=worker))
    seconds = time.perf_counter() - started
    metrics.record_batch(result, seconds=seconds)
    log_outcomes(result, pairs, worker=worker, seconds=seconds)
    return result


def apply_with_isolation(pairs: list[Pair], *, worker: str | None = None) -> BatchResult:
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


def log_outcomes(result: BatchResult, pairs: list[Pair], *, worker: str, seconds: float) -> None:
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
    for payment_id, reason in result.parked.items():
        outcome_logger.warning("payment parked for review", extra={
            **common, "payment_id": payment_id, "attempt": attempts.get(payment_id), "outcome": "parked",
            "review_reason": reason,
        })
    for payment_id, next_attempt_at in result.retrying.items():
        outcome_logger.info("payment will be retried", extra={
            **common, "payment_id": payment_id, "attempt": attempts.get(payment_id), "outcome": "retry",
            "next_attempt_at": next_attempt_at.isoformat(),
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
        "parked": len(result.parked),
        "retrying": len(result.retrying),
        "stale": len(result.stale),
        **({"unknown": len(result.unknown)} if result.unknown else {}),  # payouts awaiting their rail's answer
        "apply_ms": round(seconds * 1000, 1),
        "max_execution_lateness_s": round(max(result.execution_lateness, default=0.0), 3),
    })
