"""The burst with webhooks (``bench burst --webhooks``): what the outbox and the delivery
of one event per payment cost the drain, and how fast the events reach a receiver.

Two drains of the same burst in fresh databases: first with the outbox triggers disabled
(the engine as it was before webhooks: no outbox row in the executor's batch, nothing to
deliver), then with the triggers, one endpoint subscribed to every event type, the
Procfile's ``webhooks`` process and a receiver process on loopback
(devtools/webhook_receiver.py, verifying every signature). Delivery figures come from
the attempts the dispatcher recorded: per event, its first successful try's end.
"""

import time
from contextlib import contextmanager
from pathlib import Path

from django.db import connection

from devtools.webhook_receiver import ReceiverProcess
from webhooks.events import EVENT_TYPES
from webhooks.models import Endpoint

from .loader import bench_user
from .stats import per_second, summarize

# webhooks/migrations/0002_outbox_triggers.py
OUTBOX_TRIGGERS = {
    "payments_paymentevent": "webhooks_payment_outbox",
    "payments_recurringevent": "webhooks_recurring_outbox",
}

# The processes' webhook settings: the loopback receiver is allowed (production settings otherwise).
WEBHOOK_ENV = {"DELAYPAY_WEBHOOK_ALLOW_HOSTS": "127.0.0.1"}


def disable_outbox() -> None:
    """No outbox row per event: the baseline the webhooks run is compared with."""
    with connection.cursor() as cur:
        for table, trigger in OUTBOX_TRIGGERS.items():
            cur.execute(f"ALTER TABLE {table} DISABLE TRIGGER {trigger}")  # fixed names, no input


def subscribe(url: str) -> str:
    """One endpoint of the bench user (every payment's payer) for every event type;
    returns its secret. Written directly: the harness, not a client, sets the bench up."""
    endpoint = Endpoint.objects.create(owner=bench_user(), url=url, events=list(EVENT_TYPES), description="bench")
    return endpoint.secret


@contextmanager
def receiver(log_dir: Path):
    """A receiver process on a free loopback port, answering 200 at once."""
    log_dir.mkdir(parents=True, exist_ok=True)
    process = ReceiverProcess(log=log_dir / "webhooks-received.jsonl", secret_file=log_dir / "webhook-secrets")
    process.start()
    try:
        yield process
    finally:
        process.stop()


def backlog() -> int:
    """Events not fanned out plus deliveries pending (two index-served counts)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT (SELECT count(*) FROM webhooks_event WHERE fanned_out_at IS NULL)"
            " + (SELECT count(*) FROM webhooks_delivery WHERE status = 'pending')"
        )
        return cur.fetchone()[0]


def wait_delivered(*, timeout: float, poll: float = 0.5, on_poll=None) -> float | None:
    """Poll until the backlog is empty; the wall-clock seconds it took, or None on timeout."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        left = backlog()
        if on_poll is not None:
            on_poll(left)
        if left == 0:
            return time.monotonic() - started
        time.sleep(poll)
    return None


# Per delivered event: its creation, its first 2xx try's end, and for a payment.executed
# event the payment's executed_at (NULL for the other types).
DELIVERED_SQL = """
SELECT extract(epoch FROM e.created_at)::float8,
       extract(epoch FROM min(a.started_at + a.latency_ms * interval '1 millisecond'))::float8,
       extract(epoch FROM min(p.executed_at))::float8
  FROM webhooks_event e
  JOIN webhooks_delivery d ON d.event_id = e.id
  JOIN webhooks_deliveryattempt a ON a.delivery_id = d.id AND a.status_code BETWEEN 200 AND 299
  LEFT JOIN payments_scheduledpayment p ON p.id = e.payment_id AND e.type = 'payment.executed'
 GROUP BY e.id
"""


def delivery_figures(*, due_at: float, payments_done_at: float | None, received) -> dict:
    """Delivery rate, backlog drain, event lateness (first success - event created) and
    delivery after execution (first success - the payment's executed_at, for the
    payment.executed events: issue 35's "delivered within 500 ms of execution"), and
    whether every event reached the receiver verified."""
    with connection.cursor() as cur:
        cur.execute(DELIVERED_SQL)
        rows = cur.fetchall()
        cur.execute(
            "SELECT (SELECT count(*) FROM webhooks_event), (SELECT count(*) FROM webhooks_deliveryattempt),"
            " (SELECT count(*) FROM webhooks_delivery WHERE status = 'failed'),"
            " (SELECT coalesce(array_agg(id), '{}') FROM webhooks_event)"
        )
        events, attempts, failed, event_ids = cur.fetchone()
    not_received = sum(1 for pk in event_ids if f"evt_{pk}" not in received.delivered)
    out = {
        "events": events,
        "delivered": len(rows),
        "attempts": attempts,
        "failed": failed,
        "requests_received": received.requests,
        "unverified": received.unverified,
        "incomplete": received.incomplete,
        "not_received": not_received,
        "correct": bool(events) and len(rows) == events and not (failed or not_received or received.unverified),
    }
    if rows:
        done = sorted(finished for _, finished, _ in rows)
        first, last = done[0], done[-1]
        out.update(
            {
                "first_delivered_after_due_s": round(first - due_at, 3),
                "backlog_drain_s": round(last - due_at, 3),  # due instant -> last event delivered
                "after_payments_s": None if payments_done_at is None else round(last - payments_done_at, 3),
                "deliveries_per_s": round(len(rows) / (last - first), 1) if last > first else None,
                "event_lateness_s": summarize([finished - created for created, finished, _ in rows]),
                "after_execution_s": summarize(
                    [finished - executed for _, finished, executed in rows if executed is not None]
                ),
                "series": {"delivered_per_s": per_second(done, start=due_at, end=last)},
            }
        )
    return out
