"""The dispatcher: fan events out to deliveries, deliver what is due, record every try.

One ``dispatch_once`` is three short transactions and HTTP between them, never inside:

1. **Fan-out** (one statement): events not fanned out yet, ``SKIP LOCKED``, become one
   delivery per enabled endpoint of their owner subscribed to their type.
2. **Claim** (one statement): due pending deliveries, ``SKIP LOCKED``, leased (their
   ``next_attempt_at`` moves to the lease's end: a dispatcher that dies mid-way leaves
   them to fall due again by themselves; at least once).
3. **Deliver** outside any transaction: POSTs in a few threads (no database in them),
   through a module-level httpx Client (pooled connections), to the address
   webhooks/safety.py checked after resolving the name, with the Host header and the TLS
   server name of the URL's host (the canonical form that was resolved); no redirects;
   at most RESPONSE_READ_LIMIT bytes of the answer.
4. **Record** (one transaction, set-based): an attempt row per try; a 2xx succeeds, any
   other answer or error waits on the ladder (DELAYPAY_WEBHOOK_RETRY_DELAYS, +-20 %
   jitter) or, past its end, fails; an endpoint failing for
   DELAYPAY_WEBHOOK_DISABLE_AFTER_DAYS without a success is disabled. Every write is
   fenced by the lease the delivery was claimed with.

Delivery order is not promised (retries, threads, several dispatchers); every event
carries the payment's ``version`` and the same ``webhook-id`` on every try.
"""

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
from django.conf import settings
from django.db import connection, transaction

from common.backoff import WEBHOOK_RETRY

from . import metrics, payloads, safety, signing, sql

logger = logging.getLogger(__name__)

# Bytes of a receiver's answer read at most (then the connection is dropped) and kept.
RESPONSE_READ_LIMIT = 64 * 1024
RESPONSE_KEEP = 1024
# A try is not started when the lease would run out before its timeout could.
LEASE_MARGIN_SECONDS = 5.0
USER_AGENT = "delaypay-webhooks/1"

_client: httpx.Client | None = None
_client_lock = threading.Lock()


def http_client() -> httpx.Client:
    """The process's one httpx Client: pooled connections, no redirects, no proxies from the
    environment (the connection must go to the address safety checked)."""
    global _client
    if _client is None:
        with _client_lock:
            if _client is None:
                _client = httpx.Client(
                    follow_redirects=False,
                    trust_env=False,
                    limits=httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=30),
                    headers={"User-Agent": USER_AGENT},
                )
    return _client


def close_http_client() -> None:
    """Close the pooled connections (the next delivery opens a new client): a test whose
    receiver is gone, or a process shutting down."""
    global _client
    with _client_lock:
        if _client is not None:
            _client.close()
            _client = None


@dataclass(frozen=True)
class Claimed:
    """A claimed delivery with what its request needs."""

    id: int
    attempts: int
    lease_until: datetime
    event_id: int
    type: str
    created_at: datetime
    snapshot: dict | None  # None: a terminal event whose payment was archived (payloads.render_data)
    payment_id: str | None
    recurring_id: str | None
    endpoint_id: str
    url: str
    enabled: bool
    secrets: tuple[str, ...]


