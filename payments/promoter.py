"""The promoter: claims due payments from the table and hands them to the executors.

The database is the schedule. Each tick claims batches of due rows (and rows whose
lease expired) with ``FOR UPDATE SKIP LOCKED`` on the database clock, commits, and
only then publishes ``execute_batch`` messages. A crash between the commit and the
publish leaves rows EXECUTING with a lease; the first claim after it expires takes
them again (attempt + 1). Redis is transport, never truth.
"""

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from celery import current_app
from django.conf import settings
from django.db import connection, transaction

from rails.base import RAIL_NAMES

from . import breaker, metrics, services, sql
from .execution import worker_name
from .models import Heartbeat
from .series import recurring_generate_due
from .worker import run_batch

logger = logging.getLogger(__name__)
outcome_logger = logging.getLogger("payments.outcomes")

# The execute message's contract: this task name, args [[[payment_id, attempt], ...]].
# Published by name, so the promoter needs no import of the tasks module.
EXECUTE_TASK = "payments.tasks.execute_batch"
# Payouts go to their own queue and process (the Procfile's ``payouts``): a slow rail never
# holds the internal transfers' workers. Same args.
PAYOUT_TASK = "payments.tasks.execute_payouts"

Pair = tuple[str, int]  # (payment_id, attempt)

@dataclass
class Claim:
    fresh: list[Pair] = field(default_factory=list)  # were SCHEDULED (due, or a retry whose wait is over)
    reclaimed: list[Pair] = field(default_factory=list)  # lease had expired
    # Of the reclaimed, those a worker had started (it died or hung mid-way): suspects.
    started: set[Pair] = field(default_factory=set)
    dispatch_lateness: list[float] = field(default_factory=list)  # seconds, of the fresh ones

    def __len__(self) -> int:
        return len(self.fresh) + len(self.reclaimed)

    def add_rows(self, rows) -> None:
        """The rows a claim statement returned: (id, attempt, previous status, lateness, started)."""
        for payment_id, attempt, previous, lateness, started in rows:
            if previous == "SCHEDULED":
                self.fresh.append((payment_id, attempt))
                self.dispatch_lateness.append(lateness)
            else:
                self.reclaimed.append((payment_id, attempt))
                if started:
                    self.started.add((payment_id, attempt))


@dataclass
class TickResult:
    claimed: int = 0
    reclaimed: int = 0
    messages: int = 0
    executed_in_process: int = 0
    in_flight: int = 0
    capped: bool = False
    seconds: float = 0.0
    dispatch_lateness: list[float] = field(default_factory=list)  # claimed_at - execute_at, fresh claims
    reclaimed_pairs: list[Pair] = field(default_factory=list)
    payouts: int = 0  # payouts claimed (fresh and follow-ups), within their rails' allowance


def claim_params(*, batch: int, lease_seconds: float, actor: str = "promoter") -> dict:
    """sql.CLAIM_DUE's parameters."""
    return {"batch": batch, "reclaim_batch": batch, "lease": float(lease_seconds), "actor": actor}


def claim_due(*, batch: int, lease_seconds: float, actor: str = "promoter") -> Claim:
    """Claim up to ``batch`` due rows and up to ``batch`` expired leases. Commits."""
    claim = Claim()
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(sql.CLAIM_DUE, claim_params(batch=batch, lease_seconds=lease_seconds, actor=actor))
        claim.add_rows(cur.fetchall())
    return claim


def claim_payouts(*, rail: str, batch: int, lease_seconds: float, actor: str = "promoter") -> Claim:
    """Claim up to ``batch`` of one rail's due payouts (and follow-ups whose lease ran out),
    within what its breaker and its pacing allow now (payments/breaker.py). Commits."""
    claim = Claim()
    with transaction.atomic(), connection.cursor() as cur:
        state, allowance = breaker.take_allowance(rail=rail, want=batch)
        if allowance > 0:
            cur.execute(sql.CLAIM_PAYOUTS_DUE, {
                **claim_params(batch=allowance, lease_seconds=lease_seconds, actor=actor), "rail": rail,
            })
            claim.add_rows(cur.fetchall())
        breaker.spend(state, len(claim))
    return claim


def publish_payouts(messages: Sequence[list[Pair]]) -> None:
    with current_app.producer_or_acquire() as producer:
        for pairs in messages:
            current_app.send_task(PAYOUT_TASK, args=[pairs], producer=producer, retry=False)


def payouts_tick(
    *, publish: Callable[[Sequence[list[Pair]]], None], deadline: float, lease_seconds: float, result: "TickResult"
) -> None:
    """Claim and publish each rail's payouts, batch by batch, until its allowance is spent,
    nothing is due or the tick's budget is. A publish that fails leaves the claim to its
    lease (no worker started it: no try is spent); the payouts wait for Redis."""
    batch = settings.DELAYPAY_RAIL_CLAIM_BATCH
    for rail in RAIL_NAMES:
        while True:
            claim = claim_payouts(rail=rail, batch=batch, lease_seconds=lease_seconds)
            if not claim:
                break
            result.payouts += len(claim)
            result.dispatch_lateness += claim.dispatch_lateness
            try:
                publish([claim.fresh + claim.reclaimed])
                result.messages += 1
            except Exception:
                logger.exception("publishing %d claimed payouts failed; they wait for their lease", len(claim))
                return
            if len(claim) < batch or time.monotonic() >= deadline:
                break


def count_in_flight() -> int:
    with connection.cursor() as cur:
        cur.execute(sql.COUNT_IN_FLIGHT)
        return cur.fetchone()[0]


