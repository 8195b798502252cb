"""The operations dashboard: one admin page with the numbers an operator watches.

Every number comes from a selector (payments/selectors.py, webhooks/selectors.py), the
same ones the metrics endpoint exports; this module only arranges them, links each tile
to exactly the rows it counts, and draws the charts as inline SVG on the server (no
JavaScript, no CDN). All readings are taken in one read-only transaction, so they share
one database clock (``now()`` is the transaction's start): the page's "as of" time, and
the bound every "last hour" link carries.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import admin
from django.core.cache import cache
from django.db import transaction
from django.template.response import TemplateResponse
from django.urls import reverse
from redis.exceptions import RedisError

from common import broker
from common.authz import MissingPermission
from common.db import database_now
from common.formats import human
from payments.models import BreakerState, Heartbeat, PaymentEvent, PaymentStatus
from payments.reasons import failure_reason
from payments.selectors import (
    HeartbeatReading,
    LatenessSlot,
    OutcomeSlot,
    RailReading,
    heartbeat_readings,
    lateness_history,
    outcomes_history,
    payment_counts_by_status,
    payments_due_by_minute,
    rail_states,
    recent_lateness,
    recent_outcomes,
    review_queue_health,
    schedule_health,
    stuck_payouts_by_rail,
)
from webhooks.models import DeliveryStatus
from webhooks.selectors import webhook_health

CHART_WIDTH = 720
CHART_HEIGHT = 140  # the bars' area; labels go below it
CHART_LABEL_EVERY = 10  # minutes between axis labels
REFRESH_SECONDS = 15
RECENT_SECONDS = 3600  # the "last hour" tiles

# Red only when something is wrong, at the thresholds of the alerts
# (deploy/prometheus/alerts.yml). The promoter claims every second, so a payment a few
# seconds overdue is the normal state of a busy schedule; a minute is not (as
# DelaypayDuePaymentsLate: delaypay_due_oldest_age_seconds > 60, the SLO).
OVERDUE_ALERT_SECONDS = 60
# Webhook work is late past this (as DelaypayWebhooksBehind: a receiver may be slow for a while).
WEBHOOK_ALERT_SECONDS = 300
# Failures are normal (an empty account fails its payment); a share above this is not.
FAILED_ALERT_RATIO = 0.05
# On time: the p99 execution lateness of the last few minutes, red above the SLO of
# DelaypayExecutionLatenessSLO (500 ms; tens of milliseconds when the releaser releases).
ON_TIME_SECONDS = 300
ON_TIME_ALERT_SECONDS = 0.5

# The 24 h history: outcomes per 10 minutes (144 stacked bars), lateness per minute.
OUTCOME_BUCKET_SECONDS = 600
OUTCOME_SLOTS = 144
LATENESS_BUCKET_SECONDS = 60
LATENESS_SLOTS = 1440
HISTORY_LABEL_EVERY = timedelta(hours=2)
# Two readings whose cost grows with the table are read at most once a minute (shared by
# every web process through the cache): the 24 h history (measured at 1M payments: 20 ms
# at 2,500 executions a day, 560 ms at 200,000 a day; past slots never change, the log is
# append-only) and the counts by status (a scan of every row: 430 ms at 1M). The tiles
# that say whether something is wrong (overdue, leases, review, the last hour) are read
# on every request, on the page's one database clock.
READINGS_CACHE_SECONDS = 60
HISTORY_CACHE_KEY = "dashboard:history-charts:v1"  # bump when the readings change shape
COUNTS_CACHE_KEY = "dashboard:status-counts:v1"


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


@dataclass(frozen=True)
class StackedBar:
    x: float
    width: float
    start: datetime
    segments: list[tuple[str, float, float, str]]  # (kind, y, height, hover text), bottom first


@dataclass(frozen=True)
class OutcomeChart:
    bars: list[StackedBar]
    labels: list[tuple[float, str]]
    peak: int  # the busiest slot's total
    totals: dict[str, int]  # kind -> count over the window
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT

    @property
    def view_height(self) -> int:
        return self.height + 18


OUTCOME_KINDS = ("executed", "failed", "cancelled")


def history_labels(starts: list[datetime], slot_width: float) -> list[tuple[float, str]]:
    """An "HH:MM" label at every slot that starts on a HISTORY_LABEL_EVERY boundary (UTC)."""
    every = int(HISTORY_LABEL_EVERY.total_seconds())
    return [
        (round(i * slot_width, 1), start.strftime("%H:%M"))
        for i, start in enumerate(starts)
        if int(start.timestamp()) % every == 0
    ]


def outcome_chart(slots: list[OutcomeSlot]) -> OutcomeChart:
    """Stacked bars, executed at the bottom, then failed, then cancelled; heights relative
    to the busiest slot."""
    peak = max((s.executed + s.failed + s.cancelled for s in slots), default=0)
    slot_width = CHART_WIDTH / max(len(slots), 1)
    bars = []
    for i, slot in enumerate(slots):
        y, segments = float(CHART_HEIGHT), []
        for kind in OUTCOME_KINDS:
            count = getattr(slot, kind)
            if not count:
                continue
            height = max(count / peak * (CHART_HEIGHT - 4), 1.0)
            y -= height
            segments.append((kind, round(y, 1), round(height, 1), f"{slot.start:%H:%M} UTC: {count:,} {kind}"))
        bars.append(StackedBar(x=round(i * slot_width, 1), width=round(slot_width * 0.8, 1), start=slot.start,
                               segments=segments))
    return OutcomeChart(
        bars=bars,
        labels=history_labels([s.start for s in slots], slot_width),
        peak=peak,
        totals={kind: sum(getattr(s, kind) for s in slots) for kind in OUTCOME_KINDS},
    )


@dataclass(frozen=True)
class LatenessChart:
    p50_path: str  # SVG path data; a minute with nothing executed breaks the line
    p99_path: str
    labels: list[tuple[float, str]]
    ceiling_seconds: float  # the top of the chart
    worst_p99_seconds: float | None
    points: int  # minutes with executions
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT

    @property
    def view_height(self) -> int:
        return self.height + 18

    @property
    def ceiling_text(self) -> str:
        return seconds_text(self.ceiling_seconds)


def seconds_text(seconds: float) -> str:
    """Lateness as an operator reads it: 12 ms, 1.4 s, 3 min 5 s."""
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    return age_text(seconds)


def lateness_path(values: list[float | None], slot_width: float, ceiling: float) -> str:
    """``M x y L x y ...`` per run of minutes with executions (a gap starts a new run); a
    run of one minute is a short dash, so it shows."""
    runs: list[list[tuple[float, float]]] = []
    previous = None
    for i, value in enumerate(values):
        if value is None:
            previous = None
            continue
        point = (round(i * slot_width, 1), round(CHART_HEIGHT - min(max(value, 0.0), ceiling) / ceiling
                                                 * (CHART_HEIGHT - 4), 1))
        if previous is None:
            runs.append([])
        runs[-1].append(point)
        previous = point
    parts = []
    for run in runs:
        (x, y), rest = run[0], run[1:]
        parts.append(f"M{x} {y} " + (" ".join(f"L{x} {y}" for x, y in rest) if rest else f"h{max(slot_width, 1.0)}"))
    return " ".join(parts)


def lateness_chart(slots: list[LatenessSlot]) -> LatenessChart:
    """Two lines, p50 and p99, on one linear scale up to the worst p99 (at least 1 s)."""
    p99s = [s.p99_seconds for s in slots if s.p99_seconds is not None]
    worst = max(p99s, default=None)
    ceiling = max(worst or 0.0, 1.0)
    slot_width = CHART_WIDTH / max(len(slots), 1)
    return LatenessChart(
        p50_path=lateness_path([s.p50_seconds for s in slots], slot_width, ceiling),
        p99_path=lateness_path([s.p99_seconds for s in slots], slot_width, ceiling),
        labels=history_labels([s.start for s in slots], slot_width),
        ceiling_seconds=ceiling,
        worst_p99_seconds=worst,
        points=len(p99s),
    )


def changelist_url(app_model: str, **params) -> str:
    """An admin changelist URL with these exact filters (datetimes in ISO 8601)."""
    query = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in params.items()}
    return reverse(f"admin:{app_model}_changelist") + ("?" + urlencode(query) if query else "")


def events_url(*, kind: str, since: datetime, until: datetime, **params) -> str:
    """The payment events of ``kind`` recorded in [since, until]: the rows a "last hour"
    tile counts (each executed or failed payment has exactly one such event)."""
    return changelist_url(
        "payments_paymentevent", kind__exact=kind, created_at__gte=since, created_at__lte=until, **params
    )


def cached_reading(key: str, compute):
    """``compute()``, or its copy from the cache when read in the last READINGS_CACHE_SECONDS
    (shared by every web process). Redis down: computed each time (the page never fails
    for the cache)."""
    try:
        cached = cache.get(key)
    except RedisError:
        cached = None
    if cached is not None:
        return cached
    value = compute()
    try:
        cache.set(key, value, READINGS_CACHE_SECONDS)
    except RedisError:
        pass
    return value


def history_charts() -> tuple[OutcomeChart, LatenessChart]:
    """The 24 h outcome and lateness charts (the drawn charts are cached: far fewer
    objects to unpickle than the slots)."""
    return cached_reading(HISTORY_CACHE_KEY, lambda: (
        outcome_chart(outcomes_history(bucket_seconds=OUTCOME_BUCKET_SECONDS, slots=OUTCOME_SLOTS)),
        lateness_chart(lateness_history(bucket_seconds=LATENESS_BUCKET_SECONDS, slots=LATENESS_SLOTS)),
    ))


def live_status_counts(*, health, review) -> dict[str, int]:
    """The statuses a tile counts live, from the tiles' own readings: the status table shows
    these instead of its cached counts, so the page never says 7 in a tile and 10 in the
    table for the same payments. EXECUTING is the live leases and the expired ones
    (LEASE_COUNTS), NEEDS_REVIEW the review queue (REVIEW_QUEUE): both from partial
    indexes, read on every request. The other statuses stay cached (status_counts)."""
    return {
        PaymentStatus.EXECUTING: health.in_flight + health.leases_expired,
        PaymentStatus.NEEDS_REVIEW: review.count,
    }


def status_counts() -> tuple[dict[str, int], datetime]:
    """Exact counts by status and when they were counted (a whole-table scan: 430 ms at
    1M payments on 2 cores, so at most once a minute)."""
    return cached_reading(COUNTS_CACHE_KEY, lambda: (payment_counts_by_status(), database_now()))


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


# --- Processes: is each process type alive? -----------------------------------------------


@dataclass(frozen=True)
class ProcessRow:
    process: str  # the Procfile's name
    signal: str  # what writes the heartbeat read
    age: str  # since the newest heartbeat ("never" when there is none)
    state: str  # "alive", "stale" or "missing"
    tone: str  # green alive, red stale or missing
    limit: str  # the age past which it is stale
    queue: str  # the Celery queue it takes messages from ("" for beat)
    waiting: int | None  # messages waiting in that queue; None when Redis did not answer


# (process, its queue, the heartbeat it writes, what writes it). The worker, payouts and
# webhooks processes write none in their work: beat sends each a process_heartbeat
# (payments/tasks.py) every PROCESS_HEARTBEAT_SECONDS.
PROCESS_SIGNALS = (
    ("promoter", "promoter", Heartbeat.PROMOTER, "every promoter tick"),
    ("worker", "execute", Heartbeat.process_name("worker"), "process_heartbeat, every {period}"),
    ("payouts", "payouts", Heartbeat.process_name("payouts"), "process_heartbeat, every {period}"),
    ("webhooks", "webhooks", Heartbeat.process_name("webhooks"), "process_heartbeat, every {period}"),
)


def process_row(process: str, *, queue: str, beat: HeartbeatReading | None, signal: str, limit: float,
                queues: dict[str, int] | None) -> ProcessRow:
    if beat is None:
        state, age = "missing", "never"
    else:
        state, age = ("alive" if beat.age_seconds <= limit else "stale"), f"{age_text(beat.age_seconds)} ago"
    return ProcessRow(process=process, signal=signal, age=age, state=state,
                      tone="green" if state == "alive" else "red", limit=age_text(limit), queue=queue,
                      waiting=None if queues is None or not queue else queues.get(queue, 0))


def process_rows(*, beats: dict[str, HeartbeatReading], queues: dict[str, int] | None) -> list[ProcessRow]:
    """A row per process type from the heartbeats (database clock): red when its newest
    is older than its limit (stale) or there is none (missing). The promoter's limit is
    readiness's (DELAYPAY_READY_MAX_TICK_AGE_SECONDS), each claim shard's too; the others'
    PROCESS_STALE_SECONDS. Beat has no heartbeat of its own: it is alive while the
    heartbeats it sends arrive, so it reads the newest of the worker's, payouts' and
    webhooks' (all three stale at once: beat, or Redis)."""
    tick_limit = settings.DELAYPAY_READY_MAX_TICK_AGE_SECONDS
    stale = settings.PROCESS_STALE_SECONDS
    period = age_text(settings.PROCESS_HEARTBEAT_SECONDS)
    rows = []
    for process, queue, name, signal in PROCESS_SIGNALS:
        limit = tick_limit if process == "promoter" else stale
        rows.append(process_row(process, queue=queue, beat=beats.get(name), signal=signal.format(period=period),
                                limit=limit, queues=queues))
    if settings.DELAYPAY_CLAIM_SHARDS > 1:
        rows[1:1] = [
            process_row(f"promoter, claim shard {index}", queue="", beat=beats.get(Heartbeat.shard_name(index)),
                        signal="every tick of that shard", limit=tick_limit, queues=None)
            for index in range(settings.DELAYPAY_CLAIM_SHARDS)
        ]
    sent = [beats[name] for _, _, name, _ in PROCESS_SIGNALS[1:] if name in beats]
    newest = min(sent, key=lambda b: b.age_seconds) if sent else None
    rows.append(process_row("beat", queue="", beat=newest, limit=stale, queues=None,
                            signal="none of its own: the newest heartbeat it sent (worker, payouts, webhooks)"))
    return rows


