"""The executor: apply a claimed batch of payments in one transaction.

1. Lock the payments FOR UPDATE where status = EXECUTING and attempt = the message's;
   the rest are stale (superseded or finished) and change nothing.
2-4. The ledger locks the accounts in id order, converges payments whose transfer
   already exists (the guard comes before any funds check), and checks funds and
   account state for the rest, in due order.
5. Bulk-write transfers and balances, CAS every status (WHERE attempt = given), insert
   attempt rows and events. Commit.
"""

import json
import logging
import os
import socket
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection, transaction

from ledger.services import Outcome, Posting, ledger_post_batch, ledger_preview_batch

from .models import ExecutionAttempt, FailureReason, PaymentEvent, PaymentStatus

logger = logging.getLogger(__name__)

Pair = tuple[str, int]


class ForecastMissed(Exception):
    """The ledger decided, under the account locks, other outcomes than forecast: the
    batch's transaction is rolled back (the ledger's writes with it) and run again."""


class FenceViolation(RuntimeError):
    """A CAS matched fewer rows than were locked: impossible unless the lock was lost."""


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class BatchResult:
    executed: list[str] = field(default_factory=list)
    already_applied: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # payment id -> failure_reason
    stale: list[Pair] = field(default_factory=list)
    execution_lateness: list[float] = field(default_factory=list)  # executed_at - execute_at, newly executed

    def merge(self, other: "BatchResult") -> None:
        self.executed += other.executed
        self.already_applied += other.already_applied
        self.failed.update(other.failed)
        self.stale += other.stale
        self.execution_lateness += other.execution_lateness


# The fence and the CAS find their rows by primary key, always. The expected status
# comes in as a column of the unnest (every element 'EXECUTING') rather than as the
# literal: with the literal the planner may pick the partial lease index, whose
# statistics are stale in a burst (EXECUTING goes from ~0 to tens of thousands of rows
# within seconds, long before autovacuum analyzes), and then every batch scans all
# in-flight rows: O(in-flight) per batch instead of O(batch).
LOCK_SQL = """
SELECT p.id, p.attempt, p.from_account_id, p.to_account_id, p.amount, p.execute_at, p.claimed_at,
       coalesce(p.execute_at + p.expires_after < now(), false) AS expired
  FROM payments_scheduledpayment p
  JOIN unnest(%(ids)s::text[], %(attempts)s::int[], %(expected)s::text[]) AS m(id, attempt, status)
    ON m.id = p.id AND m.attempt = p.attempt AND m.status = p.status
 WHERE p.id = ANY(%(ids)s::text[])
 ORDER BY p.id
   FOR UPDATE OF p
"""

FINISH_SQL = """
UPDATE payments_scheduledpayment p
   SET status = v.status, failure_reason = v.reason, executed_at = v.executed_at,
       lease_until = NULL, updated_at = now()
  FROM unnest(%(ids)s::text[], %(attempts)s::int[], %(expected)s::text[], %(statuses)s::text[],
              %(reasons)s::text[], %(executed_ats)s::timestamptz[])
       AS v(id, attempt, expected, status, reason, executed_at)
 WHERE p.id = ANY(%(ids)s::text[]) AND p.id = v.id AND p.attempt = v.attempt AND p.status = v.expected
"""


def _fenced(ids: list[str], attempts: list[int], **columns) -> dict:
    """Parameters of LOCK_SQL / FINISH_SQL: each row expected EXECUTING at its attempt."""
    return {"ids": ids, "attempts": attempts, "expected": [PaymentStatus.EXECUTING.value] * len(ids), **columns}

ATTEMPTS_SQL = """
INSERT INTO payments_executionattempt (payment_id, attempt, started_at, finished_at, worker, outcome, error)
SELECT v.id, v.attempt, %s, now(), %s, v.outcome, v.error
  FROM unnest(%s::text[], %s::int[], %s::text[], %s::text[]) AS v(id, attempt, outcome, error)
ON CONFLICT (payment_id, attempt) DO NOTHING
"""

EVENTS_SQL = """
INSERT INTO payments_paymentevent (payment_id, kind, from_status, to_status, attempt, actor, data, created_at)
SELECT v.id, v.kind, 'EXECUTING', v.status, v.attempt, %s, v.data::jsonb, now()
  FROM unnest(%s::text[], %s::text[], %s::text[], %s::int[], %s::text[]) AS v(id, kind, status, attempt, data)
"""

