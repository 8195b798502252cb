"""The webhooks' Prometheus metrics (served by ``GET /metrics`` with the payments' ones).

* Counted where they happen (the webhooks worker): every try by outcome, and its latency.
* Read at scrape time (``WebhookCollector``): the outbox backlog and how late its oldest
  due work is (``delaypay_webhook_oldest_undelivered_age_seconds``, the alert
  ``DelaypayWebhooksBehind``).

Names and meanings are listed in docs/reference/operations.md ("Metrics").
"""

import logging
from collections.abc import Iterable

from django.db import DatabaseError
from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from . import selectors

logger = logging.getLogger(__name__)

deliveries_total = Counter(
    "delaypay_webhook_deliveries",
    "Webhook delivery tries by outcome: succeeded (2xx), retry (another try waits on the ladder), "
    "failed (the ladder is spent).",
    ["outcome"],
)
delivery_seconds = Histogram(
    "delaypay_webhook_delivery_seconds",
    "Time of one webhook delivery try, address check, connection and answer included.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


def record_tries(outcomes: list[tuple]) -> None:
    """Count the recorded tries: (try, attempt, status, delay) as dispatcher.record builds them."""
    counts: dict[str, int] = {}
    for t, _attempt, status, _delay in outcomes:
        outcome = {"succeeded": "succeeded", "failed": "failed"}.get(status, "retry")
        counts[outcome] = counts.get(outcome, 0) + 1
        delivery_seconds.observe(t.latency_ms / 1000)
    for outcome, n in counts.items():
        deliveries_total.labels(outcome=outcome).inc(n)


class WebhookCollector(Collector):
    """The outbox's state, read from PostgreSQL when /metrics is scraped. A database that
    does not answer leaves these out (ScheduleCollector reports the source as down)."""

    def collect(self) -> Iterable[GaugeMetricFamily]:
        try:
            health = selectors.webhook_health()
        except DatabaseError as exc:
            logger.warning("metrics: webhook readings unavailable", extra={"error": type(exc).__name__})
            return
        yield GaugeMetricFamily(
            "delaypay_webhook_outbox_backlog",
            "Webhook work waiting: events not fanned out yet plus pending deliveries (due, in flight, or "
            "waiting on the retry ladder).",
            value=health.events_waiting + health.deliveries_pending,
        )
        yield GaugeMetricFamily(
            "delaypay_webhook_oldest_undelivered_age_seconds",
            "How long the oldest due webhook work has waited: an event not fanned out yet, or a pending "
            "delivery past its next try (0 when none). A delivery waiting on its ladder is not late.",
            value=health.oldest_due_age_seconds,
        )
