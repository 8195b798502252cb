"""The API's Celery task. Its name is ``payments.tasks.*`` as it was when it lived in
payments/tasks.py: messages in flight and beat's schedule name it."""

from celery import shared_task

from . import tokens


@shared_task(name="payments.tasks.purge_expired_tokens", ignore_result=True)
def purge_expired_tokens() -> dict:
    """Delete the API tokens whose lifetime has passed (beat: hourly)."""
    return {"deleted": tokens.api_tokens_purge_expired()}
