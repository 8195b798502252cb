"""Payouts: money that leaves the ledger through a payment rail, exactly once in effect at
the rail. A payout is a scheduled payment to a payee (``to_payee``); the rail is called
between two transactions, never inside one, and never with a row lock held.

A claimed batch (``run_payout_batch``) goes through three steps:

1. ``prepare`` (one transaction): lock the fenced payouts. Those past their budget are
   parked (their funds, if reserved, stay reserved: the rail may have paid); those past
   ``expires_after`` before any reserve fail; the new ones reserve their funds (the
   ledger's pending transfer payer -> the rail's clearing account, and the ``Payout``
   row), or fail as an internal payment would (insufficient funds, a frozen account).
   A payout reserved by an earlier attempt had an unknown outcome: it is looked up first.
2. ``call_rails`` (no transaction): submit with ``Idempotency-Key`` = the payment id (a
   lookup first when earlier attempts may have reached the rail; "not found" is submitted
   again under the same key), many at once on a thread pool.
3. ``finish`` (one transaction): lock the fenced payouts again. Paid: post the reserve
   (clearing -> the rail's settlement account), EXECUTED. Declined: void it (money back),
   FAILED(declined). No answer (a timeout, a 5xx, a dropped connection): it stays
   EXECUTING with an "unknown" attempt and its lease moved to the follow-up
   (DELAYPAY_RAIL_FOLLOWUP_DELAYS), or is parked NEEDS_REVIEW on its last try.

Then the rail's breaker records the round (payments/breaker.py).
"""

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction

from common.backoff import RAIL_FOLLOW_UP
from common.db import database_now
from ledger.services import Reservation, ledger_reserve_batch, ledger_resolve_pending
from payments import breaker, metrics
from payments.execution import (
    BatchResult,
    Decision,
    LockedPayment,
    Pair,
    fence_params,
    mark_started,
    record_stale,
    worker_name,
    write_outcomes,
)
from payments.models import ExecutionAttempt, FailureReason, PaymentStatus, PayoutState, ReviewReason
from payments.sql import MARK_STARTED_IN_ROW
from payments.worker import log_outcomes, retry_conflicts
from rails.base import Declined, NotFound, Paid, Unknown
from rails.registry import get_rail

from . import sql

logger = logging.getLogger(__name__)
outcome_logger = logging.getLogger("payments.outcomes")


def clearing_account(rail: str) -> str:
    return f"acc_{rail}_clearing"


def settlement_account(rail: str) -> str:
    return f"acc_{rail}_settlement"


@dataclass(frozen=True, slots=True)
class Work:
    """A payout to call its rail for, with its funds reserved."""

    payment: LockedPayment
    rail: str
    destination: str
    lookup_first: bool  # an earlier attempt may have reached the rail


@dataclass(frozen=True, slots=True)
class Answer:
    work: Work
    result: Paid | Declined | Unknown
    submissions: int
    lookups: int

    @property
    def answered(self) -> bool:
        """The rail answered (paid or declined): the breaker counts it a success."""
        return not isinstance(self.result, Unknown)


def _locked(rows) -> tuple[list[LockedPayment], dict[str, tuple[str, str, str | None, bool]]]:
    locked, extra = [], {}
    for row in rows:
        locked.append(LockedPayment(*row[:9]))
        extra[row[0]] = (row[9], row[10], row[11], row[12])  # rail, destination, payout state, payee deleted
    locked.sort(key=lambda p: (p.execute_at, p.id))
    return locked, extra


def _lock(cur, pairs: list[Pair]):
    cur.execute(sql.LOCK_FENCED_PAYOUTS, fence_params([p[0] for p in pairs], [p[1] for p in pairs]))
    locked, extra = _locked(cur.fetchall())
    fenced = {(p.id, p.attempt) for p in locked}
    return locked, extra, [pair for pair in pairs if pair not in fenced]


def _park(payment: LockedPayment, *, reason: str, error: str) -> Decision:
    return Decision(payment, PaymentStatus.NEEDS_REVIEW, ExecutionAttempt.Outcome.PARKED,
                    review_reason=reason, error=error[:2000])


