"""delaypay's Prometheus metrics: the instruments (counters, gauges, histograms) and the
functions that record events on them. A leaf module: it imports nothing of the engine's
services or state, so every module of every package may record here.

Two kinds, both served by ``GET /metrics`` (delaypay/views.py):

* Events counted where they happen, in whichever process: claims and promoter ticks
  (``record_tick``), batch outcomes and latenesses (``record_batch``). They cost a few
  increments per tick or per batch, never a query: the latenesses come with the rows
  the claim returned and the batch locked. In multiprocess mode they are summed over
  every process of the host (delaypay/prometheus.py).
* State read at scrape time (``ScheduleCollector``, payments/collector.py): the schedule's lag from the
  operational selectors, the review queue's size and age, counts per status (cached),
  heartbeats of the promoter, of reconcile and of settlement reconciliation (a table, so
  any host sees them, after the process that wrote them exited), and the Celery queues
  in Redis.

Names and meanings are listed in docs/reference/operations.md ("Metrics").
"""

import bisect
import logging

from prometheus_client import Counter, Gauge, Histogram

from rails.base import RAIL_NAMES

from .execution import BatchResult

logger = logging.getLogger(__name__)

# Lateness is judged against an SLO of 2 s at normal load and 60 s under a 100x spike.
LATENESS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)

