"""Figures of a run, read from the database's own timestamps.

* dispatch lateness  = claimed_at - execute_at (the promoter's claim)
* claim to finish    = executed_at - claimed_at (the publish, the queue, a worker taking
  the message, its batch's transaction)
* execution lateness = executed_at - execute_at (the ledger transfer; ``updated_at``
  for a FAILED payment, which has no executed_at)
* drain time         = last finish - first execute_at
* delay since requested = finish - requested_execute_at: what a payer who opted into
  jitter sees (the jitter itself plus the execution lateness); without jitter it is the
  execution lateness

All of them are PostgreSQL ``now()`` values, i.e. the start of the transaction that
wrote them: a batch's finish time is when its transaction began, not when it
committed. The bench also reports the drain it observed by polling (an upper bound).
"""

import time
from dataclasses import dataclass

from django.db import connection

from common.db import database_now

from .stats import bucketed_percentiles, per_second, summarize

TIMINGS_SQL = """
SELECT extract(epoch FROM execute_at)::float8,
       extract(epoch FROM claimed_at)::float8,
       extract(epoch FROM coalesce(executed_at, updated_at))::float8,
       status,
       extract(epoch FROM coalesce(requested_execute_at, execute_at))::float8
  FROM payments_scheduledpayment
 WHERE status IN ('EXECUTED', 'FAILED') AND execute_at >= %s AND execute_at <= %s
"""


@dataclass
class Timing:
    due: float
    claimed: float | None
    finished: float
    status: str
    requested: float | None = None


def fetch_timings(*, due_from, due_to) -> list[Timing]:
    """Every finished payment due in [due_from, due_to]."""
    with connection.cursor() as cur:
        cur.execute(TIMINGS_SQL, [due_from, due_to])
        return [Timing(*row) for row in cur.fetchall()]


def figures(timings: list[Timing]) -> dict:
    """Drain, throughput, lateness percentiles and per-second series of finished payments."""
    if not timings:
        return {"payments": 0, "drain_s": None, "payments_per_s": None,
                "dispatch_lateness_s": summarize([]), "execution_lateness_s": summarize([]),
                "claim_to_finish_s": summarize([]),
                "delay_since_requested_s": summarize([]), "series": {}}
    start = min(t.due for t in timings)
    end = max(t.finished for t in timings)
    drain = end - start
    dispatch = [t.claimed - t.due for t in timings if t.claimed is not None]
    # The rest of the path: the publish, Redis, a worker taking the message, the batch's
    # transaction starting (executed_at is its now()).
    handed = [t.finished - t.claimed for t in timings if t.claimed is not None]
    execution = [t.finished - t.due for t in timings]
    since_requested = [t.finished - (t.requested if t.requested is not None else t.due) for t in timings]
    executed = [t.finished for t in timings if t.status == "EXECUTED"]
    failed = [t.finished for t in timings if t.status == "FAILED"]
    finish_points = [(t.finished, t.finished - t.due) for t in timings]
    claim_points = [(t.claimed, t.claimed - t.due) for t in timings if t.claimed is not None]
    series = {
        # second i covers [start + i, start + i + 1)
        "executed_per_s": per_second(executed, start=start, end=end),
        "failed_per_s": per_second(failed, start=start, end=end),
        "due_per_s": per_second([t.due for t in timings], start=start, end=end),
        "claimed_per_s": per_second([t.claimed for t in timings if t.claimed is not None], start=start, end=end),
        "execution_lateness_p50_s": bucketed_percentiles(finish_points, start=start, q=50),
        "execution_lateness_p99_s": bucketed_percentiles(finish_points, start=start, q=99),
        "execution_lateness_max_s": bucketed_percentiles(finish_points, start=start, q=100),
        "dispatch_lateness_p99_s": bucketed_percentiles(claim_points, start=start, q=99),
    }
    return {
        "payments": len(timings),
        "executed": len(executed),
        "failed": len(failed),
        "drain_s": round(drain, 3),
        "payments_per_s": round(len(timings) / drain, 1) if drain > 0 else None,
        "dispatch_lateness_s": summarize(dispatch),
        "execution_lateness_s": summarize(execution),
        "claim_to_finish_s": summarize(handed),
        "delay_since_requested_s": summarize(since_requested),
        "series": {k: [None if v is None else round(v, 3) for v in vs] for k, vs in series.items()},
    }


def count_unfinished(*, due_to) -> int:
    with connection.cursor() as cur:
        # Two counts, each served by its partial index, rather than one scan of the table
        # every poll (the poll must not load the database it measures).
        cur.execute(
            "SELECT (SELECT count(*) FROM payments_scheduledpayment"
            "         WHERE status = 'SCHEDULED' AND execute_at <= %s)"
            "     + (SELECT count(*) FROM payments_scheduledpayment WHERE status = 'EXECUTING')",
            [due_to],
        )
        return cur.fetchone()[0]


def sleep_until(instant) -> None:
    """Sleep until the database clock reaches ``instant``."""
    while True:
        left = (instant - database_now()).total_seconds()
        if left <= 0:
            return
        time.sleep(min(left, 1.0))


def wait_drained(*, due_to, timeout: float, poll: float = 0.5, on_poll=None, count=count_unfinished) -> float | None:
    """Poll until nothing due by ``due_to`` is left unfinished (``count``: what is left,
    count_unfinished by default); the wall-clock seconds it took, or None on timeout.
    ``on_poll(unfinished)`` is called after each poll."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        left = count(due_to=due_to)
        if on_poll is not None:
            on_poll(left)
        if left == 0:
            return time.monotonic() - started
        time.sleep(poll)
    return None
