"""The executor: apply a claimed batch of payments in one transaction, in four steps.

1. ``lock_fenced``: lock the payments ``FOR NO KEY UPDATE`` where status = EXECUTING and
   attempt = the message's (the fence); the rest are stale (superseded or finished)
   and change nothing.
2. ``decide``: each locked payment's outcome. Payments started more often than their
   budget allows are parked in NEEDS_REVIEW, payments past their ``expires_after``
   deadline fail, both without an apply (unless their transfer exists: the guard comes
   first); the rest get the ledger's decision (guard, account state, funds, in due
   order).
3. ``write_outcomes``: CAS every status (WHERE attempt = given), insert the attempt rows
   and the events.
4. ``post_money``: the ledger locks the accounts in id order, decides again and moves
   the money.

The account locks are the one thing concurrent batches wait on (two batches of a burst
nearly always share an account), so they are taken last: step 2 forecasts the ledger's
decision from unlocked balances, step 3 writes from the forecast, and step 4 takes the
locks and decides for real; if its decision differs from the forecast (a balance
changed in between), the whole transaction rolls back, the ledger's writes with it, and
the batch runs again with the locks taken first (step 2 then *is* the locked decision
and step 4 is skipped). See docs/decisions/0002-forecast-then-lock.md.
"""

import json
import logging
import os
import socket
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from common.backoff import PAYMENT_RETRY
from common.db import bound_cursor, database_now, delete_in_batches
from ledger.selectors import transfer_times
from ledger.services import Outcome, Posting, PostResult, ledger_post_batch, ledger_preview_batch

from . import sql
from .models import ExecutionAttempt, FailureReason, PaymentEvent, PaymentStatus, ReviewReason

logger = logging.getLogger(__name__)

Pair = tuple[str, int]  # (payment_id, attempt): what an execute message carries


class ForecastMissed(Exception):
    """The ledger decided, under the account locks, other outcomes than forecast: the
    batch's transaction is rolled back (the ledger's writes with it) and run again."""


class FenceViolation(RuntimeError):
    """A CAS matched fewer rows than were locked: impossible unless the lock was lost."""


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class LockedPayment:
    """A claimed payment, locked and fenced: this message's attempt is the current one."""

    id: str
    attempt: int
    from_account_id: str
    to_account_id: str
    amount: int
    execute_at: datetime
    claimed_at: datetime
    expired: bool  # past execute_at + expires_after
    tries: int  # worker starts so far, this one included (the retry budget)

    def posting(self) -> Posting:
        return Posting(key=self.id, debit_account_id=self.from_account_id,
                       credit_account_id=self.to_account_id, amount=self.amount)


@dataclass(frozen=True, slots=True)
class Decision:
    """How one payment leaves EXECUTING: its new status and what its attempt row and event say."""

    payment: LockedPayment
    status: PaymentStatus  # EXECUTED, FAILED, NEEDS_REVIEW (parked) or SCHEDULED (a retry)
    outcome: str  # ExecutionAttempt.Outcome: executed, already_applied, failed, parked, error
    failure_reason: str = ""
    executed_at: datetime | None = None  # when the money moved (None: it did not)
    error: str = ""  # the attempt row's detail
    review_reason: str = ""  # NEEDS_REVIEW: why
    next_attempt_at: datetime | None = None  # SCHEDULED: when the retry may be claimed

    def event_kind(self) -> str:
        return EVENT_KINDS[self.status]

    def event_data(self) -> str:
        data = {"outcome": self.outcome}
        if self.failure_reason:
            data["failure_reason"] = self.failure_reason
        if self.review_reason:
            data["review_reason"] = self.review_reason
        if self.next_attempt_at:
            data["next_attempt_at"] = self.next_attempt_at.isoformat()
        return json.dumps(data)


EVENT_KINDS = {
    PaymentStatus.EXECUTED: PaymentEvent.Kind.EXECUTED,
    PaymentStatus.FAILED: PaymentEvent.Kind.FAILED,
    PaymentStatus.NEEDS_REVIEW: PaymentEvent.Kind.PARKED,
    PaymentStatus.SCHEDULED: PaymentEvent.Kind.RETRY_SCHEDULED,
}