STALE_SQL = """
INSERT INTO payments_executionattempt (payment_id, attempt, started_at, finished_at, worker, outcome, error)
SELECT p.id, m.attempt, %s, now(), %s, 'stale', 'attempt superseded or payment already finished'
  FROM unnest(%s::text[], %s::int[]) AS m(id, attempt)
  JOIN payments_scheduledpayment p ON p.id = m.id
ON CONFLICT (payment_id, attempt) DO NOTHING
"""


def execute_batch(*, pairs: list[Pair], worker: str | None = None) -> BatchResult:
    """Apply one batch of claimed payments atomically. Safe to call twice with the same
    pairs, concurrently or after a crash: money moves once, the repeat is stale.

    The account locks are the one thing concurrent batches wait on (two batches of a
    burst nearly always share an account), so they are taken last: the outcomes are
    forecast from unlocked balances, the payments' statuses, attempts and events are
    written from the forecast, and only then does the ledger lock the accounts, decide
    again and move the money; if its decision differs from the forecast (a balance
    changed in between), the whole transaction rolls back, the ledger's writes with it,
    and the batch runs again with the locks taken first.
    """
    try:
        return _execute_batch(pairs=pairs, worker=worker, forecast=True)
    except ForecastMissed as exc:
        logger.info("forecast missed (%s); running the batch again with the account locks first", exc)
        return _execute_batch(pairs=pairs, worker=worker, forecast=False)


def _execute_batch(*, pairs: list[Pair], worker: str | None, forecast: bool) -> BatchResult:
    worker = worker or worker_name()
    result = BatchResult()
    pairs = list(dict.fromkeys((str(pid), int(att)) for pid, att in pairs))
    if not pairs:
        return result
    max_attempts = settings.DELAYPAY_MAX_ATTEMPTS

    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT now()")
        started_at = cur.fetchone()[0]
        cur.execute(LOCK_SQL, _fenced([p[0] for p in pairs], [p[1] for p in pairs]))
        rows = cur.fetchall()
        locked = {(r[0], r[1]) for r in rows}
        result.stale = [p for p in pairs if p not in locked]

        # Due order decides who gets the money when several payments share a payer.
        rows.sort(key=lambda r: (r[5], r[0]))
        # Some payments end without an apply: claimed more times than allowed (their
        # worker keeps dying or their messages keep getting lost), or past their
        # expires_after deadline. The guard still comes first: a transfer means executed.
        ending = {
            r[0]: FailureReason.ATTEMPTS_EXHAUSTED.value if r[1] > max_attempts else FailureReason.EXPIRED.value
            for r in rows
            if r[1] > max_attempts or r[7]
        }
        live = [r for r in rows if r[0] not in ending]
        postings = [Posting(key=r[0], debit_account_id=r[2], credit_account_id=r[3], amount=r[4]) for r in live]
        outcomes = (ledger_preview_batch if forecast else ledger_post_batch)(postings=postings)
        if ending:
            cur.execute("SELECT key, created_at FROM ledger_transfer WHERE key = ANY(%s)", [list(ending)])
            moved = dict(cur.fetchall())
        else:
            moved = {}

        ids, attempts, statuses, reasons, executed_ats = [], [], [], [], []
        att_outcomes, errors, kinds, datas = [], [], [], []

        def finish(row, status, reason, executed_at, outcome, error=""):
            ids.append(row[0])
            attempts.append(row[1])
            statuses.append(status)
            reasons.append(reason)
            executed_ats.append(executed_at)
            att_outcomes.append(outcome)
            errors.append(error)
            kinds.append(PaymentEvent.Kind.EXECUTED if status == PaymentStatus.EXECUTED else PaymentEvent.Kind.FAILED)
            datas.append(json.dumps({"outcome": outcome, **({"failure_reason": reason} if reason else {})}))

        for row in live:
            post = outcomes[row[0]]
            if post.outcome == Outcome.APPLIED:
                finish(row, PaymentStatus.EXECUTED, "", post.posted_at, ExecutionAttempt.Outcome.EXECUTED)
                result.executed.append(row[0])
                result.execution_lateness.append((post.posted_at - row[5]).total_seconds())
            elif post.outcome == Outcome.ALREADY_APPLIED:
                finish(row, PaymentStatus.EXECUTED, "", post.posted_at, ExecutionAttempt.Outcome.ALREADY_APPLIED)
                result.already_applied.append(row[0])
            else:
                finish(row, PaymentStatus.FAILED, post.outcome.value, None, ExecutionAttempt.Outcome.FAILED)
                result.failed[row[0]] = post.outcome.value
        for row in (r for r in rows if r[0] in ending):
            if row[0] in moved:
                finish(row, PaymentStatus.EXECUTED, "", moved[row[0]], ExecutionAttempt.Outcome.ALREADY_APPLIED)
                result.already_applied.append(row[0])
            else:
                reason = ending[row[0]]
                detail = (
                    f"claimed {row[1]} times; the limit is {max_attempts}"
                    if reason == FailureReason.ATTEMPTS_EXHAUSTED
                    else "could not start by execute_at + expires_after"
                )
                finish(row, PaymentStatus.FAILED, reason, None, ExecutionAttempt.Outcome.FAILED, detail)
                result.failed[row[0]] = reason

        if ids:
            cur.execute(FINISH_SQL, _fenced(ids, attempts, statuses=statuses, reasons=reasons,
                                            executed_ats=executed_ats))
            if cur.rowcount != len(ids):
                raise FenceViolation(f"CAS updated {cur.rowcount} of {len(ids)} locked payments")
            cur.execute(ATTEMPTS_SQL, [started_at, worker, ids, attempts, att_outcomes, errors])
            cur.execute(EVENTS_SQL, [f"worker:{worker}", ids, kinds, statuses, attempts, datas])
        if forecast:
            # Last, under the account locks: the ledger decides again and moves the money;
            # any difference from the forecast rolls everything back (the raise below).
            decided = ledger_post_batch(postings=postings)
            if decided != outcomes:
                changed = sorted(k for k in decided if decided[k] != outcomes.get(k))
                raise ForecastMissed(f"{len(changed)} outcome(s) changed, e.g. {changed[:3]}")
        if result.stale:
            cur.execute(STALE_SQL, [started_at, worker, [p[0] for p in result.stale], [p[1] for p in result.stale]])
    if result.stale:
        logger.info("stale attempts rejected: %s", result.stale)
    return result