def queue_depths() -> dict[str, int] | None:
    """Messages waiting in each Celery queue, or None when Redis does not answer (one
    quick PING first, as /metrics: the page never waits on a dead broker)."""
    try:
        broker.probe_client().ping()
        return broker.queue_lengths()
    except Exception:  # redis-py raises several families; the page goes on without them
        return None


@dataclass(frozen=True)
class RailCause:
    """Overdue payouts and expired leases that wait on a rail whose breaker is open."""

    rail: str
    overdue: int
    leases_expired: int


def lag_causes(rails: list[RailReading]) -> list[RailCause]:
    """Of the lag tiles' rows, those that wait on a rail whose breaker is open (or held
    open): the claim takes none of that rail's payouts until it half-opens."""
    open_rails = [r.rail for r in rails if (r.forced or r.breaker) == BreakerState.OPEN]
    stuck = stuck_payouts_by_rail(rails=open_rails)
    return [RailCause(rail, *stuck[rail]) for rail in open_rails if rail in stuck]


def dashboard_view(request):
    """Staff with view access to payments; admin_site.admin_view (urls.py) handles login."""
    if not request.user.has_perm("payments.view_scheduledpayment"):
        raise MissingPermission("payments.view_scheduledpayment")
    with transaction.atomic():  # one clock: now() is the transaction's start for every reading
        as_of = database_now()
        health = schedule_health()
        counts, counted_at = status_counts()
        outcomes = recent_outcomes(seconds=RECENT_SECONDS)
        lateness = recent_lateness(seconds=ON_TIME_SECONDS)
        review = review_queue_health()
        webhooks = webhook_health()
        due = payments_due_by_minute(minutes=60)
        rails = rail_states()
        causes = lag_causes(rails)
        beats = heartbeat_readings()
        history_outcomes, history_lateness = history_charts()
    queues = queue_depths()  # Redis, after the database's transaction
    live = live_status_counts(health=health, review=review)
    counts = {status: live.get(status, counts[status]) for status in PaymentStatus.values}
    since = as_of - timedelta(seconds=RECENT_SECONDS)
    finished = outcomes.executed + outcomes.failed_total
    overdue_alert = health.overdue > 0 and health.oldest_due_age_seconds > OVERDUE_ALERT_SECONDS
    context = {
        **admin.site.each_context(request),
        "title": "Dashboard",
        "as_of": as_of,
        "health": health,
        "oldest_due_age": age_text(health.oldest_due_age_seconds),
        "overdue_alert": overdue_alert,
        "overdue_alert_seconds": OVERDUE_ALERT_SECONDS,
        "review": review,
        "oldest_review_age": age_text(review.oldest_age_seconds),
        "counts": [(status, n, status in live) for status, n in counts.items()],
        "live_statuses": list(live),
        "total": sum(counts.values()),
        "counted_at": counted_at,
        "outcomes": outcomes,
        "failed_alert": finished > 0 and outcomes.failed_total / finished > FAILED_ALERT_RATIO,
        "failed_alert_percent": round(FAILED_ALERT_RATIO * 100),
        "failed_by_reason": [
            (reason, n, failed_reason_url(reason, since=since, until=as_of),
             human(failure_reason(reason)) if reason else "")
            for reason, n in sorted(outcomes.failed.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
        "links": {**tile_links(as_of=as_of, since=since),
                  "on_time": events_url(kind=PaymentEvent.Kind.EXECUTED,
                                        since=as_of - timedelta(seconds=ON_TIME_SECONDS), until=as_of)},
        "lateness": lateness,
        "lateness_p99": None if lateness.p99_seconds is None else seconds_text(lateness.p99_seconds),
        "lateness_p50": None if lateness.p50_seconds is None else seconds_text(lateness.p50_seconds),
        "lateness_alert": (lateness.p99_seconds or 0) > ON_TIME_ALERT_SECONDS,
        "on_time_minutes": ON_TIME_SECONDS // 60,
        "on_time_alert_ms": round(ON_TIME_ALERT_SECONDS * 1000),
        "webhooks": webhooks,
        "webhook_backlog": webhooks.events_waiting + webhooks.deliveries_pending,
        "webhook_oldest_age": age_text(webhooks.oldest_due_age_seconds),
        "webhook_alert": webhooks.oldest_due_age_seconds > WEBHOOK_ALERT_SECONDS,
        "webhook_alert_seconds": WEBHOOK_ALERT_SECONDS,
        "chart": due_chart(due),
        "outcome_chart": history_outcomes,
        "outcome_bucket_minutes": OUTCOME_BUCKET_SECONDS // 60,
        "lateness_chart": history_lateness,
        "readings_cache_seconds": READINGS_CACHE_SECONDS,
        "rails": [rail_tile(reading) for reading in rails],
        "processes": process_rows(beats=beats, queues=queues),
        "queues_unknown": queues is None,
        "overdue_causes": [c for c in causes if c.overdue],
        "lease_causes": [c for c in causes if c.leases_expired],
        "refresh_seconds": REFRESH_SECONDS,
    }
    return TemplateResponse(request, "admin/payments/dashboard.html", context)


def failed_reason_url(reason: str, *, since: datetime, until: datetime) -> str:
    """The failed events of the last hour with this failure_reason ("" : none recorded)."""
    if reason:
        return events_url(kind=PaymentEvent.Kind.FAILED, since=since, until=until, data__failure_reason=reason)
    return events_url(kind=PaymentEvent.Kind.FAILED, since=since, until=until, data__failure_reason__isnull="True")


def tile_links(*, as_of: datetime, since: datetime) -> dict[str, str]:
    """Each tile's changelist, filtered to exactly the rows the tile counts."""
    payments = "payments_scheduledpayment"
    return {
        # SCHEDULE_LAG: SCHEDULED, due, and not a retry waiting on its ladder.
        "overdue": changelist_url(payments, due="overdue", status__exact=PaymentStatus.SCHEDULED,
                                  next_attempt_at__isnull="True"),
        # LEASE_COUNTS: EXECUTING with a live lease, and with an expired one.
        "in_flight": changelist_url(payments, status__exact=PaymentStatus.EXECUTING, lease_until__gte=as_of),
        "leases_expired": changelist_url(payments, due="overdue", status__exact=PaymentStatus.EXECUTING),
        "needs_review": changelist_url(payments, status__exact=PaymentStatus.NEEDS_REVIEW),
        "executed": events_url(kind=PaymentEvent.Kind.EXECUTED, since=since, until=as_of),
        "failed": events_url(kind=PaymentEvent.Kind.FAILED, since=since, until=as_of),
        "webhook_deliveries": changelist_url("webhooks_delivery", status__exact=DeliveryStatus.PENDING),
        "webhook_events": changelist_url("webhooks_event", fanned_out_at__isnull="True"),
    }
