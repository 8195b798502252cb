"""The operations dashboard: one admin page with the numbers an operator watches.

Every number comes from a selector in payments/selectors.py, the same ones the metrics
endpoint exports; this module only arranges them and draws the bar chart as inline SVG
on the server (no JavaScript, no CDN).
"""

from dataclasses import dataclass
from datetime import datetime

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse

from .models import BreakerState, PaymentStatus
from .selectors import (
    RailReading,
    payment_counts_by_status,
    payments_due_by_minute,
    rail_states,
    recent_outcomes,
    review_queue_health,
    schedule_health,
)

CHART_WIDTH = 720
CHART_HEIGHT = 140  # the bars' area; labels go below it
CHART_LABEL_EVERY = 10  # minutes between axis labels
REFRESH_SECONDS = 15


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    minute: datetime
    count: int


@dataclass(frozen=True)
class Chart:
    bars: list[Bar]
    labels: list[tuple[float, str]]  # (x, "HH:MM")
    peak: int
    total: int
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT

    @property
    def view_height(self) -> int:
        return self.height + 18


def due_chart(buckets: list[tuple[datetime, int]]) -> Chart:
    """Bar geometry for payments due per minute; a bar's height is relative to the busiest minute."""
    peak = max((n for _, n in buckets), default=0)
    slot = CHART_WIDTH / max(len(buckets), 1)
    bars, labels = [], []
    for i, (minute, count) in enumerate(buckets):
        height = round(count / peak * (CHART_HEIGHT - 4), 1) if peak else 0.0
        if count and height < 2:
            height = 2.0  # a minute with anything due stays visible
        x = round(i * slot, 1)
        bars.append(Bar(x=x, y=round(CHART_HEIGHT - height, 1), width=round(slot * 0.8, 1), height=height,
                        minute=minute, count=count))
        if i % CHART_LABEL_EVERY == 0:
            labels.append((x, minute.strftime("%H:%M")))
    return Chart(bars=bars, labels=labels, peak=peak, total=sum(n for _, n in buckets))


def age_text(seconds: float) -> str:
    """3 s, 4 min 5 s, 2 h 3 min, 1 d 2 h."""
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


@dataclass(frozen=True)
class RailTile:
    rail: str
    state: str  # what the claim obeys: "closed", "half_open", "open", "forced open", "forced closed"
    tone: str  # green closed, amber half-open, red open or forced open
    pending: int
    oldest_pending_age: str


def breaker_tone(*, breaker: str, forced: str) -> str:
    """Green closed, amber half-open, red open or forced open (what the claim obeys)."""
    return {BreakerState.CLOSED: "green", BreakerState.HALF_OPEN: "amber"}.get(forced or breaker, "red")


def breaker_text(*, breaker: str, forced: str) -> str:
    """What the claim obeys, and whether staff hold it there."""
    return f"forced {forced}" if forced else breaker


def rail_tile(reading: RailReading) -> RailTile:
    return RailTile(
        rail=reading.rail,
        state=breaker_text(breaker=reading.breaker, forced=reading.forced),
        tone=breaker_tone(breaker=reading.breaker, forced=reading.forced),
        pending=reading.pending,
        oldest_pending_age=age_text(reading.pending_oldest_age_seconds),
    )


def dashboard_view(request):
    """Staff with view access to payments; admin_site.admin_view (urls.py) handles login."""
    if not request.user.has_perm("payments.view_scheduledpayment"):
        raise PermissionDenied
    health = schedule_health()
    counts = payment_counts_by_status()
    outcomes = recent_outcomes(seconds=3600)
    review = review_queue_health()
    context = {
        **admin.site.each_context(request),
        "title": "Dashboard",
        "health": health,
        "oldest_due_age": age_text(health.oldest_due_age_seconds),
        "review": review,
        "oldest_review_age": age_text(review.oldest_age_seconds),
        "counts": [(status, counts[status]) for status in PaymentStatus.values],
        "total": sum(counts.values()),
        "outcomes": outcomes,
        "failed_by_reason": sorted(outcomes.failed.items(), key=lambda kv: (-kv[1], kv[0])),
        "chart": due_chart(payments_due_by_minute(minutes=60)),
        "rails": [rail_tile(reading) for reading in rail_states()],
        "refresh_seconds": REFRESH_SECONDS,
    }
    return TemplateResponse(request, "admin/payments/dashboard.html", context)
