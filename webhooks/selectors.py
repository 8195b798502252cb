"""Webhook reads for operations (the API's reads are in webhooks/endpoints.py)."""

from dataclasses import dataclass

from django.db import connection

from . import sql


@dataclass(frozen=True)
class WebhookHealth:
    events_waiting: int  # events not fanned out yet
    deliveries_pending: int  # due, in flight, or waiting on the ladder
    oldest_due_age_seconds: float


def webhook_health() -> WebhookHealth:
    """The outbox's backlog and lateness (partial indexes only)."""
    with connection.cursor() as cur:
        cur.execute(sql.HEALTH)
        events, deliveries, age = cur.fetchone()
    return WebhookHealth(events_waiting=events, deliveries_pending=deliveries, oldest_due_age_seconds=float(age))
