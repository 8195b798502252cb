"""Webhook endpoints: create (the secret is shown once), list, read, change, delete,
rotate the secret; an endpoint's deliveries with their attempts, and resending one.

An endpoint is its owner's: staff with the view permission read others' (common/authz.py)
but only the owner acts on one (webhooks/endpoints.py)."""

from drf_spectacular.utils import OpenApiCallback, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.response import Response

from api import webhook_serializers as ws
from api.base import ApiView, render
from api.idempotency import run_idempotent
from api.pagination import paginated_response
from api.preconditions import expected_version, with_etag
from api.schema import (
    ETAG,
    IDEMPOTENCY_KEY,
    IDEMPOTENT_REPLAYED,
    IF_MATCH,
    READ,
    RETRY_AFTER,
    WRITE,
    WWW_AUTHENTICATE,
    errors,
    page_of,
)
from api.throttling import CreateThrottle
from webhooks.endpoints import (
    delivery_get,
    delivery_list,
    endpoint_authorize,
    endpoint_create,
    endpoint_delete,
    endpoint_get,
    endpoint_list,
    endpoint_rotate_secret,
    endpoint_update,
)
from webhooks.services import delivery_resend

ENDPOINT_ORDER = ("-created_at", "-id")

# The rotation answers 200 (nothing new is created at a URL), replayed like a create.
ROTATION_REPLAYED = OpenApiParameter(
    "Idempotent-Replayed",
    str,
    OpenApiParameter.HEADER,
    enum=["true"],
    response=[200],
    description="Present on a replayed response.",
)
DELIVERY_ORDER = ("-id",)

TAGS = ["webhooks"]

E403 = (
    "permission_denied: only the endpoint's owner changes it, deletes it, rotates its secret or resends; staff "
    "who may read it get 403 (they resend from the admin)."
)

SIGNATURE_HEADERS = (
    "Every delivery is a POST of this JSON with the Standard Webhooks headers: `webhook-id` (the event's `id`, "
    "the same on every retry: deduplicate on it), `webhook-timestamp` (Unix seconds of this try) and "
    "`webhook-signature` (`v1,<base64 HMAC-SHA256 of id.timestamp.body>` with the endpoint's secret; during the "
    "24 hours after a rotation a second `v1,...` signed with the previous secret follows, space-separated). "
    "Verify with the `standardwebhooks` library before trusting the body. Answer 2xx within "
    "DELAYPAY_WEBHOOK_TIMEOUT_SECONDS (default 10): anything else, a redirect or a timeout is retried "
    "on the DELAYPAY_WEBHOOK_RETRY_DELAYS ladder (5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h, 14 h, 14 h, 14 h, with "
    "jitter: about 3 days), then the delivery is failed. "
    "At least once, in no promised order: order one payment's events by `data.version`."
)

EVENT_CALLBACK = OpenApiCallback(
    name="event",
    path="{$request.body#/url}",
    decorator=extend_schema(
        summary="An event POSTed to your endpoint",
        description=SIGNATURE_HEADERS,
        request=ws.WebhookEventPayload,
        responses={200: OpenApiResponse(description="Any 2xx acknowledges the event; the body is ignored.")},
    ),
)


def endpoint_response(request, endpoint_id: str) -> Response:
    endpoint = endpoint_get(user=request.user, endpoint_id=endpoint_id)
    return with_etag(Response(ws.WebhookEndpointSerializer(endpoint).data), endpoint.version)


def endpoint_expected_version(request, endpoint_id: str) -> int | None:
    return expected_version(request, current=lambda: endpoint_get(user=request.user, endpoint_id=endpoint_id).version)