def prepare(pairs: list[Pair], *, worker: str) -> tuple[list[Work], BatchResult]:
    """Step 1 (one transaction): end what leaves without a call, reserve the new payouts'
    funds, and return the work for the rail."""
    result = BatchResult()
    works: list[Work] = []
    with transaction.atomic(), connection.cursor() as cur:
        started_at = database_now(cur)
        locked, extra, result.stale = _lock(cur, pairs)
        decisions: list[Decision] = []
        new: list[LockedPayment] = []
        budget = settings.DELAYPAY_MAX_ATTEMPTS
        for p in locked:
            rail, destination, state, payee_deleted = extra[p.id]
            if p.tries > budget:
                reason = ReviewReason.OUTCOME_UNKNOWN if state else ReviewReason.ATTEMPTS_EXHAUSTED
                decisions.append(_park(p, reason=reason, error=f"started {p.tries} times; the budget is {budget}"))
            elif state:
                works.append(Work(p, rail, destination, lookup_first=True))
            elif p.expired:
                decisions.append(Decision(p, PaymentStatus.FAILED, ExecutionAttempt.Outcome.FAILED,
                                          failure_reason=FailureReason.EXPIRED,
                                          error="could not start by execute_at + expires_after"))
            elif payee_deleted:
                # Never expected (payee_delete refuses while a payout to the payee is pending);
                # nothing is reserved yet, so nothing is sent to a payee its owner deleted.
                decisions.append(Decision(p, PaymentStatus.FAILED, ExecutionAttempt.Outcome.FAILED,
                                          failure_reason=FailureReason.PAYEE_DELETED,
                                          error="the payee was deleted while the payout was pending"))
            else:
                new.append(p)
        reserved = ledger_reserve_batch(reservations=[
            Reservation(p.id, p.from_account_id, clearing_account(extra[p.id][0]), settlement_account(extra[p.id][0]),
                        p.amount)
            for p in new
        ])
        fresh = []
        for p in new:
            outcome = reserved[p.id].outcome
            if outcome.moved:
                fresh.append(p)
                works.append(Work(p, extra[p.id][0], extra[p.id][1], lookup_first=False))
            else:
                decisions.append(Decision(p, PaymentStatus.FAILED, ExecutionAttempt.Outcome.FAILED,
                                          failure_reason=outcome.value))
        if fresh:
            cur.execute(sql.INSERT_PAYOUTS, [[p.id for p in fresh], [extra[p.id][0] for p in fresh],
                                             [extra[p.id][1] for p in fresh], [p.amount for p in fresh]])
        write_outcomes(cur, decisions, started_at=started_at, worker=worker)
        if result.stale:
            record_stale(cur, result.stale, started_at=started_at, worker=worker)
    for decision in decisions:
        result.add(decision)
    return works, result


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=settings.DELAYPAY_RAIL_CONCURRENCY, thread_name_prefix="rail")
        return _pool


def call_one(work: Work) -> Answer:
    """One payout's calls: a lookup first when an earlier attempt may have reached the
    rail, then (nothing found) a submit under the payment id. Never raises."""
    rail = get_rail(work.rail)
    key = work.payment.id
    lookups = 0
    if work.lookup_first:
        started = time.perf_counter()
        found = rail.lookup(key=key)
        metrics.record_rail_call(rail=work.rail, call="lookup", outcome=_outcome(found),
                                 seconds=time.perf_counter() - started)
        lookups = 1
        if not isinstance(found, NotFound):
            return Answer(work, found, submissions=0, lookups=1)
    started = time.perf_counter()
    result = rail.submit(key=key, amount=work.payment.amount, destination=work.destination,
                         metadata={"payment_id": key})
    metrics.record_rail_call(rail=work.rail, call="submit", outcome=_outcome(result),
                             seconds=time.perf_counter() - started)
    return Answer(work, result, submissions=1, lookups=lookups)


def _outcome(result) -> str:
    return {Paid: "paid", Declined: "declined", NotFound: "not_found"}.get(type(result), "unknown")


def call_rails(works: list[Work]) -> list[Answer]:
    """Step 2 (no transaction held): every payout's calls, at most
    DELAYPAY_RAIL_CONCURRENCY at once per process."""
    if not works:
        return []
    if len(works) == 1:
        return [call_one(works[0])]
    return list(_executor().map(call_one, works))


