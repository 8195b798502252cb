"""Webhooks: endpoints, the outbox of events, deliveries and their attempts.

The outbox (``Event``) is filled by database triggers on the payments' audit tables
(migration 0002): an event row is written in the transaction of the change that causes
it, and only there. The dispatcher (webhooks/dispatcher.py) fans events out to
``Delivery`` rows and delivers them over HTTP, outside any transaction.
"""

import base64
import os

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models.functions import Now

from common.ids import new_id
from webhooks.events import EVENT_TYPES

# The Standard Webhooks prefix of a secret, not a secret (bandit B105).
SECRET_PREFIX = "whsec_"  # nosec B105


def new_endpoint_id() -> str:
    return new_id("whe")


def new_secret() -> str:
    """``whsec_`` + base64 of 24 random bytes: the Standard Webhooks secret format."""
    return SECRET_PREFIX + base64.b64encode(os.urandom(24)).decode("ascii")


class Endpoint(models.Model):
    """A URL its owner wants events POSTed to, for the event types it lists."""

    id = models.CharField(primary_key=True, max_length=40, default=new_endpoint_id, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="webhook_endpoints", db_index=False
    )
    url = models.CharField(max_length=2000)
    # Listed explicitly (no "*"): a new event type reaches nobody who did not ask for it.
    events = ArrayField(models.CharField(max_length=40))
    description = models.CharField(max_length=200, blank=True, default="")
    enabled = models.BooleanField(default=True)
    secret = models.CharField(max_length=100, default=new_secret)
    # After a rotation the old secret keeps signing alongside the new one until it expires.
    previous_secret = models.CharField(max_length=100, blank=True, default="")
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    # Why the dispatcher disabled it (failing for DELAYPAY_WEBHOOK_DISABLE_AFTER_DAYS); blank otherwise.
    disabled_reason = models.CharField(max_length=200, blank=True, default="")
    # Start of the current run of failed attempts; NULL after any success.
    failing_since = models.DateTimeField(null=True, blank=True)
    version = models.IntegerField(default=1)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.CheckConstraint(condition=models.Q(events__len__gt=0), name="webhooks_endpoint_events_nonempty"),
            models.CheckConstraint(
                condition=models.Q(events__contained_by=list(EVENT_TYPES)), name="webhooks_endpoint_events_known"
            ),
        ]
        indexes = [
            # The API's list and the fan-out's "enabled endpoints of this owner".
            models.Index(fields=["owner", "created_at"], name="webhooks_endpoint_owner_idx"),
        ]

    def __str__(self) -> str:
        return self.id


class Event(models.Model):
    """The outbox: one row per webhook-worthy change, written by the audit tables' triggers."""

    id = models.BigAutoField(primary_key=True)
    type = models.CharField(max_length=40)
    # No foreign key constraint: the trigger copies payer_id from the payment row.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+", db_index=False
    )
    # Exactly one is set; NULL rather than "" so that the partial indexes skip the other kind.
    payment_id = models.CharField(max_length=40, null=True, blank=True)  # noqa: DJ001
    recurring_id = models.CharField(max_length=40, null=True, blank=True)  # noqa: DJ001
    # The payment's (or series') version in the transaction that wrote the event: receivers
    # order by it, since delivery order is not promised.
    version = models.IntegerField()
    # The payment (or series) row as it was in that transaction (to_jsonb of the row). NULL
    # for a terminal payment event (payment.executed, failed, cancelled): the row is frozen
    # from then on, so the dispatcher reads the row itself (migration 0003).
    snapshot = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    fanned_out_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(condition=models.Q(type__in=EVENT_TYPES), name="webhooks_event_type_valid"),
            models.CheckConstraint(
                condition=models.Q(payment_id__isnull=False, recurring_id__isnull=True)
                | models.Q(payment_id__isnull=True, recurring_id__isnull=False),
                name="webhooks_event_has_subject",
            ),
        ]
        indexes = [
            # The fan-out's sweep and the backlog gauge: only events not yet fanned out.
            models.Index(fields=["id"], condition=models.Q(fanned_out_at__isnull=True), name="webhooks_event_todo_idx"),
            # Reconciliation: a terminal payment's events.
            models.Index(
                fields=["payment_id", "type"],
                condition=models.Q(payment_id__isnull=False),
                name="webhooks_event_pay_idx",
            ),
        ]

    def __str__(self) -> str:
        return self.public_id

    @property
    def public_id(self) -> str:
        return f"evt_{self.id}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class Delivery(models.Model):
    """One event to one endpoint: tried on the retry ladder until a 2xx or the ladder's end."""

    id = models.BigAutoField(primary_key=True)
    event = models.ForeignKey(Event, on_delete=models.PROTECT, related_name="deliveries", db_index=False)
    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="deliveries", db_index=False)
    status = models.CharField(max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    # Tries in the current run of the ladder (a resend starts a new run at 0).
    attempts = models.IntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_default=Now())
    # Claimed by a dispatcher until then; an expired lease is taken again (at least once).
    lease_until = models.DateTimeField(null=True, blank=True)
    last_status_code = models.IntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        ordering = ["id"]
        verbose_name_plural = "deliveries"
        permissions = [("resend_delivery", "Can resend a webhook delivery")]
        constraints = [
            models.UniqueConstraint(fields=["event", "endpoint"], name="webhooks_delivery_unique"),
            models.CheckConstraint(
                condition=models.Q(status__in=DeliveryStatus.values), name="webhooks_delivery_status_valid"
            ),
            models.CheckConstraint(condition=models.Q(attempts__gte=0), name="webhooks_delivery_attempts_nonneg"),
        ]
        indexes = [
            # The dispatcher's sweep and the oldest-undelivered gauge: pending rows only.
            models.Index(
                fields=["next_attempt_at"],
                condition=models.Q(status="pending"),
                name="webhooks_delivery_due_idx",
            ),
            # An endpoint's deliveries, newest first (API and admin).
            models.Index(fields=["endpoint", "id"], name="webhooks_delivery_endpoint_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.event_id}->{self.endpoint_id} {self.status}"


class DeliveryAttempt(models.Model):
    """One HTTP try of a delivery: what the receiver answered, and how fast."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_rows", db_index=False)
    attempt = models.IntegerField()
    started_at = models.DateTimeField()
    latency_ms = models.IntegerField()
    status_code = models.IntegerField(null=True, blank=True)
    # The first RESPONSE_BODY_KEEP bytes of the answer, decoded leniently.
    response_body = models.TextField(blank=True, default="")
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["delivery", "id"]
        indexes = [models.Index(fields=["delivery", "id"], name="webhooks_attempt_delivery_idx")]

    def __str__(self) -> str:
        return f"{self.delivery_id}#{self.attempt} {self.status_code or self.error[:40]}"
