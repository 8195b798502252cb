"""delaypay's Prometheus metrics.

Two kinds, both served by ``GET /metrics`` (delaypay/views.py):

* Events counted where they happen, in whichever process: claims and promoter ticks
  (``record_tick``), batch outcomes and latenesses (``record_batch``). They cost a few
  increments per tick or per batch, never a query: the latenesses come with the rows
  the claim returned and the batch locked. In multiprocess mode they are summed over
  every process of the host (delaypay/prometheus.py).
* State read at scrape time (``ScheduleCollector``): the schedule's lag from the
  operational selectors, the review queue's size and age, counts per status (cached),
  heartbeats of the promoter, of reconcile and of settlement reconciliation (a table, so
  any host sees them, after the process that wrote them exited), and the Celery queues
  in Redis.

Names and meanings are listed in docs/reference/operations.md ("Metrics").
"""

import bisect
import logging
import math
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import DatabaseError
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from common import broker
from payments import partitions, selectors, services
from payouts import settlement

from .execution import BatchResult
from .models import Heartbeat

if TYPE_CHECKING:  # the promoter records its ticks here: no import at run time
    from .promoter import TickResult

logger = logging.getLogger(__name__)

# Lateness is judged against an SLO of 2 s at normal load and 60 s under a 100x spike.
LATENESS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)

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
for _call in ("submit", "lookup"):
    for _outcome in ("paid", "declined", "not_found", "unknown"):
        rail_calls_total.labels(rail="sandbox", call=_call, outcome=_outcome)
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


def record_tick(result: "TickResult") -> None:
    """Count one promoter tick (the caller records its heartbeat)."""
    claimed_total.inc(result.claimed)
    reclaimed_total.inc(result.reclaimed)
    promoter_tick_seconds.observe(result.seconds)
    observe_many(dispatch_lateness_seconds, result.dispatch_lateness)


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


def record_limit_refusal(code: str) -> None:
    limit_refusals_total.labels(limit=code).inc()


def record_conflict_retry() -> None:
    conflict_retries_total.inc()


def record_reconcile_result(*, violations: int) -> None:
    """The hook for ``reconcile``: call it after every run with the number of invariant
    violations found (0 when the ledger and the payments agree). It becomes
    ``delaypay_reconcile_violations`` and ``delaypay_reconcile_last_run_timestamp``."""
    services.heartbeat_record(name=Heartbeat.RECONCILE, value=violations)


# --- Scrape time -----------------------------------------------------------------------

_counts_cache: tuple[float, dict[str, int]] | None = None


def payment_counts_cached(max_age: float) -> dict[str, int]:
    """payment_counts_by_status, recomputed at most every ``max_age`` seconds (it scans)."""
    global _counts_cache
    now = time.monotonic()
    if _counts_cache is None or now - _counts_cache[0] >= max_age:
        _counts_cache = (now, selectors.payment_counts_by_status())
    return _counts_cache[1]