@dataclass
class Try:
    """One HTTP try's outcome."""

    delivery: Claimed
    started_at: datetime
    latency_ms: int
    status_code: int | None = None
    body: str = ""
    error: str = ""

    @property
    def succeeded(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


@dataclass
class DispatchResult:
    fanned_out: int = 0  # events fanned out
    deliveries_created: int = 0
    claimed: int = 0
    succeeded: int = 0
    retrying: int = 0
    failed: int = 0  # the ladder is spent, or the endpoint is disabled
    released: int = 0  # claimed but not tried (lease time ran out): due again at once
    disabled_endpoints: list[str] = field(default_factory=list)

    @property
    def busy(self) -> bool:
        """Whether a batch was full enough that more work may be waiting."""
        return self.fanned_out > 0 or self.claimed > 0


# --- 1. fan-out ------------------------------------------------------------------------


def fan_out(*, batch: int | None = None) -> tuple[int, int]:
    """Fan out up to ``batch`` events; returns (events, deliveries created)."""
    batch = batch or settings.DELAYPAY_WEBHOOK_FANOUT_BATCH
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(sql.FAN_OUT, {"batch": batch})
        events, deliveries = cur.fetchone()
    return events, deliveries


# --- 2. claim --------------------------------------------------------------------------


def claim_deliveries(*, batch: int | None = None, lease_seconds: float | None = None) -> list[Claimed]:
    """Lease up to ``batch`` due deliveries (committed before any HTTP)."""
    params = {
        "batch": batch or settings.DELAYPAY_WEBHOOK_DELIVERY_BATCH,
        "lease": lease_seconds or settings.DELAYPAY_WEBHOOK_LEASE_SECONDS,
    }
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(sql.CLAIM_DELIVERIES, params)
        rows = cur.fetchall()
    claimed = []
    for (id_, attempts, lease_until, event_id, type_, created_at, snapshot, payment_id, recurring_id,
         endpoint_id, url, enabled, secret, previous_secret, previous_active) in rows:  # fmt: skip
        secrets = (secret, previous_secret) if previous_active and previous_secret else (secret,)
        claimed.append(
            Claimed(
                id=id_,
                attempts=attempts,
                lease_until=lease_until,
                event_id=event_id,
                type=type_,
                created_at=created_at,
                # Django reads jsonb as text (JSONField decodes it): so does a raw cursor.
                snapshot=json.loads(snapshot) if isinstance(snapshot, str) else snapshot,
                payment_id=payment_id,
                recurring_id=recurring_id,
                endpoint_id=endpoint_id,
                url=url,
                enabled=enabled,
                secrets=secrets,
            )
        )
    return claimed


# --- 3. deliver ------------------------------------------------------------------------


def _host_header(host: str, port: int | None) -> str:
    host = f"[{host}]" if ":" in host else host
    return host if port is None else f"{host}:{port}"


def post(url: str, *, body: str, headers: dict[str, str], timeout: float) -> tuple[int, str]:
    """POST ``body`` to ``url`` at its checked address; returns (status code, the first
    RESPONSE_KEEP bytes of the answer). Raises ``safety.DeliveryRefused`` before any
    socket is opened when the address is not allowed, httpx errors on failures."""
    target = safety.resolve_target(url)
    parsed = httpx.URL(url)
    extensions = {"sni_hostname": target.host} if parsed.scheme == "https" else {}
    request_headers = {
        **headers,
        "Host": _host_header(target.host, parsed.port),  # the name that was resolved and checked
        "Content-Type": "application/json",
        "Accept-Encoding": "identity",  # the body is capped as sent: no decompression bomb
    }
    deadline = time.monotonic() + timeout
    with http_client().stream(
        "POST",
        parsed.copy_with(host=target.address),
        content=body.encode(),
        headers=request_headers,
        timeout=timeout,
        extensions=extensions,
    ) as response:
        received = bytearray()
        for chunk in response.iter_raw():
            received += chunk
            if len(received) >= RESPONSE_READ_LIMIT:
                break
            if time.monotonic() > deadline:  # a receiver dripping its answer byte by byte
                raise httpx.ReadTimeout("the answer took longer than the timeout")
        return response.status_code, bytes(received[:RESPONSE_KEEP]).decode("utf-8", "replace")


def _error_text(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:1000]


def deliver(claimed: Claimed, *, body: str, timeout: float) -> Try:
    """One try of ``claimed``: sign now, POST, time it. Never raises."""
    started_at = datetime.now(UTC)
    start = time.perf_counter()
    outcome = Try(delivery=claimed, started_at=started_at, latency_ms=0)
    try:
        headers = signing.signed_headers(
            msg_id=payloads.public_event_id(claimed.event_id), body=body, secrets=list(claimed.secrets)
        )
        outcome.status_code, outcome.body = post(claimed.url, body=body, headers=headers, timeout=timeout)
        if not outcome.succeeded:
            outcome.error = f"HTTP {outcome.status_code}"
    except safety.DeliveryRefused as exc:
        outcome.error = f"refused: {exc}"[:1000]
    except httpx.HTTPError as exc:
        outcome.error = _error_text(exc)
    except Exception as exc:  # a bug must cost one try, never the batch's record
        logger.exception("webhook delivery raised", extra={"delivery_id": claimed.id})
        outcome.error = _error_text(exc)
    outcome.latency_ms = round((time.perf_counter() - start) * 1000)
    return outcome


def _render_bodies(claimed: list[Claimed]) -> dict[int, str]:
    """Each event's body once, however many endpoints receive it."""
    bodies: dict[int, str] = {}
    for item in claimed:
        if item.event_id not in bodies:
            bodies[item.event_id] = payloads.render_body(
                event_id=item.event_id,
                type=item.type,
                created_at=item.created_at,
                payment_id=item.payment_id,
                snapshot=item.snapshot,
            )
    return bodies


def deliver_all(claimed: list[Claimed], *, lease_seconds: float) -> tuple[list[Try], list[Claimed]]:
    """Try every claimed delivery in a few threads; returns (tries, those not tried because
    their lease would have run out first)."""
    timeout = settings.DELAYPAY_WEBHOOK_TIMEOUT_SECONDS
    bodies = _render_bodies(claimed)
    start = time.monotonic()

    def one(item: Claimed) -> Try | Claimed:
        if time.monotonic() - start + timeout + LEASE_MARGIN_SECONDS > lease_seconds:
            return item
        return deliver(item, body=bodies[item.event_id], timeout=timeout)

    threads = max(1, min(settings.DELAYPAY_WEBHOOK_DELIVERY_THREADS, len(claimed)))
    if threads == 1:
        results = [one(item) for item in claimed]
    else:
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="webhook") as pool:
            results = list(pool.map(one, claimed))
    tries = [r for r in results if isinstance(r, Try)]
    skipped = [r for r in results if isinstance(r, Claimed)]
    return tries, skipped


