"""Webhook endpoints: what their owners create, read, change, rotate and delete.

An endpoint belongs to its creator. Reads go through ``endpoint_visible_to`` (the owner's
own; every endpoint for staff with ``webhooks.view_endpoint``, common/authz.py); acts
(change, delete, rotate the secret, resend a delivery) are the owner's alone: staff who
may read someone else's endpoint get 403, everyone else 404 (existence is not revealed).
Staff resend deliveries from the admin, with a reason.

Every write is one transaction that locks the endpoint's row, compares, and bumps
``version`` only when something changed (Saleor's rule: re-fetch under the lock).
"""

from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Prefetch, QuerySet, Value
from django.db.models.functions import Now

from common.authz import staff_may_view
from payments.limits import lock_payer

from .exceptions import (
    DeliveryNotFound,
    EndpointActForbidden,
    EndpointLimit,
    EndpointNotFound,
    EndpointVersionMismatch,
)
from .models import Delivery, DeliveryAttempt, Endpoint, new_secret
from .safety import validate_endpoint_url
from .services import deliveries_recover_disabled

# After a rotation the old secret keeps signing alongside the new one this long.
PREVIOUS_SECRET_GRACE = timedelta(hours=24)
# Every event fans out to each subscribed endpoint of its owner: a cap keeps one user
# from multiplying the dispatcher's work.
MAX_ENDPOINTS_PER_USER = 10
# Attempts shown per delivery in the API, newest first: a delivery resent many times
# keeps its older tries in the admin.
MAX_ATTEMPTS_SHOWN = 50


# --- reads ---------------------------------------------------------------------------------


def endpoint_visible_to(*, user) -> QuerySet[Endpoint]:
    """The endpoints ``user`` may read: their own; every one for staff with the view permission."""
    qs = Endpoint.objects.select_related("owner")
    return qs if staff_may_view(user, Endpoint) else qs.filter(owner=user)


def endpoint_get(*, user, endpoint_id: str) -> Endpoint:
    endpoint = endpoint_visible_to(user=user).filter(pk=endpoint_id).first()
    if endpoint is None:
        raise EndpointNotFound()
    return endpoint


def endpoint_list(*, user, enabled: bool | None = None) -> QuerySet[Endpoint]:
    """Unordered: the caller orders and paginates."""
    qs = endpoint_visible_to(user=user)
    return qs if enabled is None else qs.filter(enabled=enabled)


def endpoint_authorize(*, user, endpoint_id: str) -> None:
    """Raise unless ``user`` owns the endpoint: 404 if they may not read it, 403 if they may."""
    if Endpoint.objects.filter(pk=endpoint_id, owner=user).exists():
        return
    endpoint_get(user=user, endpoint_id=endpoint_id)  # EndpointNotFound when not visible
    raise EndpointActForbidden()


def delivery_list(*, user, endpoint_id: str, status: str | None = None) -> QuerySet[Delivery]:
    """An endpoint's deliveries with their event and attempts (newest attempt first):
    for its owner, and for staff who may read both endpoints and deliveries."""
    endpoint = endpoint_get(user=user, endpoint_id=endpoint_id)
    if endpoint.owner_id != user.pk and not staff_may_view(user, Delivery):
        raise EndpointNotFound()
    attempts = DeliveryAttempt.objects.order_by("-id")[:MAX_ATTEMPTS_SHOWN]  # per delivery (a window function)
    qs = (
        Delivery.objects.filter(endpoint_id=endpoint.pk)
        .select_related("event")
        .prefetch_related(Prefetch("attempt_rows", queryset=attempts, to_attr="recent_attempts"))
    )
    return qs.filter(status=status) if status else qs


def delivery_get(*, user, endpoint_id: str, delivery_id: str) -> Delivery:
    """``delivery_id`` as the URL gives it: anything but a bigint is no such delivery."""
    if not (delivery_id.isascii() and delivery_id.isdigit() and len(delivery_id) <= 18):
        raise DeliveryNotFound()
    delivery = delivery_list(user=user, endpoint_id=endpoint_id).filter(pk=int(delivery_id)).first()
    if delivery is None:
        raise DeliveryNotFound()
    return delivery


# --- writes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreatedEndpoint:
    endpoint: Endpoint
    secret: str  # shown once, in the create's response


def _unique(events: list[str]) -> list[str]:
    return list(dict.fromkeys(events))