def messages_for(claim: Claim) -> list[list[Pair]]:
    """One message for the fresh batch; one for the re-claimed payments whose message was
    lost before any worker started it (workers down, Redis restarted): they are innocent,
    and thousands of them after an outage go out in batches; one message each for the
    re-claimed payments a worker had started: such a payment may be the one that killed
    its worker, and alone it cannot take a healthy batch down with it again.
    """
    messages = [claim.fresh] if claim.fresh else []
    lost = [pair for pair in claim.reclaimed if pair not in claim.started]
    if lost:
        messages.append(lost)
    messages.extend([pair] for pair in claim.reclaimed if pair in claim.started)
    return messages


def publish_messages(messages: Sequence[list[Pair]]) -> None:
    """Publish every message of one claim over a single producer connection."""
    with current_app.producer_or_acquire() as producer:
        for pairs in messages:
            current_app.send_task(EXECUTE_TASK, args=[pairs], producer=producer, retry=False)


def execute_in_process(pairs: list[Pair]) -> None:
    """Execute one message's batch here, in the promoter (the fallback when Redis is down)."""
    run_batch([tuple(p) for p in pairs], worker=f"promoter:{worker_name()}")


def promoter_run_tick(*, degraded: bool = False) -> "TickResult":
    """One beat tick (the promoter_tick task): generate due recurring occurrences, claim
    due payments and publish them, then record the heartbeat, metrics and log lines.
    ``degraded``: a tick of the fallback while Redis is down (payments/fallback.py)."""
    # Never raises: in bounded batches, a series that cannot be generated now (a lock
    # timeout, a deadlock, bad data) is rolled back alone, logged, counted and tried again
    # next tick, and the claim below goes ahead (payments/series.py).
    recurring_generate_due()
    result = promoter_tick(degraded=degraded)
    services.heartbeat_record(name=Heartbeat.PROMOTER)
    metrics.record_tick(result)
    for payment_id, attempt in result.reclaimed_pairs:
        outcome_logger.info(
            "payment reclaimed after its lease expired",
            extra={"payment_id": payment_id, "attempt": attempt, "outcome": "reclaimed"},
        )
    if result.claimed or result.payouts:
        logger.info(
            "promoter tick",
            extra={
                "claimed": result.claimed,
                "payouts": result.payouts,
                "reclaimed": result.reclaimed,
                "messages": result.messages,
                "executed_in_process": result.executed_in_process,
                "in_flight": result.in_flight,
                "capped": result.capped,
                "degraded": degraded,
                "tick_ms": round(result.seconds * 1000, 1),
                "max_dispatch_lateness_s": round(max(result.dispatch_lateness, default=0.0), 3),
            },
        )
    return result


def promoter_tick(
    *,
    publish: Callable[[Sequence[list[Pair]]], None] = publish_messages,
    execute_in_process: Callable[[list[Pair]], None] = execute_in_process,
    batch: int | None = None,
    lease_seconds: float | None = None,
    budget_seconds: float | None = None,
    in_flight_cap: int | None = None,
    degraded: bool = False,
    publish_payouts: Callable[[Sequence[list[Pair]]], None] = publish_payouts,
) -> TickResult:
    """Claim and publish until nothing is due, the budget is spent or the cap is hit.

    ``publish`` sends messages after each claim's commit. If it raises (Redis is down),
    the rows just claimed are executed here, in-process, so they neither wait for
    their lease to expire nor burn an attempt; the tick then stops claiming.
    ``degraded`` (Redis is known to be down, payments/fallback.py): no publish is tried;
    one claim is executed in-process, as when publishing fails.
    """
    batch = batch or settings.DELAYPAY_CLAIM_BATCH
    lease_seconds = lease_seconds or settings.DELAYPAY_LEASE_SECONDS
    budget_seconds = settings.DELAYPAY_PROMOTER_BUDGET_SECONDS if budget_seconds is None else budget_seconds
    in_flight_cap = in_flight_cap or settings.DELAYPAY_INFLIGHT_CAP

    started = time.monotonic()
    deadline = started + budget_seconds
    result = TickResult()
    if not degraded:
        # Payouts first: their claims are bounded by their rails' pacing, so they never
        # starve the internal claims below, which go on until the budget is spent. While
        # Redis is down payouts wait: the promoter never calls a rail in its tick.
        payouts_tick(publish=publish_payouts, deadline=deadline, lease_seconds=lease_seconds, result=result)
    in_flight = count_in_flight()
    while True:
        room = in_flight_cap - in_flight
        if room <= 0:
            result.capped = True
            break
        claim = claim_due(batch=min(batch, room), lease_seconds=lease_seconds)
        if not claim:
            break
        result.claimed += len(claim)
        result.reclaimed += len(claim.reclaimed)
        result.reclaimed_pairs += claim.reclaimed
        result.dispatch_lateness += claim.dispatch_lateness
        in_flight += len(claim)
        messages = messages_for(claim)
        if not degraded:
            try:
                publish(messages)
                result.messages += len(messages)
            except Exception:
                logger.exception("publish failed; executing %d claimed payments in-process", len(claim))
                degraded = True
        if degraded:
            for message in messages:
                execute_in_process(message)
                result.executed_in_process += len(message)
            in_flight -= len(claim)
            break
        if len(claim) < min(batch, room) or time.monotonic() >= deadline:
            break
    result.in_flight = in_flight
    result.seconds = time.monotonic() - started
    return result
