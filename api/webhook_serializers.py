"""Webhook endpoints and deliveries over the REST API: request shapes and renderings.
No business rules here (webhooks/endpoints.py has them); the secret is rendered only by
the create and the rotation, never by a read."""

from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema_field
from rest_framework import serializers

from api.serializers import AtLeastOneFieldSerializer, PageQuerySerializer, StrictSerializer
from payments.fields import DisplayTextField, StrictDateTimeField, format_utc
from payments.representation import RecurringPaymentSerializer
from webhooks.events import EVENT_TYPES
from webhooks.models import Delivery, DeliveryAttempt, DeliveryStatus, Endpoint
from webhooks.payloads import WebhookPaymentSerializer

EVENT_TYPE_CHOICES = [(t, t) for t in EVENT_TYPES]
MAX_URL_LENGTH = Endpoint._meta.get_field("url").max_length
MAX_DESCRIPTION_LENGTH = Endpoint._meta.get_field("description").max_length


class StrictBooleanField(serializers.BooleanField):
    """A JSON true or false only: DRF's BooleanField also takes "yes", 1 and "off"."""

    default_error_messages = {"invalid": "Must be a JSON boolean (true or false)."}

    def to_internal_value(self, data):
        if type(data) is not bool:
            self.fail("invalid")
        return data


def url_field(**kwargs):
    return DisplayTextField(
        max_length=MAX_URL_LENGTH,
        help_text="Where events are POSTed: an https:// URL on a public address (plain http and private "
        "addresses only in development or for the hosts in DELAYPAY_WEBHOOK_ALLOW_HOSTS). Redirects are "
        "not followed.",
        **kwargs,
    )


class EventTypesField(serializers.ListField):
    """A list of event types whose errors are a flat list of sentences (the Error shape's
    ``fields`` holds strings per field), each naming the item: DRF's ListField nests
    them in a dict keyed by index."""

    def to_internal_value(self, data):
        try:
            return super().to_internal_value(data)
        except serializers.ValidationError as exc:
            if not isinstance(exc.detail, dict):
                raise
            raise serializers.ValidationError(
                [f"Item {index}: {message}" for index, messages in sorted(exc.detail.items()) for message in messages]
            ) from None


def events_field(**kwargs):
    return EventTypesField(
        child=serializers.ChoiceField(choices=EVENT_TYPE_CHOICES),
        min_length=1,
        max_length=len(EVENT_TYPES) * 2,
        help_text="The event types to receive, at least one (no wildcard: a new type reaches nobody who did "
        "not ask for it). Repeats count once. An event is written only for the changes made while an enabled "
        "endpoint of yours lists its type: a change made before, or while the type was not listed, is never sent.",
        **kwargs,
    )


def description_field(**kwargs):
    return DisplayTextField(
        max_length=MAX_DESCRIPTION_LENGTH, allow_blank=True, help_text="Yours, for people.", **kwargs
    )


class WebhookEndpointCreateSerializer(StrictSerializer):
    url = url_field()
    events = events_field()
    description = description_field(required=False)


class WebhookEndpointUpdateSerializer(AtLeastOneFieldSerializer):
    url = url_field(required=False)
    events = events_field(required=False)
    enabled = StrictBooleanField(
        required=False,
        help_text="false stops deliveries: those still pending end failed (`endpoint disabled`; resend brings "
        "one back). true re-enables an endpoint, also one the dispatcher disabled, and clears disabled_reason and "
        "failing_since, and the deliveries that failed because it was disabled go out again.",
    )
    description = description_field(required=False)


class WebhookEndpointPageQuerySerializer(PageQuerySerializer):
    enabled = serializers.BooleanField(required=False, help_text="Only enabled (true) or disabled (false) endpoints.")


