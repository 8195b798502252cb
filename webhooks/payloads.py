"""What a webhook says: the event's envelope around the payment (or recurring payment)
as the API shows it, rendered from the snapshot the outbox trigger took in the
transaction of the change, through the API's own serializers (payments/representation.py). A terminal payment event
(executed, failed, cancelled) has no snapshot of its own: the dispatcher's claim reads
the payment row, frozen since that change, in its place (webhooks/sql.py).

The snapshot is ``to_jsonb`` of the row: every column under its database name, in JSON
types. Each value goes through its model field's ``to_python`` into an unsaved instance,
which the serializer renders as GET would have at that moment. The payment's
``attempts`` are left out: they are not part of the change (GET the payment for them).
"""

import json

from django.db import models

from payments.fields import format_utc
from payments.models import RecurringPayment, ScheduledPayment
from payments.representation import PaymentSerializer, RecurringPaymentSerializer

from .events import TERMINAL_STATUS_TO_TYPE

TYPE_TO_TERMINAL_STATUS = {type_: status for status, type_ in TERMINAL_STATUS_TO_TYPE.items()}


class WebhookPaymentSerializer(PaymentSerializer):
    class Meta(PaymentSerializer.Meta):
        fields = [f for f in PaymentSerializer.Meta.fields if f != "attempts"]
        read_only_fields = fields


def instance_from_snapshot(model: type[models.Model], snapshot: dict) -> models.Model:
    """An unsaved ``model`` instance holding the snapshot's values (never saved)."""
    instance = model()
    for field in model._meta.concrete_fields:
        if field.column in snapshot:
            setattr(instance, field.attname, field.to_python(snapshot[field.column]))
    return instance


def render_data(*, payment_id: str | None, snapshot: dict | None, type: str = "") -> dict:
    """``data``: the payment, or the recurring payment, of the snapshot. None: a terminal
    payment event whose payment has been archived since (a resend months later): its id
    and the final status its type says, no more."""
    if snapshot is None:
        return {"id": payment_id, "status": TYPE_TO_TERMINAL_STATUS[type]}
    if payment_id is not None:
        return WebhookPaymentSerializer(instance_from_snapshot(ScheduledPayment, snapshot)).data
    return RecurringPaymentSerializer(instance_from_snapshot(RecurringPayment, snapshot)).data


def public_event_id(event_id: int) -> str:
    return f"evt_{event_id}"


def render_body(*, event_id: int, type: str, created_at, payment_id: str | None, snapshot: dict | None) -> str:
    """The JSON body, exactly the bytes that are signed and sent (compact, UTF-8)."""
    payload = {
        "id": public_event_id(event_id),
        "type": type,
        "created_at": format_utc(created_at),
        "data": render_data(payment_id=payment_id, snapshot=snapshot, type=type),
    }
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