def endpoint_create(*, owner, url: str, events: list[str], description: str = "") -> CreatedEndpoint:
    """A new enabled endpoint with a fresh secret. The URL is checked (https, no private
    address: webhooks/safety.py) before anything is written."""
    validate_endpoint_url(url)
    with transaction.atomic():
        lock_payer(owner.pk)  # two creates at the cap cannot both pass
        usage = Endpoint.objects.filter(owner=owner).count()
        if usage >= MAX_ENDPOINTS_PER_USER:
            raise EndpointLimit(limit=MAX_ENDPOINTS_PER_USER, usage=usage)
        endpoint = Endpoint.objects.create(
            owner=owner, url=url, events=_unique(events), description=description, secret=new_secret()
        )
    endpoint.refresh_from_db()  # created_at and updated_at come from the database clock
    return CreatedEndpoint(endpoint=endpoint, secret=endpoint.secret)


def _locked_own(*, owner, endpoint_id: str, expected_version: int | None) -> Endpoint:
    endpoint = Endpoint.objects.select_for_update(no_key=True).filter(pk=endpoint_id, owner=owner).first()
    if endpoint is None:
        raise EndpointNotFound()
    if expected_version is not None and endpoint.version != expected_version:
        raise EndpointVersionMismatch(endpoint.version)
    return endpoint


def endpoint_update(
    *,
    endpoint_id: str,
    actor,
    expected_version: int | None = None,
    url: str | None = None,
    events: list[str] | None = None,
    enabled: bool | None = None,
    description: str | None = None,
) -> Endpoint:
    """Change what is given. Re-enabling an endpoint (the dispatcher disables one that keeps
    failing) clears ``disabled_reason`` and ``failing_since`` and sends again, on a fresh
    ladder, the deliveries that failed untried because it was disabled. Giving the values
    it already has changes nothing (no new version), so a retry is safe."""
    if url is not None:
        validate_endpoint_url(url)
    with transaction.atomic():
        endpoint = _locked_own(owner=actor, endpoint_id=endpoint_id, expected_version=expected_version)
        changes = {}
        if url is not None and url != endpoint.url:
            changes["url"] = url
        if events is not None and _unique(events) != endpoint.events:
            changes["events"] = _unique(events)
        if description is not None and description != endpoint.description:
            changes["description"] = description
        if enabled is not None and enabled != endpoint.enabled:
            changes["enabled"] = enabled
            if enabled:
                changes |= {"disabled_reason": "", "failing_since": None}
        if changes:
            Endpoint.objects.filter(pk=endpoint.pk).update(**changes, version=F("version") + 1, updated_at=Now())
            endpoint.refresh_from_db()
        if changes.get("enabled"):
            deliveries_recover_disabled(endpoint_id=endpoint.pk)
    return endpoint


def endpoint_rotate_secret(*, endpoint_id: str, actor, expected_version: int | None = None) -> CreatedEndpoint:
    """A new secret; the current one becomes the previous one and keeps signing beside it for
    PREVIOUS_SECRET_GRACE (by the database clock). A secret older than that (a second
    rotation within the grace) stops signing at once."""
    with transaction.atomic():
        endpoint = _locked_own(owner=actor, endpoint_id=endpoint_id, expected_version=expected_version)
        secret = new_secret()
        Endpoint.objects.filter(pk=endpoint.pk).update(
            secret=secret,
            previous_secret=endpoint.secret,
            previous_secret_expires_at=ExpressionWrapper(
                Now() + Value(PREVIOUS_SECRET_GRACE), output_field=DateTimeField()
            ),
            version=F("version") + 1,
            updated_at=Now(),
        )
        endpoint.refresh_from_db()
    return CreatedEndpoint(endpoint=endpoint, secret=secret)


def endpoint_delete(*, endpoint_id: str, actor, expected_version: int | None = None) -> None:
    """Delete the endpoint with its deliveries and their attempts. Events stay (the outbox
    is not the endpoint's); deliveries in flight are simply not recorded."""
    with transaction.atomic():
        endpoint = _locked_own(owner=actor, endpoint_id=endpoint_id, expected_version=expected_version)
        DeliveryAttempt.objects.filter(delivery__endpoint_id=endpoint.pk).delete()
        Delivery.objects.filter(endpoint_id=endpoint.pk).delete()
        endpoint.delete()