# --- 4. record -------------------------------------------------------------------------


def next_delay(attempt: int) -> float | None:
    """Seconds to wait after try number ``attempt`` failed (jittered), None when the ladder
    is spent (common/backoff.py's WEBHOOK_RETRY)."""
    return WEBHOOK_RETRY.delay(attempt)


def _arrays(rows: list[tuple], names: list[str]) -> dict[str, list]:
    return {name: [row[i] for row in rows] for i, name in enumerate(names)}


def record(tries: list[Try], *, disabled: list[Claimed], released: list[Claimed], result: DispatchResult) -> None:
    """Write the outcome of a batch in one transaction; endpoints are locked before
    deliveries (in id order), as endpoint_delete does, so the two never deadlock."""
    if not (tries or disabled or released):
        return
    endpoint_ids = sorted({t.delivery.endpoint_id for t in tries})
    delivery_ids = sorted({t.delivery.id for t in tries} | {c.id for c in disabled} | {c.id for c in released})
    outcomes = []
    for t in tries:
        attempt = t.delivery.attempts + 1
        if t.succeeded:
            status, delay = "succeeded", None
        else:
            delay = next_delay(attempt)
            status = "pending" if delay is not None else "failed"
        outcomes.append((t, attempt, status, delay))
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT id FROM webhooks_endpoint WHERE id = ANY(%s) ORDER BY id FOR NO KEY UPDATE", [endpoint_ids])
        cur.execute("SELECT id FROM webhooks_delivery WHERE id = ANY(%s) ORDER BY id FOR NO KEY UPDATE", [delivery_ids])
        existing = {row[0] for row in cur.fetchall()}  # an endpoint deleted meanwhile took its deliveries
        kept = [o for o in outcomes if o[0].delivery.id in existing]
        if kept:
            cur.execute(
                sql.INSERT_ATTEMPTS,
                _arrays(
                    [
                        (t.delivery.id, a, t.started_at, t.latency_ms, t.status_code, t.body, t.error)
                        for t, a, _, _ in kept
                    ],
                    ["ids", "attempts", "started_ats", "latencies", "status_codes", "bodies", "errors"],
                ),
            )
            cur.execute(
                sql.RECORD_OUTCOMES,
                _arrays(
                    [(t.delivery.id, t.delivery.lease_until, s, a, d, t.status_code, t.error) for t, a, s, d in kept],
                    ["ids", "leases", "statuses", "attempts", "delays", "status_codes", "errors"],
                ),
            )
        if disabled:
            cur.execute(sql.FAIL_FOR_DISABLED, _arrays([(c.id, c.lease_until) for c in disabled], ["ids", "leases"]))
        if released:
            cur.execute(sql.RELEASE, _arrays([(c.id, c.lease_until) for c in released], ["ids", "leases"]))
        succeeded_endpoints = sorted({t.delivery.endpoint_id for t, _, s, _ in kept if s == "succeeded"})
        failing_endpoints = sorted({t.delivery.endpoint_id for t, _, s, _ in kept} - set(succeeded_endpoints))
        if succeeded_endpoints:
            cur.execute(sql.ENDPOINTS_SUCCEEDED, {"ids": succeeded_endpoints})
        if failing_endpoints:
            cur.execute(
                sql.ENDPOINTS_FAILED,
                {"ids": failing_endpoints, "disable_after": settings.DELAYPAY_WEBHOOK_DISABLE_AFTER_DAYS * 86400},
            )
            result.disabled_endpoints = sorted(row[0] for row in cur.fetchall() if row[1])
    for _t, _a, status, _d in kept:
        if status == "succeeded":
            result.succeeded += 1
        elif status == "failed":
            result.failed += 1
        else:
            result.retrying += 1
    result.failed += len(disabled)
    result.released += len(released)
    metrics.record_tries(kept)