@dataclass
class BatchResult:
    executed: list[str] = field(default_factory=list)
    already_applied: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # payment id -> failure_reason
    parked: dict[str, str] = field(default_factory=dict)  # payment id -> review_reason (NEEDS_REVIEW)
    retrying: dict[str, datetime] = field(default_factory=dict)  # payment id -> next_attempt_at
    stale: list[Pair] = field(default_factory=list)
    execution_lateness: list[float] = field(default_factory=list)  # executed_at - execute_at, newly executed
    unknown: list[str] = field(default_factory=list)  # payouts whose rail call ended ambiguously (follow-up due)

    def merge(self, other: "BatchResult") -> None:
        self.executed += other.executed
        self.already_applied += other.already_applied
        self.failed.update(other.failed)
        self.parked.update(other.parked)
        self.retrying.update(other.retrying)
        self.stale += other.stale
        self.execution_lateness += other.execution_lateness
        self.unknown += other.unknown

    def add(self, decision: Decision) -> None:
        payment = decision.payment
        if decision.status == PaymentStatus.FAILED:
            self.failed[payment.id] = decision.failure_reason
        elif decision.status == PaymentStatus.NEEDS_REVIEW:
            self.parked[payment.id] = decision.review_reason
        elif decision.status == PaymentStatus.SCHEDULED:
            self.retrying[payment.id] = decision.next_attempt_at
        elif decision.outcome == ExecutionAttempt.Outcome.EXECUTED:
            self.executed.append(payment.id)
            self.execution_lateness.append((decision.executed_at - payment.execute_at).total_seconds())
        else:
            self.already_applied.append(payment.id)


def fence_params(ids: list[str], attempts: list[int], **columns) -> dict:
    """Parameters of sql.LOCK_FENCED / sql.FINISH_FENCED: each row expected EXECUTING at its attempt."""
    return {"ids": ids, "attempts": attempts, "expected": [PaymentStatus.EXECUTING.value] * len(ids), **columns}


def execute_batch(*, pairs: list[Pair], worker: str | None = None) -> BatchResult:
    """Apply one batch of claimed payments atomically. Safe to call twice with the same
    pairs, concurrently or after a crash: money moves once, the repeat is stale."""
    try:
        return _execute_batch(pairs=pairs, worker=worker, forecast=True)
    except ForecastMissed as exc:
        logger.info("forecast missed (%s); running the batch again with the account locks first", exc)
        return _execute_batch(pairs=pairs, worker=worker, forecast=False)


def _execute_batch(*, pairs: list[Pair], worker: str | None, forecast: bool) -> BatchResult:
    worker = worker or worker_name()
    pairs = list(dict.fromkeys((str(pid), int(att)) for pid, att in pairs))
    result = BatchResult()
    if not pairs:
        return result
    with transaction.atomic(), bound_cursor() as cur:
        started_at = database_now(cur)
        locked, result.stale = lock_fenced(cur, pairs)
        ending = ending_reasons(locked)
        postings = [p.posting() for p in locked if p.id not in ending]
        # Forecast (no account lock) or, on the rerun, the ledger's real decision.
        outcomes = (ledger_preview_batch if forecast else ledger_post_batch)(postings=postings)
        decisions = decide(locked, outcomes=outcomes, ending=ending, moved=transfer_times(keys=list(ending)))
        write_outcomes(cur, decisions, started_at=started_at, worker=worker)
        if forecast:
            post_money(postings, forecast=outcomes)
        if result.stale:
            record_stale(cur, result.stale, started_at=started_at, worker=worker)
    for decision in decisions:
        result.add(decision)
    if result.stale:
        logger.info("stale attempts rejected: %s", result.stale)
    return result


def lock_fenced(cur, pairs: list[Pair]) -> tuple[list[LockedPayment], list[Pair]]:
    """Step 1. Lock the payments still EXECUTING at the message's attempt, in due order
    (due order decides who gets the money when several share a payer); the other
    pairs are stale."""
    cur.execute(sql.LOCK_FENCED, fence_params([p[0] for p in pairs], [p[1] for p in pairs]))
    locked = [LockedPayment(*row) for row in cur.fetchall()]
    fenced = {(p.id, p.attempt) for p in locked}
    locked.sort(key=lambda p: (p.execute_at, p.id))
    return locked, [pair for pair in pairs if pair not in fenced]