def finish(answers: list[Answer], *, worker: str) -> BatchResult:
    """Step 3 (one transaction): post, void or follow up each payout still fenced at its
    attempt; an attempt superseded meanwhile changes nothing (its successor looks up)."""
    result = BatchResult()
    by_id = {a.work.payment.id: a for a in answers}
    pairs = [(a.work.payment.id, a.work.payment.attempt) for a in answers]
    with transaction.atomic(), connection.cursor() as cur:
        started_at = database_now(cur)
        locked, _extra, result.stale = _lock(cur, pairs)
        live = [by_id[p.id] for p in locked]
        paid = [a for a in live if isinstance(a.result, Paid)]
        declined = [a for a in live if isinstance(a.result, Declined)]
        unknown = [a for a in live if isinstance(a.result, Unknown)]
        ledger_resolve_pending(keys=[a.work.payment.id for a in paid], post=True)
        ledger_resolve_pending(keys=[a.work.payment.id for a in declined], post=False)
        decisions = [
            Decision(a.work.payment, PaymentStatus.EXECUTED, ExecutionAttempt.Outcome.EXECUTED, executed_at=started_at)
            for a in paid
        ] + [
            Decision(a.work.payment, PaymentStatus.FAILED, ExecutionAttempt.Outcome.FAILED,
                     failure_reason=FailureReason.DECLINED, error=f"{a.result.code}: {a.result.message}"[:2000])
            for a in declined
        ]
        budget = settings.DELAYPAY_MAX_ATTEMPTS
        follow = []
        for a in unknown:
            if a.work.payment.tries >= budget and a.result.sent:
                decisions.append(_park(a.work.payment, reason=ReviewReason.OUTCOME_UNKNOWN,
                                       error=f"outcome unknown on the last try: {a.result.error}"))
            else:
                follow.append(a)
        write_outcomes(cur, decisions, started_at=started_at, worker=worker)
        if follow:
            cur.execute(sql.PAYOUT_FOLLOW_UP, {
                "ids": [a.work.payment.id for a in follow], "attempts": [a.work.payment.attempt for a in follow],
                "delays": [RAIL_FOLLOW_UP.delay(a.work.payment.tries) for a in follow],
                "errors": [a.result.error[:2000] for a in follow], "started_at": started_at, "worker": worker,
                "unsent": [not a.result.sent for a in follow],
                "actor": f"worker:{worker}",
            })
        _update_payouts(cur, live)
        if result.stale:
            record_stale(cur, result.stale, started_at=started_at, worker=worker)
    for decision in decisions:
        result.add(decision)
    for a in follow:
        result.unknown.append(a.work.payment.id)
    return result


def _update_payouts(cur, answers: list[Answer]) -> None:
    if not answers:
        return
    states, references, paid_ats, codes, errors = [], [], [], [], []
    for a in answers:
        r = a.result
        if isinstance(r, Paid):
            states.append(PayoutState.PAID)
            references.append(r.reference)
            paid_ats.append(r.paid_at)
            codes.append("")
            errors.append("")
        elif isinstance(r, Declined):
            states.append(PayoutState.DECLINED)
            references.append("")
            paid_ats.append(None)
            codes.append(r.code[:60])
            errors.append(r.message[:2000])
        else:
            states.append(PayoutState.PENDING)
            references.append("")
            paid_ats.append(None)
            codes.append("")
            errors.append(r.error[:2000])
    cur.execute(sql.UPDATE_PAYOUTS, [[a.work.payment.id for a in answers], states, references, paid_ats, codes,
                                     [a.submissions for a in answers], [a.lookups for a in answers], errors])


def run_payout_batch(pairs: list[Pair], *, worker: str | None = None) -> BatchResult:
    """Work one claimed batch of payouts (the execute_payouts task): start it (one try each),
    prepare, call the rails, finish, record the breaker; timed, counted and logged."""
    worker = worker or worker_name()
    pairs = list(dict.fromkeys((str(pid), int(att)) for pid, att in pairs))
    started = time.perf_counter()
    mark_started(pairs, statement=MARK_STARTED_IN_ROW)
    works, result = retry_conflicts(lambda: prepare(pairs, worker=worker))
    answers = call_rails(works)
    if answers:
        result.merge(retry_conflicts(lambda: finish(answers, worker=worker)))
        for rail in {a.work.rail for a in answers}:
            breaker.record_calls(rail=rail, answered=[a.answered for a in answers if a.work.rail == rail])
    seconds = time.perf_counter() - started
    metrics.record_batch(result, seconds=seconds)
    for a in answers:
        if isinstance(a.result, Unknown):
            outcome_logger.info("payout outcome unknown", extra={
                "payment_id": a.work.payment.id, "attempt": a.work.payment.attempt, "worker": worker,
                "outcome": "unknown", "rail": a.work.rail, "error": a.result.error[:200],
            })
    log_outcomes(result, pairs, worker=worker, seconds=seconds)  # failures, parks, stale, and the summary
    return result
