"""Thin Celery tasks of the webhooks app."""

from celery import shared_task

from . import dispatcher


@shared_task(name="webhooks.tasks.dispatch", ignore_result=True, acks_late=False)
def dispatch() -> dict:
    """Beat's tick on the "webhooks" queue: fan out and deliver for a few seconds. Not
    acknowledged late: a lost tick is replaced by the next one, and a dispatcher that dies
    mid-delivery leaves leases that expire (at least once)."""
    result = dispatcher.dispatch()
    return {
        "fanned_out": result.fanned_out,
        "claimed": result.claimed,
        "succeeded": result.succeeded,
        "retrying": result.retrying,
        "failed": result.failed,
    }