class EndpointListCreateView(ApiView):
    throttle_classes = [CreateThrottle]
    throttle_scope = "create"

    @extend_schema(
        operation_id="webhook_endpoints_list",
        tags=TAGS,
        summary="Your webhook endpoints, newest first (staff with webhooks.view_endpoint: every endpoint)",
        parameters=[ws.WebhookEndpointPageQuerySerializer, WWW_AUTHENTICATE],
        responses={200: page_of(ws.WebhookEndpointSerializer, "WebhookEndpointPage"), **errors(400, *READ)},
    )
    def get(self, request):
        query = ws.WebhookEndpointPageQuerySerializer.parse(request)
        endpoints = endpoint_list(user=request.user, enabled=query.get("enabled"))
        return paginated_response(request, endpoints, ws.WebhookEndpointSerializer, ordering=ENDPOINT_ORDER)

    @extend_schema(
        operation_id="webhook_endpoints_create",
        tags=TAGS,
        summary="Subscribe a URL to events about your payments and recurring payments",
        description=(
            "201 with the endpoint and its `secret`, shown only in this response (and in a replay of it with the "
            "same Idempotency-Key). The URL must be https:// on a public address: anything else is 400 "
            "validation_error with the reason under `fields.url`. At most 10 endpoints per user (409 "
            "limit_webhook_endpoints). The endpoint receives the events of the listed types about the payments "
            "and recurring payments you create, from the next change on. " + SIGNATURE_HEADERS
        ),
        request=ws.WebhookEndpointCreateSerializer,
        parameters=[IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, RETRY_AFTER, WWW_AUTHENTICATE],
        responses={
            201: OpenApiResponse(ws.WebhookEndpointWithSecretSerializer, description="Created (or a replay of it)."),
            **errors(
                *WRITE,
                409,
                429,
                e409="idempotency_key_reused or idempotency_key_in_use; "
                "limit_webhook_endpoints: you have the most endpoints one user may have.",
            ),
        },
        callbacks=[EVENT_CALLBACK],
    )
    def post(self, request):
        def create():
            body = ws.WebhookEndpointCreateSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            created = endpoint_create(owner=request.user, **body.validated_data)
            return 201, render(
                ws.WebhookEndpointWithSecretSerializer(created.endpoint, context={"secret": created.secret}).data
            )

        return run_idempotent(request, create)


class EndpointDetailView(ApiView):
    @extend_schema(
        operation_id="webhook_endpoints_retrieve",
        tags=TAGS,
        summary="A webhook endpoint (never its secret)",
        parameters=[ETAG, WWW_AUTHENTICATE],
        responses={200: ws.WebhookEndpointSerializer, **errors(*READ, 404)},
    )
    def get(self, request, endpoint_id: str):
        return endpoint_response(request, endpoint_id)

    @extend_schema(
        operation_id="webhook_endpoints_update",
        tags=TAGS,
        summary="Change the URL, the event types, the description, or enable/disable it",
        description=(
            "Any of url, events, enabled, description. `enabled: true` re-enables an endpoint the dispatcher "
            "disabled, clears `disabled_reason` and `failing_since` and sends again the deliveries that failed "
            "because it was disabled; `enabled: false` ends its pending deliveries as failed. "
            "Bumps `version`; `If-Match` makes it optimistic (412 version_mismatch). Sending the values it already "
            "has changes nothing and answers 200."
        ),
        request=ws.WebhookEndpointUpdateSerializer,
        parameters=[IF_MATCH, ETAG, WWW_AUTHENTICATE],
        responses={200: ws.WebhookEndpointSerializer, **errors(*WRITE, 403, 404, 412, e403=E403)},
    )
    def patch(self, request, endpoint_id: str):
        endpoint_authorize(user=request.user, endpoint_id=endpoint_id)
        body = ws.WebhookEndpointUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        expected = endpoint_expected_version(request, endpoint_id)
        endpoint_update(endpoint_id=endpoint_id, actor=request.user, expected_version=expected, **body.validated_data)
        return endpoint_response(request, endpoint_id)

    @extend_schema(
        operation_id="webhook_endpoints_delete",
        tags=TAGS,
        summary="Delete a webhook endpoint with its deliveries",
        description="204. Nothing more is sent to it, retries included. `If-Match` makes it optimistic.",
        parameters=[IF_MATCH, WWW_AUTHENTICATE],
        responses={204: OpenApiResponse(description="Deleted."), **errors(400, *READ, 403, 404, 412, e403=E403)},
    )
    def delete(self, request, endpoint_id: str):
        endpoint_authorize(user=request.user, endpoint_id=endpoint_id)
        expected = endpoint_expected_version(request, endpoint_id)
        endpoint_delete(endpoint_id=endpoint_id, actor=request.user, expected_version=expected)
        return Response(status=204)