class ScheduleCollector(Collector):
    """Gauges read from PostgreSQL and Redis when /metrics is scraped. A source that is
    down leaves its gauges out and sets ``delaypay_metrics_source_up{source}`` to 0."""

    def __init__(self, *, counts_max_age: float):
        self.counts_max_age = counts_max_age

    def collect(self) -> Iterable[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "delaypay_metrics_source_up", "1 when the source answered this scrape.", labels=["source"]
        )
        try:
            yield from self._database()
            up.add_metric(["database"], 1)
        except DatabaseError as exc:
            logger.warning("metrics: database unavailable", extra={"error": type(exc).__name__})
            up.add_metric(["database"], 0)
        # One quick PING first: a Redis that is down costs the scrape half a second, not
        # redis-py's retries, and is reported as the broker being down (degraded mode).
        broker_up = broker.broker_answers()
        yield GaugeMetricFamily(
            "delaypay_broker_up",
            "1 when the Celery broker (Redis) answered a PING at this scrape; 0: the promoter runs degraded.",
            value=1 if broker_up else 0,
        )
        try:
            if not broker_up:
                raise ConnectionError("the broker did not answer a PING")
            yield from self._redis()
            up.add_metric(["redis"], 1)
        except Exception as exc:  # redis-py raises several families; the scrape goes on
            logger.warning("metrics: redis unavailable", extra={"error": type(exc).__name__})
            up.add_metric(["redis"], 0)
        yield up

    def _database(self) -> list[GaugeMetricFamily]:
        # Everything is read first so a failure yields nothing half-done.
        health = selectors.schedule_health()
        review = selectors.review_queue_health()
        counts = payment_counts_cached(self.counts_max_age)
        beats = selectors.heartbeat_readings()
        layout = partitions.partition_state()
        families = [
            GaugeMetricFamily(
                "delaypay_due_oldest_age_seconds",
                "Age of the oldest SCHEDULED payment whose execute_at has passed (0 when none).",
                value=health.oldest_due_age_seconds,
            ),
            GaugeMetricFamily("delaypay_overdue", "SCHEDULED payments whose execute_at has passed.",
                              value=health.overdue),
            GaugeMetricFamily("delaypay_in_flight", "EXECUTING payments with a live lease.", value=health.in_flight),
            GaugeMetricFamily("delaypay_leases_expired", "EXECUTING payments whose lease has expired.",
                              value=health.leases_expired),
            GaugeMetricFamily("delaypay_needs_review",
                              "Payments parked in NEEDS_REVIEW, waiting for staff to re-drive or resolve them.",
                              value=review.count),
            GaugeMetricFamily("delaypay_needs_review_oldest_age_seconds",
                              "How long the oldest NEEDS_REVIEW payment has waited since it was parked (0 when none).",
                              value=review.oldest_age_seconds),
        ]
        breaker = GaugeMetricFamily(
            "delaypay_rail_breaker_state",
            "1 for each rail's current breaker state (closed, open, half_open); forced says whether staff hold it.",
            labels=["rail", "state", "forced"],
        )
        pending = GaugeMetricFamily(
            "delaypay_rail_pending_payouts",
            "Payouts whose funds are reserved and whose outcome at the rail is not known yet, and the age of the "
            "oldest (seconds).", labels=["rail", "measure"],
        )
        for rail in selectors.rail_states():
            for state in ("closed", "open", "half_open"):
                breaker.add_metric([rail.rail, state, rail.forced or "no"],
                                   1 if (rail.forced or rail.breaker) == state else 0)
            pending.add_metric([rail.rail, "count"], rail.pending)
            pending.add_metric([rail.rail, "oldest_age_seconds"], rail.pending_oldest_age_seconds)
        families += [breaker, pending]
        by_status = GaugeMetricFamily(
            "delaypay_payments", "Payments by status (cached for a few seconds).", labels=["status"]
        )
        for status, n in sorted(counts.items()):
            by_status.add_metric([status], n)
        families.append(by_status)
        tick = beats.get(Heartbeat.PROMOTER)
        if tick is not None:
            families += [
                GaugeMetricFamily("delaypay_promoter_last_tick_timestamp",
                                  "Unix time of the last promoter tick (any promoter, any host).",
                                  value=tick.beat_at.timestamp()),
                GaugeMetricFamily("delaypay_promoter_last_tick_age_seconds",
                                  "Seconds since the last promoter tick, on the database clock.",
                                  value=tick.age_seconds),
            ]
        if settings.DELAYPAY_CLAIM_SHARDS > 1:
            # Each shard of this configuration; one that never ticked reads +Inf (the alert fires).
            shards = GaugeMetricFamily(
                "delaypay_promoter_shard_last_tick_age_seconds",
                "Seconds since the last tick of each claim shard (DELAYPAY_CLAIM_SHARDS), on the database clock.",
                labels=["shard"],
            )
            for index in range(settings.DELAYPAY_CLAIM_SHARDS):
                beat = beats.get(Heartbeat.shard_name(index))
                shards.add_metric([str(index)], beat.age_seconds if beat is not None else math.inf)
            families.append(shards)
        families.append(GaugeMetricFamily(
            "delaypay_partitions_ahead_seconds",
            "Seconds from now to the end of the last month that has its partitions (payments/partitions.py); "
            "a new payment's id past it would land in the default partition.",
            value=layout["ahead_seconds"],
        ))
        default_rows = GaugeMetricFamily(
            "delaypay_partition_default_rows",
            "Rows in each table's default partition (ids no month covers; counted up to 10,000). Should be 0.",
            labels=["table"],
        )
        for table, n in layout["default_rows"].items():
            default_rows.add_metric([table], n)
        families += [default_rows, GaugeMetricFamily(
            "delaypay_partition_months", "Months of the schedule with their partitions in the database.",
            value=len(layout["months"]),
        )]
        reconcile = beats.get(Heartbeat.RECONCILE)
        if reconcile is not None:
            families += [
                GaugeMetricFamily("delaypay_reconcile_violations",
                                  "Invariant violations found by the last reconcile run (0 = consistent).",
                                  value=reconcile.value),
                GaugeMetricFamily("delaypay_reconcile_last_run_timestamp",
                                  "Unix time of the last reconcile run.", value=reconcile.beat_at.timestamp()),
            ]
        runs = settlement.last_runs(beats)
        if runs:
            mismatches = GaugeMetricFamily(
                "delaypay_settlement_mismatches",
                "Mismatches the last settlement reconciliation of a rail found (reconcile_settlement), by kind; "
                "read from its heartbeats.", labels=["rail", "kind"],
            )
            last_run = GaugeMetricFamily(
                "delaypay_settlement_last_run_timestamp", "Unix time of the last settlement reconciliation of a rail.",
                labels=["rail"],
            )
            for run in runs:
                for kind, n in run.mismatches.items():
                    mismatches.add_metric([run.rail, kind], n)
                last_run.add_metric([run.rail], run.at.timestamp())
            families += [mismatches, last_run]
        return families

    def _redis(self) -> list[GaugeMetricFamily]:
        lengths = broker.queue_lengths()
        unacked = broker.unacked_count()
        queue = GaugeMetricFamily("delaypay_queue_length", "Messages waiting in a Celery queue.", labels=["queue"])
        for name, n in lengths.items():
            queue.add_metric([name], n)
        return [
            queue,
            GaugeMetricFamily("delaypay_queue_unacked",
                              "Messages delivered to workers and not yet acknowledged (all queues).", value=unacked),
        ]