def ending_reasons(locked: list[LockedPayment]) -> dict[str, str]:
    """Payments that leave without an apply, with the reason: started by workers more
    often than the budget allows (their workers keep dying on them: parked for review,
    ReviewReason), or past their expires_after deadline (FAILED, FailureReason). Claims
    that no worker started never count: an outage delays a payment, it never fails it."""
    max_attempts = settings.DELAYPAY_MAX_ATTEMPTS
    return {
        p.id: ReviewReason.ATTEMPTS_EXHAUSTED.value if p.tries > max_attempts else FailureReason.EXPIRED.value
        for p in locked
        if p.tries > max_attempts or p.expired
    }


def decide(
    locked: list[LockedPayment],
    *,
    outcomes: dict[str, PostResult],
    ending: dict[str, str],
    moved: dict[str, datetime],
) -> list[Decision]:
    """Step 2. Each payment's outcome: the ledger's for the live ones (in due order), then
    the ending ones, which still converge to EXECUTED when their transfer exists."""
    decisions = []
    for payment in (p for p in locked if p.id not in ending):
        post = outcomes[payment.id]
        if post.outcome == Outcome.APPLIED:
            decisions.append(Decision(payment, PaymentStatus.EXECUTED, ExecutionAttempt.Outcome.EXECUTED,
                                      executed_at=post.posted_at))
        elif post.outcome == Outcome.ALREADY_APPLIED:
            decisions.append(Decision(payment, PaymentStatus.EXECUTED, ExecutionAttempt.Outcome.ALREADY_APPLIED,
                                      executed_at=post.posted_at))
        else:
            decisions.append(Decision(payment, PaymentStatus.FAILED, ExecutionAttempt.Outcome.FAILED,
                                      failure_reason=post.outcome.value))
    for payment in (p for p in locked if p.id in ending):
        if payment.id in moved:
            decisions.append(Decision(payment, PaymentStatus.EXECUTED, ExecutionAttempt.Outcome.ALREADY_APPLIED,
                                      executed_at=moved[payment.id]))
            continue
        reason = ending[payment.id]
        if reason == ReviewReason.ATTEMPTS_EXHAUSTED:
            budget = settings.DELAYPAY_MAX_ATTEMPTS
            decisions.append(park(payment, outcome=ExecutionAttempt.Outcome.PARKED,
                                  error=f"started {payment.tries} times; the budget is {budget}"))
        else:
            decisions.append(Decision(payment, PaymentStatus.FAILED, ExecutionAttempt.Outcome.FAILED,
                                      failure_reason=reason, error="could not start by execute_at + expires_after"))
    return decisions


def park(payment: LockedPayment, *, outcome: str, error: str) -> Decision:
    """NEEDS_REVIEW: the budget is spent. Nothing moves until staff re-drive or resolve it."""
    return Decision(payment, PaymentStatus.NEEDS_REVIEW, outcome,
                    review_reason=ReviewReason.ATTEMPTS_EXHAUSTED.value, error=error)


def write_outcomes(cur, decisions: list[Decision], *, started_at: datetime, worker: str) -> None:
    """Step 3. CAS every status from EXECUTING at its attempt (all or nothing: the rows are
    locked, so a miss means the fence broke), then one attempt row and one event each."""
    if not decisions:
        return
    ids = [d.payment.id for d in decisions]
    attempts = [d.payment.attempt for d in decisions]
    # Plain strings, not the choices' enum members: bound_cursor writes a list of str in
    # one step (common.db.FastListDumper), a list of members element by element.
    statuses = [str(d.status) for d in decisions]
    cur.execute(sql.FINISH_FENCED, fence_params(
        ids, attempts, statuses=statuses, reasons=[d.failure_reason for d in decisions],
        executed_ats=[d.executed_at for d in decisions], review_reasons=[d.review_reason for d in decisions],
        next_attempt_ats=[d.next_attempt_at for d in decisions],
    ))
    if cur.rowcount != len(ids):
        raise FenceViolation(f"CAS updated {cur.rowcount} of {len(ids)} locked payments")
    cur.execute(sql.INSERT_ATTEMPTS, [started_at, worker, ids, attempts, [str(d.outcome) for d in decisions],
                                      [d.error for d in decisions]])
    kinds = [str(d.event_kind()) for d in decisions]
    cur.execute(sql.INSERT_FINISH_EVENTS, [f"worker:{worker}", ids, kinds, statuses, attempts,
                                           [d.event_data() for d in decisions]])