claimed_total = Counter(
    "delaypay_claimed", "Payments claimed by the promoter, fresh and re-claimed (SCHEDULED or expired -> EXECUTING)."
)
reclaimed_total = Counter("delaypay_reclaimed", "Payments claimed again because their lease had expired.")
executed_total = Counter(
    "delaypay_executed",
    "Outcomes of payments handed to an executor: executed, failed (by reason), already_applied "
    "(a retry found the transfer), stale (superseded attempt, changed nothing), error (unexpected; retried).",
    ["outcome", "reason"],
)
transient_errors_total = Counter(
    "delaypay_batch_transient_errors", "Batches rolled back by a transient database error (then retried)."
)
api_database_unavailable_total = Counter(
    "delaypay_api_database_unavailable",
    "API requests answered 503 database_unavailable: the primary refused or dropped the connection "
    "(a failover, a restart); nothing was written and the client retries.",
)
limit_refusals_total = Counter(
    "delaypay_limit_refusals",
    "Creates and changes refused by a per-user limit or for paying a system account, by code.",
    ["limit"],
)
conflict_retries_total = Counter(
    "delaypay_batch_conflict_retries",
    "Batches rolled back by a deadlock or serialization failure and applied again at once, in-process.",
)
dispatch_lateness_seconds = Histogram(
    "delaypay_dispatch_lateness_seconds",
    "claimed_at - execute_at of each payment's first claim.",
    buckets=LATENESS_BUCKETS,
)
execution_lateness_seconds = Histogram(
    "delaypay_execution_lateness_seconds",
    "executed_at - execute_at of each payment that moved money.",
    buckets=LATENESS_BUCKETS,
)
batch_apply_seconds = Histogram(
    "delaypay_batch_apply_seconds",
    "Time to apply one execute message (a batch), bisection included.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
# The only gauge here that a process sets rather than /metrics reading it at scrape time:
# it is that process's state (a promoter that exits is not degraded any more), so it
# leaves with it (livemax).
# Anything an alert reads about persistent state is read from the database at scrape time
# (ScheduleCollector), or it would vanish with the process that set it.
degraded_mode = Gauge(
    "delaypay_degraded_mode",
    "1 while this promoter executes due payments from the database because Redis is down (payments/fallback.py).",
    multiprocess_mode="livemax",
)
releasing = Gauge(
    "delaypay_releasing",
    "1 while this promoter releases payments at their due instant between the ticks (payments/release.py); "
    "one promoter of the fleet at a time.",
    multiprocess_mode="livemax",
)
released_total = Counter(
    "delaypay_released",
    "Payments the releaser claimed at their due instant (payments/release.py); also in delaypay_claimed_total.",
)
degraded_executed_total = Counter(
    "delaypay_degraded_executed",
    "Claimed payments the promoter executed in-process in degraded mode, Redis being down (any outcome: "
    "delaypay_executed_total has them by outcome).",
)
promoter_tick_seconds = Histogram(
    "delaypay_promoter_tick_seconds",
    "Time one promoter tick spent claiming and publishing.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.8, 1, 2, 5),
)
recurring_generation_failures_total = Counter(
    "delaypay_recurring_generation_failures",
    "Recurring payments whose next occurrence a promoter tick could not generate (rolled back alone, tried "
    "again next tick), by reason: lock_timeout, deadlock, serialization, timeout, database, rule, error.",
    ["reason"],
)
rail_calls_total = Counter(
    "delaypay_rail_calls",
    "Calls to a payment rail by call (submit, lookup) and outcome: paid, declined, not_found, unknown (no answer: "
    "a timeout, a 5xx, a dropped connection; the payout is looked up again later).",
    ["rail", "call", "outcome"],
)
rail_call_seconds = Histogram(
    "delaypay_rail_call_seconds",
    "Time of one call to a payment rail (submit or lookup), timeouts included.",
    ["rail", "call"],
    buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
# Every label value exported from the start (at 0), so rate() and the alerts see a series
# before the first failure or refusal, in every process.
for _reason in ("lock_timeout", "deadlock", "serialization", "timeout", "database", "rule", "error"):
    recurring_generation_failures_total.labels(reason=_reason)
for _rail in RAIL_NAMES:
    for _call in ("submit", "lookup"):
        rail_call_seconds.labels(rail=_rail, call=_call)  # DelaypayRailSlow reads its buckets
        for _outcome in ("paid", "declined", "not_found", "unknown"):
            rail_calls_total.labels(rail=_rail, call=_call, outcome=_outcome)
for _code in ("limit_pending_payments", "limit_active_series", "limit_daily_outflow", "system_account"):
    limit_refusals_total.labels(limit=_code)


def observe_many(histogram: Histogram, values: list[float]) -> None:
    """``histogram.observe`` for many values at once: one increment per bucket touched
    instead of one per value (a batch carries hundreds of latenesses; in multiprocess
    mode each increment is a locked write to an mmap)."""
    if not values:
        return
    buckets = getattr(histogram, "_buckets", None)
    bounds = getattr(histogram, "_upper_bounds", None)
    if buckets is None or bounds is None:  # prometheus_client changed its insides
        for value in values:
            histogram.observe(value)
        return
    counts = [0] * len(bounds)
    for value in values:
        counts[bisect.bisect_left(bounds, value)] += 1  # first bound >= value, as observe()
    for i, n in enumerate(counts):
        if n:
            buckets[i].inc(n)
    histogram._sum.inc(sum(values))


def record_recurring_generation_failure(reason: str) -> None:
    recurring_generation_failures_total.labels(reason=reason).inc()


def record_rail_call(*, rail: str, call: str, outcome: str, seconds: float) -> None:
    """One call to a rail (payouts/executor.py)."""
    rail_calls_total.labels(rail=rail, call=call, outcome=outcome).inc()
    rail_call_seconds.labels(rail=rail, call=call).observe(seconds)


def record_tick(result) -> None:
    """Count one promoter tick, a ``promoter.TickResult`` (the caller records its heartbeat)."""
    claimed_total.inc(result.claimed)
    reclaimed_total.inc(result.reclaimed)
    promoter_tick_seconds.observe(result.seconds)
    observe_many(dispatch_lateness_seconds, result.dispatch_lateness)


def record_release(result) -> None:
    """Count one release round, a ``release.Round`` (payments/release.py)."""
    claimed_total.inc(result.claimed)
    released_total.inc(result.claimed)
    observe_many(dispatch_lateness_seconds, result.dispatch_lateness)


def record_releasing(active: bool) -> None:
    """This promoter holds (1) or gave up (0) the release lock."""
    releasing.set(1 if active else 0)


def record_degraded(*, active: bool, executed: int = 0) -> None:
    """The fallback's state (payments/fallback.py) and the payments it executed in-process."""
    degraded_mode.set(1 if active else 0)
    degraded_executed_total.inc(executed)


def record_batch(result: BatchResult, *, seconds: float) -> None:
    """Count the outcomes of one applied batch."""
    for outcome, n in (
        ("executed", len(result.executed)),
        ("already_applied", len(result.already_applied)),
        ("stale", len(result.stale)),
    ):
        if n:
            executed_total.labels(outcome, "").inc(n)
    failed: dict[str, int] = {}
    for reason in result.failed.values():
        failed[reason] = failed.get(reason, 0) + 1
    for reason, n in failed.items():
        executed_total.labels("failed", reason).inc(n)
    for reason in result.parked.values():
        executed_total.labels("parked", reason).inc()
    if result.retrying:
        executed_total.labels("retry", "").inc(len(result.retrying))
    if result.unknown:
        executed_total.labels("unknown", "").inc(len(result.unknown))
    observe_many(execution_lateness_seconds, result.execution_lateness)
    batch_apply_seconds.observe(seconds)


def record_error() -> None:
    """One payment's apply raised unexpectedly (it retries on the ladder, or is parked)."""
    executed_total.labels("error", "").inc()


def record_transient_error() -> None:
    transient_errors_total.inc()


def record_database_unavailable() -> None:
    api_database_unavailable_total.inc()


def record_limit_refusal(code: str) -> None:
    limit_refusals_total.labels(limit=code).inc()


def record_conflict_retry() -> None:
    conflict_retries_total.inc()
