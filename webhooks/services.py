"""Webhook writes of the dispatcher's side: resending deliveries. Endpoint writes (create,
change, rotate, delete) are in webhooks/endpoints.py; the dispatcher's own writes are its
set-based statements (webhooks/dispatcher.py).

Callers authorize: the API lets an endpoint's owner resend its deliveries, the admin
staff with the resend permission (webhooks/admin.py).
"""

from django.db import connection, transaction
from django.db.models.functions import Now

from . import sql
from .exceptions import DeliveryNotFound
from .models import Delivery, DeliveryStatus


def delivery_resend(*, delivery_id: int, actor) -> Delivery:
    """Deliver again, as soon as a dispatcher runs: a succeeded or failed delivery goes back
    to pending with a fresh run of the retry ladder (same event, same ``webhook-id``, so
    the receiver deduplicates); a pending one is made due now (a try in flight is then
    recorded but no longer decides: its lease no longer matches). Its attempts so far are
    kept. A delivery of a disabled endpoint fails again at once until the endpoint is
    enabled. ``actor`` is for the caller's audit; the caller authorizes."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(sql.RESEND, {"id": delivery_id})
        if cur.fetchone() is None:
            raise DeliveryNotFound()
    return Delivery.objects.get(pk=delivery_id)


def deliveries_recover_disabled(*, endpoint_id: str) -> int:
    """Put back to pending (a fresh ladder, due now) the deliveries that failed because their
    endpoint was disabled: for its re-enabling. Returns how many."""
    return Delivery.objects.filter(
        endpoint_id=endpoint_id, status=DeliveryStatus.FAILED, last_error="endpoint disabled"
    ).update(status=DeliveryStatus.PENDING, attempts=0, next_attempt_at=Now(), lease_until=None, updated_at=Now())