def post_money(postings: list[Posting], *, forecast: dict[str, PostResult]) -> None:
    """Step 4. Under the account locks the ledger decides again and moves the money; any
    difference from the forecast rolls the whole batch back (ForecastMissed)."""
    decided = ledger_post_batch(postings=postings)
    if decided != forecast:
        changed = sorted(k for k in decided if decided[k] != forecast.get(k))
        raise ForecastMissed(f"{len(changed)} outcome(s) changed, e.g. {changed[:3]}")


def record_stale(cur, stale: list[Pair], *, started_at: datetime, worker: str) -> None:
    """An attempt row for each stale message (superseded, or the payment already finished)."""
    cur.execute(sql.INSERT_STALE_ATTEMPTS, [started_at, worker, [p[0] for p in stale], [p[1] for p in stale]])


def mark_started(pairs: list[Pair], *, statement: str = sql.MARK_STARTED) -> int:
    """A worker starts these (payment, attempt) pairs: one try more for each, once per
    claim (a start marker; see sql.MARK_STARTED). Commits on its own, before the batch's
    transaction, so that a worker that dies mid-way has still spent the try. Returns how
    many were new. ``statement``: sql.MARK_STARTED_IN_ROW for payouts, whose count stays
    on the row."""
    if not pairs:
        return 0
    with transaction.atomic(), bound_cursor() as cur:
        # No wait for the WAL flush: the marker guards against a worker dying, not the
        # database; a database crash that loses it loses a try, never a payment.
        cur.execute(sql.ASYNC_COMMIT)
        cur.execute(statement, fence_params([p[0] for p in pairs], [p[1] for p in pairs]))
        return cur.rowcount


def purge_start_markers(*, batch: int = 50_000) -> int:
    """Delete the start markers no attempt needs any more (sql.PURGE_START_MARKERS),
    ``batch`` a transaction. Returns the count."""
    return delete_in_batches(sql.PURGE_START_MARKERS, [batch], batch=batch)


def record_error(*, pair: Pair, error: str, worker: str | None = None) -> BatchResult:
    """Record an unexpected error for one payment after its own apply failed.

    Within its budget the payment goes back to SCHEDULED with ``next_attempt_at`` on the
    retry ladder; with the budget spent it is parked in NEEDS_REVIEW. If its transfer
    exists, the money moved: it is EXECUTED whatever the error was.
    """
    worker = worker or worker_name()
    payment_id = pair[0]
    result = BatchResult()
    error = error[:2000]
    with transaction.atomic(), connection.cursor() as cur:
        started_at = database_now(cur)
        locked, result.stale = lock_fenced(cur, [pair])
        if not locked:
            return result
        [payment] = locked
        moved = transfer_times(keys=[payment_id])
        if payment_id in moved:
            decision = Decision(payment, PaymentStatus.EXECUTED, ExecutionAttempt.Outcome.ERROR,
                                executed_at=moved[payment_id], error=error)
        elif payment.tries >= settings.DELAYPAY_MAX_ATTEMPTS:
            decision = park(payment, outcome=ExecutionAttempt.Outcome.ERROR, error=error)
        else:
            decision = Decision(payment, PaymentStatus.SCHEDULED, ExecutionAttempt.Outcome.ERROR, error=error,
                                next_attempt_at=started_at + timedelta(seconds=PAYMENT_RETRY.delay(payment.tries)))
        write_outcomes(cur, [decision], started_at=started_at, worker=worker)
    result.add(decision)
    return result