class WebhookEndpointSerializer(serializers.ModelSerializer):
    endpoint_id = serializers.CharField(source="id")
    events = serializers.ListField(child=serializers.ChoiceField(choices=EVENT_TYPE_CHOICES))
    owner = serializers.CharField(source="owner.username", help_text="The user whose events it receives.")
    disabled_reason = serializers.SerializerMethodField()
    failing_since = StrictDateTimeField(
        allow_null=True,
        help_text="Start of the current run of failed attempts; null after any success. An endpoint failing "
        "for DELAYPAY_WEBHOOK_DISABLE_AFTER_DAYS is disabled.",
    )
    previous_secret_expires_at = serializers.SerializerMethodField()
    version = serializers.IntegerField(help_text="Bumped by every change; also the ETag. Send it in If-Match.")
    created_at = StrictDateTimeField()
    updated_at = StrictDateTimeField()

    class Meta:
        model = Endpoint
        fields = [
            "endpoint_id",
            "url",
            "events",
            "description",
            "enabled",
            "disabled_reason",
            "failing_since",
            "previous_secret_expires_at",
            "owner",
            "version",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    @extend_schema_field(
        serializers.CharField(allow_null=True, help_text="Why the dispatcher disabled it; null otherwise.")
    )
    def get_disabled_reason(self, obj) -> str | None:
        return obj.disabled_reason or None

    @extend_schema_field(
        StrictDateTimeField(
            allow_null=True,
            help_text="After a rotation: until when the previous secret still signs beside the new one "
            "(a second signature in webhook-signature); null otherwise.",
        )
    )
    def get_previous_secret_expires_at(self, obj) -> str | None:
        return format_utc(obj.previous_secret_expires_at) if obj.previous_secret else None


class WebhookEndpointWithSecretSerializer(WebhookEndpointSerializer):
    """The create's and the rotation's answer: the only time the secret is shown (context ``secret``)."""

    secret = serializers.SerializerMethodField()

    class Meta(WebhookEndpointSerializer.Meta):
        fields = [*WebhookEndpointSerializer.Meta.fields, "secret"]
        read_only_fields = fields

    @extend_schema_field(
        serializers.CharField(
            help_text="`whsec_` + base64: verify the webhook-signature header with it (Standard Webhooks). "
            "Shown only in this response: store it now."
        )
    )
    def get_secret(self, obj) -> str:
        return self.context["secret"]


class WebhookDeliveryPageQuerySerializer(PageQuerySerializer):
    status = serializers.ChoiceField(
        choices=DeliveryStatus.choices, required=False, help_text="Only deliveries in this status."
    )


class WebhookDeliveryAttemptSerializer(serializers.ModelSerializer):
    started_at = StrictDateTimeField()
    status_code = serializers.IntegerField(allow_null=True, help_text="The HTTP status answered; null: no answer.")
    response_body = serializers.CharField(help_text="The first 1 KiB of the answer.")
    error = serializers.CharField(help_text="Why there was no usable answer (timeout, refused address, ...).")

    class Meta:
        model = DeliveryAttempt
        fields = ["attempt", "started_at", "latency_ms", "status_code", "response_body", "error"]
        read_only_fields = fields


class WebhookDeliverySerializer(serializers.ModelSerializer):
    delivery_id = serializers.IntegerField(source="id")
    event_id = serializers.CharField(source="event.public_id", help_text="The webhook-id header: same on every try.")
    event_type = serializers.ChoiceField(source="event.type", choices=EVENT_TYPE_CHOICES)
    status = serializers.ChoiceField(choices=DeliveryStatus.choices)
    tries = serializers.IntegerField(source="attempts", help_text="Tries in the current run of the retry ladder.")
    next_attempt_at = serializers.SerializerMethodField()
    last_status_code = serializers.IntegerField(allow_null=True)
    created_at = StrictDateTimeField()
    updated_at = StrictDateTimeField()
    attempts = WebhookDeliveryAttemptSerializer(
        source="recent_attempts", many=True, help_text="Its tries, newest first (at most 50)."
    )

    class Meta:
        model = Delivery
        fields = [
            "delivery_id",
            "event_id",
            "event_type",
            "status",
            "tries",
            "next_attempt_at",
            "last_status_code",
            "last_error",
            "created_at",
            "updated_at",
            "attempts",
        ]
        read_only_fields = fields

    @extend_schema_field(StrictDateTimeField(allow_null=True, help_text="pending only: when the next try may start."))
    def get_next_attempt_at(self, obj) -> str | None:
        return format_utc(obj.next_attempt_at) if obj.status == DeliveryStatus.PENDING else None


# --- what a receiver gets (documented as a callback of the create) -----------------------


def _event_payload(name: str, data, types: list[str], description: str):
    return type(
        name,
        (serializers.Serializer,),
        {
            "__doc__": description,
            "id": serializers.CharField(help_text="evt_<n>: also the webhook-id header; deduplicate on it."),
            "type": serializers.ChoiceField(choices=[(t, t) for t in types]),
            "created_at": StrictDateTimeField(help_text="When the change happened (its transaction)."),
            "data": data,
        },
    )


PaymentEventPayload = _event_payload(
    "PaymentEventPayload",
    WebhookPaymentSerializer(
        help_text="The payment as GET /payments/{id} showed it right after the change, without `attempts`; "
        "`version` orders the events of one payment."
    ),
    [t for t in EVENT_TYPES if t.startswith("payment.")],
    "A payment event.",
)
RecurringEventPayload = _event_payload(
    "RecurringEventPayload",
    RecurringPaymentSerializer(help_text="The recurring payment right after the change (without occurrences)."),
    [t for t in EVENT_TYPES if t.startswith("recurring_payment.")],
    "A recurring payment event.",
)

WebhookEventPayload = PolymorphicProxySerializer(
    component_name="WebhookEvent",
    serializers=[PaymentEventPayload, RecurringEventPayload],
    resource_type_field_name=None,
)