# --- the whole -------------------------------------------------------------------------


def dispatch_once() -> DispatchResult:
    """Fan out one batch of events and deliver one batch of due deliveries."""
    result = DispatchResult()
    result.fanned_out, result.deliveries_created = fan_out()
    lease_seconds = settings.DELAYPAY_WEBHOOK_LEASE_SECONDS
    claimed = claim_deliveries(lease_seconds=lease_seconds)
    result.claimed = len(claimed)
    if claimed:
        disabled = [c for c in claimed if not c.enabled]
        tries, released = deliver_all([c for c in claimed if c.enabled], lease_seconds=lease_seconds)
        record(tries, disabled=disabled, released=released, result=result)
        for endpoint_id in result.disabled_endpoints:
            logger.warning("webhook endpoint disabled: failing too long", extra={"endpoint_id": endpoint_id})
    return result


def work_waiting() -> bool:
    """Whether an event waits to be fanned out or a delivery is due: one read, no lock."""
    with connection.cursor() as cur:
        cur.execute(sql.WORK_WAITING)
        return cur.fetchone()[0]


def _wait_for_work(*, until: float, poll: float, stopping: Callable[[], bool]) -> bool:
    """Ask ``work_waiting`` every ``poll`` seconds: True as soon as it says yes, False once
    the monotonic clock reaches ``until`` or ``stopping()`` says so."""
    while not stopping():
        left = until - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(poll, left))
        if work_waiting():
            return True
    return False


def dispatch(
    *, budget_seconds: float | None = None, watch_seconds: float = 0.0, stopping: Callable[[], bool] = lambda: False
) -> DispatchResult:
    """``dispatch_once`` again while batches come back busy, for at most ``budget_seconds``
    (the task's body). Then, until ``watch_seconds`` after the start, look for new work every
    DELAYPAY_WEBHOOK_POLL_SECONDS and dispatch it as it appears: the task watches from one
    beat tick to the next, so an event waits for a poll, not for the next tick
    (docs/decisions/0018-prompt-webhooks.md). Once it has watched, it ends at the watch's
    end even when busy: the next tick's dispatch goes on, so ticks do not pile up into
    several dispatches POSTing at once. A poll of 0 turns the watch off; ``stopping()``
    ends it early (the worker is shutting down). Concurrent calls take disjoint rows."""
    budget = settings.DELAYPAY_WEBHOOK_BUDGET_SECONDS if budget_seconds is None else budget_seconds
    poll = settings.DELAYPAY_WEBHOOK_POLL_SECONDS
    start = time.monotonic()
    watch_until = start + (watch_seconds if poll > 0 else 0.0)
    deadline = start + budget
    total = DispatchResult()
    while True:
        once = dispatch_once()
        for name in ("fanned_out", "deliveries_created", "claimed", "succeeded", "retrying", "failed", "released"):
            setattr(total, name, getattr(total, name) + getattr(once, name))
        total.disabled_endpoints += once.disabled_endpoints
        if once.busy:
            if time.monotonic() >= deadline:
                return total
            continue
        if not _wait_for_work(until=watch_until, poll=poll, stopping=stopping):
            return total
        deadline = watch_until