def retry_backoff_seconds(attempt: int) -> float:
    """How long an errored payment waits before the next claim may take it again."""
    return float(min(2 ** max(attempt, 0), 60))


def record_error(*, pair: Pair, error: str, worker: str | None = None) -> BatchResult:
    """Record an unexpected error for one payment after its own apply failed.

    Below the attempt limit the payment stays EXECUTING with its lease shortened to a
    backoff, so the next claim retries it soon (attempt + 1). At the limit it ends
    FAILED(attempts_exhausted), unless its transfer exists, in which case it executed.
    """
    worker = worker or worker_name()
    payment_id, attempt = pair
    result = BatchResult()
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT now()")
        now = cur.fetchone()[0]
        cur.execute(LOCK_SQL, _fenced([payment_id], [attempt]))
        if not cur.fetchall():
            result.stale.append(pair)
            return result
        cur.execute("SELECT created_at FROM ledger_transfer WHERE key = %s", [payment_id])
        transfer = cur.fetchone()
        if transfer is not None or attempt >= settings.DELAYPAY_MAX_ATTEMPTS:
            status = PaymentStatus.EXECUTED if transfer else PaymentStatus.FAILED
            reason = "" if transfer else FailureReason.ATTEMPTS_EXHAUSTED.value
            cur.execute(FINISH_SQL, _fenced([payment_id], [attempt], statuses=[status], reasons=[reason],
                                            executed_ats=[transfer[0] if transfer else None]))
            kind = PaymentEvent.Kind.EXECUTED if transfer else PaymentEvent.Kind.FAILED
            data = json.dumps({"outcome": "error", **({"failure_reason": reason} if reason else {})})
            cur.execute(EVENTS_SQL, [f"worker:{worker}", [payment_id], [kind], [status], [attempt], [data]])
            if transfer:
                result.already_applied.append(payment_id)
            else:
                result.failed[payment_id] = reason
        else:
            cur.execute(
                "UPDATE payments_scheduledpayment SET lease_until = now() + make_interval(secs => %s),"
                " updated_at = now() WHERE id = %s AND status = 'EXECUTING' AND attempt = %s",
                [retry_backoff_seconds(attempt), payment_id, attempt],
            )
        cur.execute(ATTEMPTS_SQL, [now, worker, [payment_id], [attempt], ["error"], [error[:2000]]])
    return result
