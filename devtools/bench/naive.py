"""Driver side of the naive baseline: publish one ETA task per payment, and know when
the worker has taken them all into its memory."""

import time
from collections.abc import Callable, Sequence
from datetime import datetime

import redis

from delaypay.celery import app


def use_broker(url: str) -> None:
    """Point this process's Celery app at ``url`` before it opens any connection."""
    app.conf.broker_url = url


def enqueue(
    payment_ids: Sequence[str],
    *,
    etas: Sequence[datetime],
    broker_url: str,
    stop: Callable[[], str | None] | None = None,
    check_every: int = 5_000,
) -> tuple[float, int]:
    """``apply_async(eta=...)`` once per payment over one producer: (seconds, tasks sent).
    ``stop()`` is asked every ``check_every`` tasks; a truthy answer ends it early."""
    from .naive_tasks import naive_pay_task

    if app.conf.broker_url != broker_url:
        raise RuntimeError(f"the Celery app publishes to {app.conf.broker_url}, not {broker_url}: call use_broker")
    started = time.monotonic()
    sent = 0
    with app.producer_or_acquire() as producer:
        for payment_id, eta in zip(payment_ids, etas, strict=True):
            if stop is not None and sent % check_every == 0 and sent and stop():
                break
            naive_pay_task.apply_async(args=[payment_id], eta=eta, producer=producer)
            sent += 1
    return time.monotonic() - started, sent


def wait_received(redis_url: str, queue: str, *, timeout: float) -> bool:
    """Wait until the queue is empty: every ETA message is in a worker's memory (and in
    Redis's unacknowledged set). False on timeout."""
    client = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout
    while client.llen(queue):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True
