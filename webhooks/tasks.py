"""Thin Celery tasks of the webhooks app."""

from celery import shared_task
from celery.worker import state
from django.conf import settings

from . import dispatcher


def worker_stopping() -> bool:
    """Whether this worker was told to shut down (Celery's warm or cold shutdown). Compared
    by identity as Celery does: a warm shutdown sets ``should_stop`` to exit code 0."""
    return any(flag is not None and flag is not False for flag in (state.should_stop, state.should_terminate))


@shared_task(name="webhooks.tasks.dispatch", ignore_result=True, acks_late=False)
def dispatch() -> dict:
    """Beat's tick on the "webhooks" queue: fan out and deliver while work remains, then
    watch for new work until the next tick is due (beat's period, PROMOTER_TICK_SECONDS),
    so that an event is delivered within a poll of its commit, not at the next tick
    (docs/decisions/0018-prompt-webhooks.md). Not acknowledged late: a lost tick is
    replaced by the next one, and a dispatcher that dies mid-delivery leaves leases that
    expire (at least once)."""
    result = dispatcher.dispatch(watch_seconds=settings.PROMOTER_TICK_SECONDS, stopping=worker_stopping)
    return {
        "fanned_out": result.fanned_out,
        "claimed": result.claimed,
        "succeeded": result.succeeded,
        "retrying": result.retrying,
        "failed": result.failed,
    }
