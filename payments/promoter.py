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

from django.conf import settings
from django.db import connection, transaction

logger = logging.getLogger(__name__)

Pair = tuple[str, int]  # (payment_id, attempt)

# Raw SQL because the ORM cannot say UPDATE ... FROM (SELECT ... SKIP LOCKED) RETURNING
# with a data-modifying CTE. One statement claims, fences (attempt + 1), leases, and
# writes the audit events, so a claim and its record commit together.
#
# Fresh and expired rows are two locking CTEs rather than the single "WHERE a OR b" of
# DESIGN.md: with OR the planner bitmap-scans every due row and sorts them all before
# LIMIT, which is O(backlog) per claim during a burst; each CTE here walks its own
# partial index in order and stops after LIMIT rows.
CLAIM_SQL = """
WITH fresh AS (
    SELECT id, status FROM payments_scheduledpayment
     WHERE status = 'SCHEDULED' AND execute_at <= now()
     ORDER BY execute_at, id
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), expired AS (
    SELECT id, status FROM payments_scheduledpayment
     WHERE status = 'EXECUTING' AND lease_until < now()
     ORDER BY lease_until
     LIMIT %(reclaim_batch)s
       FOR UPDATE SKIP LOCKED
), due AS (
    -- Expired leases first (they are the oldest work); the whole claim stays within the
    -- caller's room under the in-flight cap. Rows locked above the limit are released
    -- at commit, untouched.
    SELECT id, status FROM (
        SELECT id, status, 0 AS rank FROM expired UNION ALL SELECT id, status, 1 FROM fresh
    ) candidates
    ORDER BY rank
    LIMIT %(batch)s
), claimed AS (
    UPDATE payments_scheduledpayment p
       SET status = 'EXECUTING',
           attempt = p.attempt + 1,
           lease_until = now() + make_interval(secs => %(lease)s),
           claimed_at = now(),
           updated_at = now()
      FROM due
     WHERE p.id = due.id
 RETURNING p.id, p.attempt, due.status AS previous_status, p.execute_at
), audit AS (
    INSERT INTO payments_paymentevent
           (payment_id, kind, from_status, to_status, attempt, actor, data, created_at)
    SELECT id,
           CASE WHEN previous_status = 'SCHEDULED' THEN 'claimed' ELSE 'reclaimed' END,
           previous_status, 'EXECUTING', attempt, %(actor)s, '{}'::jsonb, now()
      FROM claimed
)
SELECT id, attempt, previous_status, extract(epoch FROM now() - execute_at)::float8 AS lateness
  FROM claimed ORDER BY execute_at, id
"""

# Live leases only. A row whose lease expired is not in flight: its message or worker is
# gone, and it is exactly what the next claim must take again. Counting it would let a
# lost window of messages (Redis restarted with the cap's worth queued) block the
# promoter forever.
IN_FLIGHT_SQL = (
    "SELECT count(*) FROM payments_scheduledpayment WHERE status = 'EXECUTING' AND lease_until >= now()"
)


@dataclass
class Claim:
    fresh: list[Pair] = field(default_factory=list)  # were SCHEDULED
    reclaimed: list[Pair] = field(default_factory=list)  # lease had expired
    dispatch_lateness: list[float] = field(default_factory=list)  # seconds, of the fresh ones

    def __len__(self) -> int:
        return len(self.fresh) + len(self.reclaimed)


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


def claim_params(*, batch: int, lease_seconds: float, actor: str = "promoter") -> dict:
    """CLAIM_SQL's parameters."""
    return {"batch": batch, "reclaim_batch": batch, "lease": float(lease_seconds), "actor": actor}


def claim_due(*, batch: int, lease_seconds: float, actor: str = "promoter") -> Claim:
    """Claim up to ``batch`` due rows and up to ``batch`` expired leases. Commits."""
    claim = Claim()
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(CLAIM_SQL, claim_params(batch=batch, lease_seconds=lease_seconds, actor=actor))
        for payment_id, attempt, previous, lateness in cur.fetchall():
            if previous == "SCHEDULED":
                claim.fresh.append((payment_id, attempt))
                claim.dispatch_lateness.append(lateness)
            else:
                claim.reclaimed.append((payment_id, attempt))
    return claim


def count_in_flight() -> int:
    with connection.cursor() as cur:
        cur.execute(IN_FLIGHT_SQL)
        return cur.fetchone()[0]


def messages_for(claim: Claim) -> list[list[Pair]]:
    """One message for the fresh batch; one per re-claimed payment.

    A payment whose lease expired may be the one that killed its worker: sending it
    alone keeps it from taking a healthy batch down with it again.
    """
    messages = [claim.fresh] if claim.fresh else []
    messages.extend([pair] for pair in claim.reclaimed)
    return messages


def promoter_tick(
    *,
    publish: Callable[[Sequence[list[Pair]]], None],
    execute_in_process: Callable[[list[Pair]], None],
    batch: int | None = None,
    lease_seconds: float | None = None,
    budget_seconds: float | None = None,
    in_flight_cap: int | None = None,
) -> TickResult:
    """Claim and publish until nothing is due, the budget is spent or the cap is hit.

    ``publish`` sends messages after each claim's commit. If it raises (Redis is down),
    the rows just claimed are executed here, in-process, so they neither wait for
    their lease to expire nor burn an attempt; the tick then stops claiming.
    """
    batch = batch or settings.DELAYPAY_CLAIM_BATCH
    lease_seconds = lease_seconds or settings.DELAYPAY_LEASE_SECONDS
    budget_seconds = settings.DELAYPAY_PROMOTER_BUDGET_SECONDS if budget_seconds is None else budget_seconds
    in_flight_cap = in_flight_cap or settings.DELAYPAY_INFLIGHT_CAP

    started = time.monotonic()
    deadline = started + budget_seconds
    result = TickResult()
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
        try:
            publish(messages)
            result.messages += len(messages)
        except Exception:
            logger.exception("publish failed; executing %d claimed payments in-process", len(claim))
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
