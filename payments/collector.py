"""The schedule's state read when /metrics is scraped (``ScheduleCollector``): the
schedule's lag from the operational selectors, the review queue's size and age, counts per
status (cached), heartbeats of the promoter, of reconcile and of settlement reconciliation
(a table, so any host sees them, after the process that wrote them exited), the
autoscaling signal (delaypay_workers_needed, payments/scaling.py), and the Celery queues in
Redis. The instruments that count events are in payments/metrics.py; names and meanings
are listed in docs/reference/operations.md ("Metrics")."""

import logging
import math
import time
from collections.abc import Iterable

from django.conf import settings
from django.db import DatabaseError
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from common import broker, prometheus

from . import partitions, scaling, selectors
from .models import Heartbeat

logger = logging.getLogger(__name__)

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
        window = settings.DELAYPAY_SCALE_INFLOW_WINDOW_SECONDS
        inflow = selectors.due_within(seconds=window) / window
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
            *_scaling(inflow=inflow, backlog=health.overdue + health.leases_expired),
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
        runs = selectors.settlement_last_runs(beats)
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


def _scaling(*, inflow: float, backlog: int) -> list[GaugeMetricFamily]:
    """The autoscaling signal (payments/scaling.py) and the two rates it is made of."""
    totals = scaling.apply_totals(prometheus.host_samples(["delaypay_executed", "delaypay_batch_apply_seconds"]))
    rate = scaling.measured_process_rate(totals, full_batch=settings.DELAYPAY_CLAIM_BATCH)
    rate = rate or settings.DELAYPAY_SCALE_PROCESS_RATE
    needed = scaling.workers_needed(
        inflow_per_second=inflow, backlog=backlog, process_rate=rate,
        drain_seconds=settings.DELAYPAY_SCALE_DRAIN_SECONDS,
        target_utilization=settings.DELAYPAY_SCALE_TARGET_UTILIZATION,
        minimum=settings.DELAYPAY_SCALE_MIN_WORKERS, maximum=settings.DELAYPAY_SCALE_MAX_WORKERS,
    )
    return [
        GaugeMetricFamily(
            "delaypay_due_inflow_per_second",
            "SCHEDULED payments falling due within the next DELAYPAY_SCALE_INFLOW_WINDOW_SECONDS, per second.",
            value=inflow,
        ),
        GaugeMetricFamily(
            "delaypay_worker_process_rate",
            "Payments one worker process applies per second of applying: measured from this host's batches "
            "when taken under load, else DELAYPAY_SCALE_PROCESS_RATE.",
            value=rate,
        ),
        GaugeMetricFamily(
            "delaypay_workers_needed",
            "Worker processes (prefork children) needed to apply the due inflow and drain the backlog within "
            "DELAYPAY_SCALE_DRAIN_SECONDS at DELAYPAY_SCALE_TARGET_UTILIZATION (payments/scaling.py).",
            value=needed,
        ),
    ]