class EndpointRotateSecretView(ApiView):
    throttle_classes = [CreateThrottle]
    throttle_scope = "create"

    @extend_schema(
        operation_id="webhook_endpoints_rotate_secret",
        tags=TAGS,
        summary="A new signing secret; the old one keeps signing beside it for 24 hours",
        description=(
            "200 with the endpoint and its new `secret`, shown only here (and in a replay with the same "
            "Idempotency-Key: a retried rotation must not rotate twice, or the secret you hold would stop signing "
            "at once). For 24 hours every delivery carries two signatures, so receivers can switch secrets "
            "without losing an event; `previous_secret_expires_at` says until when. A second rotation within "
            "those 24 hours ends the older secret at once."
        ),
        request=None,
        parameters=[IDEMPOTENCY_KEY, ROTATION_REPLAYED, IF_MATCH, RETRY_AFTER, WWW_AUTHENTICATE],
        responses={
            200: OpenApiResponse(ws.WebhookEndpointWithSecretSerializer, description="Rotated (or a replay of it)."),
            **errors(
                429, 400, *READ, 403, 404, 409, 412, e403=E403, e409="idempotency_key_reused or idempotency_key_in_use."
            ),
        },
    )
    def post(self, request, endpoint_id: str):
        endpoint_authorize(user=request.user, endpoint_id=endpoint_id)

        def rotate():
            expected = endpoint_expected_version(request, endpoint_id)
            rotated = endpoint_rotate_secret(endpoint_id=endpoint_id, actor=request.user, expected_version=expected)
            return 200, render(
                ws.WebhookEndpointWithSecretSerializer(rotated.endpoint, context={"secret": rotated.secret}).data
            )

        return run_idempotent(request, rotate)


class DeliveryListView(ApiView):
    @extend_schema(
        operation_id="webhook_endpoints_deliveries",
        tags=TAGS,
        summary="An endpoint's deliveries, newest first, each with its attempts",
        description=(
            "One delivery per event sent to this endpoint: its status (pending while retries remain, succeeded "
            "after a 2xx, failed when the ladder ran out), and every try's status code, latency, the first 1 KiB "
            "of the answer and the error. `status` filters."
        ),
        parameters=[ws.WebhookDeliveryPageQuerySerializer, WWW_AUTHENTICATE],
        responses={200: page_of(ws.WebhookDeliverySerializer, "WebhookDeliveryPage"), **errors(400, *READ, 404)},
    )
    def get(self, request, endpoint_id: str):
        query = ws.WebhookDeliveryPageQuerySerializer.parse(request)
        deliveries = delivery_list(user=request.user, endpoint_id=endpoint_id, status=query.get("status"))
        return paginated_response(request, deliveries, ws.WebhookDeliverySerializer, ordering=DELIVERY_ORDER)


class DeliveryResendView(ApiView):
    @extend_schema(
        operation_id="webhook_endpoints_deliveries_resend",
        tags=TAGS,
        summary="Send a delivery again, now",
        description=(
            "202: the delivery is pending again with a fresh retry ladder and is sent within seconds, with the same "
            "`webhook-id` (receivers deduplicate), whatever its status was. Repeating it sends it again, which "
            "at-least-once delivery allows, so no Idempotency-Key is needed."
        ),
        request=None,
        parameters=[WWW_AUTHENTICATE],
        responses={
            202: OpenApiResponse(ws.WebhookDeliverySerializer, description="Pending again."),
            **errors(*READ, 403, 404, e403=E403),
        },
    )
    def post(self, request, endpoint_id: str, delivery_id: str):
        delivery = delivery_get(user=request.user, endpoint_id=endpoint_id, delivery_id=delivery_id)  # else 404
        endpoint_authorize(user=request.user, endpoint_id=endpoint_id)  # readable, but not theirs: 403
        delivery_resend(delivery_id=delivery.pk, actor=request.user)
        delivery = delivery_get(user=request.user, endpoint_id=endpoint_id, delivery_id=delivery_id)
        return Response(ws.WebhookDeliverySerializer(delivery).data, status=202)
