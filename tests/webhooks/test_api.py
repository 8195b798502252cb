"""The webhook endpoints API: create (secret once), list, read, change, delete, rotate,
deliveries with their attempts, resend; ownership (404 for others, 403 for staff who
may only read), Idempotency-Key, If-Match, validation codes, the OpenAPI description."""

import json
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.utils import timezone
from standardwebhooks import Webhook

from tests.api import assert_error, patch, post
from tests.conftest import client_for
from tests.factories import UserFactory
from webhooks.endpoints import MAX_ENDPOINTS_PER_USER, endpoint_create
from webhooks.models import Delivery, DeliveryAttempt, DeliveryStatus, Endpoint, Event
from webhooks.signing import signed_headers

pytestmark = pytest.mark.django_db

BASE = "/api/v1/webhook-endpoints"
URL = "https://hooks.example.com/delaypay"


@pytest.fixture(autouse=True)
def _production_rules(settings):
    """Production's URL rules (https, public addresses), whatever DJANGO_DEBUG says."""
    settings.DEBUG = False
    settings.DELAYPAY_WEBHOOK_ALLOW_HOSTS = []


def create(api, body=None, key=None):
    body = body if body is not None else {"url": URL, "events": ["payment.executed", "payment.failed"]}
    return post(api, BASE, body, key=key or uuid.uuid4().hex)


def an_endpoint(owner, **kwargs) -> Endpoint:
    kwargs.setdefault("url", URL)
    kwargs.setdefault("events", ["payment.executed"])
    return endpoint_create(owner=owner, **kwargs).endpoint


def a_delivery(endpoint: Endpoint, *, status=DeliveryStatus.FAILED, tries=2) -> Delivery:
    event = Event.objects.create(
        type="payment.executed", owner=endpoint.owner, payment_id="pay_x", version=3, snapshot={}
    )
    delivery = Delivery.objects.create(
        event=event, endpoint=endpoint, status=status, attempts=tries, last_status_code=500, last_error=""
    )
    for n in range(1, tries + 1):
        DeliveryAttempt.objects.create(
            delivery=delivery,
            attempt=n,
            started_at=timezone.now(),
            latency_ms=12 * n,
            status_code=500,
            response_body="boom" * 10,
        )
    return delivery


def staff_with(*codenames):
    staff = UserFactory(is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(content_type__app_label="webhooks", codename__in=codenames))
    return staff


# --- create -------------------------------------------------------------------------------


def test_create_answers_201_with_the_secret_once(api, user):
    response = create(api, {"url": URL, "events": ["payment.executed", "payment.executed"], "description": "mine"})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["endpoint_id"].startswith("whe_")
    assert body["secret"].startswith("whsec_")
    assert body["events"] == ["payment.executed"]  # repeats count once
    assert body["enabled"] is True and body["disabled_reason"] is None and body["version"] == 1
    assert body["owner"] == user.username
    endpoint = Endpoint.objects.get(pk=body["endpoint_id"])
    assert endpoint.secret == body["secret"]
    # Never again in a read, a list or a change.
    read = api.get(f"{BASE}/{endpoint.pk}")
    assert read.status_code == 200 and "secret" not in read.json() and body["secret"] not in read.content.decode()
    assert body["secret"] not in api.get(BASE).content.decode()
    changed = patch(api, f"{BASE}/{endpoint.pk}", {"description": "x"})
    assert changed.status_code == 200 and body["secret"] not in changed.content.decode()


def test_the_secret_verifies_a_signature_with_the_standardwebhooks_library(api):
    secret = create(api).json()["secret"]
    payload = '{"id":"evt_1"}'
    headers = signed_headers(msg_id="evt_1", body=payload, secrets=[secret])
    assert Webhook(secret).verify(payload, headers) == {"id": "evt_1"}


def test_create_is_idempotent_with_the_same_key(api):
    key = uuid.uuid4().hex
    first, again = create(api, key=key), create(api, key=key)
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    assert Endpoint.objects.count() == 1
    other = create(api, {"url": URL + "/other", "events": ["payment.failed"]}, key=key)
    assert_error(other, 409, "idempotency_key_reused")


def test_create_without_an_idempotency_key_is_400(api):
    response = api.post(
        BASE, data=json.dumps({"url": URL, "events": ["payment.failed"]}), content_type="application/json"
    )
    assert_error(response, 400, "idempotency_key_required")


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://hooks.example.com/x", "only https"),
        ("https://127.0.0.1/x", "loopback"),
        ("https://10.1.2.3/x", "private"),
        ("https://169.254.169.254/latest/meta-data", "link-local"),
        ("https://localhost/x", "loopback name"),
        ("ftp://hooks.example.com/x", "https://host"),
        ("https://user:pw@hooks.example.com/x", "credentials"),
    ],
)
def test_a_url_webhooks_may_not_reach_is_400_validation_error_on_url(api, url, reason):
    body = assert_error(create(api, {"url": url, "events": ["payment.failed"]}), 400, "validation_error")
    assert reason in body["fields"]["url"][0], body
    assert not Endpoint.objects.exists()


def test_plain_http_to_an_allowed_host_is_accepted(api, settings):
    settings.DELAYPAY_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]
    assert create(api, {"url": "http://127.0.0.1:8099/hook", "events": ["payment.failed"]}).status_code == 201


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"url": URL, "events": []}, "events"),
        ({"url": URL, "events": ["*"]}, "events"),
        ({"url": URL, "events": ["payment.teleported"]}, "events"),
        ({"url": URL, "events": "payment.failed"}, "events"),
        ({"url": URL}, "events"),
        ({"events": ["payment.failed"]}, "url"),
        ({"url": 7, "events": ["payment.failed"]}, "url"),
        ({"url": URL, "events": ["payment.failed"], "secret": "whsec_mine"}, "secret"),
        ({"url": URL, "events": ["payment.failed"], "description": "x" * 201}, "description"),
    ],
)
def test_a_malformed_create_is_400_naming_the_field(api, body, field):
    assert field in assert_error(create(api, body), 400, "validation_error")["fields"]


def test_bad_event_types_are_listed_as_sentences_in_the_error_shape(api):
    # DRF's ListField nests item errors in a dict by index, which the Error schema does not allow.
    body = {"url": URL, "events": ["payment.executed", "AAA", 0, None]}
    messages = assert_error(create(api, body), 400, "validation_error")["fields"]["events"]
    assert all(isinstance(m, str) for m in messages) and len(messages) == 3, messages
    assert messages[0].startswith("Item 1: ")


def test_one_user_has_at_most_the_endpoint_limit(api, user):
    for n in range(MAX_ENDPOINTS_PER_USER):
        an_endpoint(user, url=f"{URL}/{n}")
    body = assert_error(create(api), 409, "limit_webhook_endpoints")
    assert body["limit"] == body["usage"] == MAX_ENDPOINTS_PER_USER


# --- read, list ------------------------------------------------------------------------------


def test_list_shows_own_endpoints_newest_first_and_pages(api, user, other_user):
    mine = [an_endpoint(user, url=f"{URL}/{n}") for n in range(3)]
    an_endpoint(other_user)
    first = api.get(BASE, {"limit": 2}).json()
    second = api.get(BASE, {"limit": 2, "cursor": first["next_cursor"]}).json()
    listed = [e["endpoint_id"] for e in first["items"] + second["items"]]
    assert sorted(listed) == sorted(e.pk for e in mine) and second["next_cursor"] is None


def test_list_filters_on_enabled(api, user):
    on, off = an_endpoint(user), an_endpoint(user)
    Endpoint.objects.filter(pk=off.pk).update(enabled=False)
    assert [e["endpoint_id"] for e in api.get(BASE, {"enabled": "false"}).json()["items"]] == [off.pk]
    assert [e["endpoint_id"] for e in api.get(BASE, {"enabled": "true"}).json()["items"]] == [on.pk]
    assert_error(api.get(BASE, {"enabld": "true"}), 400, "validation_error")


def test_someone_elses_endpoint_is_404_for_every_operation(api, other_user):
    theirs = an_endpoint(other_user)
    delivery = a_delivery(theirs)
    path = f"{BASE}/{theirs.pk}"
    assert_error(api.get(path), 404, "not_found")
    assert_error(patch(api, path, {"enabled": False}), 404, "not_found")
    assert_error(api.delete(path), 404, "not_found")
    assert_error(post(api, f"{path}/rotate-secret", None, key="k1"), 404, "not_found")
    assert_error(api.get(f"{path}/deliveries"), 404, "not_found")
    assert_error(post(api, f"{path}/deliveries/{delivery.pk}/resend", None), 404, "not_found")
    assert theirs.pk not in api.get(BASE).content.decode()
    theirs.refresh_from_db()
    assert theirs.enabled and theirs.version == 1


def test_staff_with_the_view_permission_read_but_may_not_act(other_user):
    theirs = an_endpoint(other_user)
    delivery = a_delivery(theirs)
    staff = client_for(staff_with("view_endpoint", "view_delivery"))
    path = f"{BASE}/{theirs.pk}"
    assert staff.get(path).status_code == 200
    assert theirs.pk in staff.get(BASE).content.decode()
    assert staff.get(f"{path}/deliveries").json()["items"][0]["delivery_id"] == delivery.pk
    assert_error(patch(staff, path, {"enabled": False}), 403, "permission_denied")
    assert_error(staff.delete(path), 403, "permission_denied")
    assert_error(post(staff, f"{path}/rotate-secret", None, key="k1"), 403, "permission_denied")
    assert_error(post(staff, f"{path}/deliveries/{delivery.pk}/resend", None), 403, "permission_denied")
    # is_staff alone grants nothing.
    assert_error(client_for(UserFactory(is_staff=True)).get(path), 404, "not_found")


def test_staff_reading_endpoints_but_not_deliveries_get_404_on_the_deliveries(other_user):
    theirs = an_endpoint(other_user)
    staff = client_for(staff_with("view_endpoint"))
    assert staff.get(f"{BASE}/{theirs.pk}").status_code == 200
    assert_error(staff.get(f"{BASE}/{theirs.pk}/deliveries"), 404, "not_found")


# --- change, delete -------------------------------------------------------------------------


def test_patch_changes_url_events_description_and_bumps_version_with_etag(api, user):
    endpoint = an_endpoint(user)
    response = patch(
        api,
        f"{BASE}/{endpoint.pk}",
        {"url": URL + "/v2", "events": ["payment.cancelled"], "description": "v2"},
        HTTP_IF_MATCH='"1"',
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["url"], body["events"], body["description"], body["version"]) == (
        URL + "/v2",
        ["payment.cancelled"],
        "v2",
        2,
    )
    assert response["ETag"] == '"2"'
    # The same values again: nothing changes, 200.
    again = patch(api, f"{BASE}/{endpoint.pk}", {"url": URL + "/v2"})
    assert again.status_code == 200 and again.json()["version"] == 2


def test_patch_with_a_stale_if_match_is_412_and_changes_nothing(api, user):
    endpoint = an_endpoint(user)
    body = assert_error(
        patch(api, f"{BASE}/{endpoint.pk}", {"description": "x"}, HTTP_IF_MATCH='"7"'), 412, "version_mismatch"
    )
    assert body["version"] == 1
    endpoint.refresh_from_db()
    assert endpoint.description == ""


def test_patch_refuses_an_unsafe_url_and_a_non_boolean_enabled(api, user):
    endpoint = an_endpoint(user)
    assert (
        "url"
        in assert_error(patch(api, f"{BASE}/{endpoint.pk}", {"url": "https://192.168.1.1/"}), 400, "validation_error")[
            "fields"
        ]
    )
    assert (
        "enabled"
        in assert_error(patch(api, f"{BASE}/{endpoint.pk}", {"enabled": "yes"}), 400, "validation_error")["fields"]
    )
    assert_error(patch(api, f"{BASE}/{endpoint.pk}", {}), 400, "validation_error")


def test_re_enabling_clears_the_disabled_reason_and_resends_what_failed_while_disabled(api, user):
    endpoint = an_endpoint(user)
    failing = timezone.now() - timedelta(days=6)
    Endpoint.objects.filter(pk=endpoint.pk).update(
        enabled=False, disabled_reason="failing since ... without a successful delivery", failing_since=failing
    )
    shown = api.get(f"{BASE}/{endpoint.pk}").json()
    assert shown["enabled"] is False and shown["disabled_reason"].startswith("failing since")
    untried = a_delivery(endpoint, tries=0)
    Delivery.objects.filter(pk=untried.pk).update(last_error="endpoint disabled")
    tried = a_delivery(endpoint)  # failed on its own ladder: stays failed
    body = patch(api, f"{BASE}/{endpoint.pk}", {"enabled": True}).json()
    assert body["enabled"] is True and body["disabled_reason"] is None and body["failing_since"] is None
    untried.refresh_from_db()
    tried.refresh_from_db()
    assert (untried.status, tried.status) == (DeliveryStatus.PENDING, DeliveryStatus.FAILED)


def test_delete_removes_the_endpoint_and_its_deliveries_but_not_the_events(api, user):
    endpoint = an_endpoint(user)
    delivery = a_delivery(endpoint)
    response = api.delete(f"{BASE}/{endpoint.pk}")
    assert response.status_code == 204 and response.content == b""
    assert not Endpoint.objects.filter(pk=endpoint.pk).exists()
    assert not Delivery.objects.filter(pk=delivery.pk).exists()
    assert not DeliveryAttempt.objects.filter(delivery_id=delivery.pk).exists()
    assert Event.objects.filter(pk=delivery.event_id).exists()
    assert_error(api.get(f"{BASE}/{endpoint.pk}"), 404, "not_found")


# --- rotate ----------------------------------------------------------------------------------


def test_rotate_returns_a_new_secret_and_keeps_the_old_one_for_24_hours(api, user):
    created = create(api).json()
    endpoint_id, old = created["endpoint_id"], created["secret"]
    key = uuid.uuid4().hex
    response = post(api, f"{BASE}/{endpoint_id}/rotate-secret", None, key=key)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["secret"].startswith("whsec_") and body["secret"] != old and body["version"] == 2
    endpoint = Endpoint.objects.get(pk=endpoint_id)
    assert (endpoint.secret, endpoint.previous_secret) == (body["secret"], old)
    grace = endpoint.previous_secret_expires_at - endpoint.updated_at
    assert timedelta(hours=23, minutes=59) < grace <= timedelta(hours=24, seconds=1)
    assert body["previous_secret_expires_at"] is not None
    assert "previous_secret" not in api.get(f"{BASE}/{endpoint_id}").json()
    # A retried rotation (same key) replays: it does not rotate twice.
    again = post(api, f"{BASE}/{endpoint_id}/rotate-secret", None, key=key)
    assert again.content == response.content and again["Idempotent-Replayed"] == "true"
    assert Endpoint.objects.get(pk=endpoint_id).secret == body["secret"]


def test_rotate_needs_an_idempotency_key(api, user):
    endpoint = an_endpoint(user)
    assert_error(api.post(f"{BASE}/{endpoint.pk}/rotate-secret"), 400, "idempotency_key_required")


# --- deliveries, resend ----------------------------------------------------------------------


def test_deliveries_are_listed_newest_first_with_attempts_and_filter_by_status(api, user):
    endpoint = an_endpoint(user)
    older = a_delivery(endpoint, status=DeliveryStatus.SUCCEEDED, tries=1)
    newer = a_delivery(endpoint, status=DeliveryStatus.FAILED, tries=3)
    items = api.get(f"{BASE}/{endpoint.pk}/deliveries").json()["items"]
    assert [d["delivery_id"] for d in items] == [newer.pk, older.pk]
    first = items[0]
    assert first["event_id"] == f"evt_{newer.event_id}" and first["event_type"] == "payment.executed"
    assert first["status"] == "failed" and first["tries"] == 3 and first["next_attempt_at"] is None
    assert [a["attempt"] for a in first["attempts"]] == [3, 2, 1]
    assert first["attempts"][0] | {"started_at": None} == {
        "attempt": 3,
        "started_at": None,
        "latency_ms": 36,
        "status_code": 500,
        "response_body": "boom" * 10,
        "error": "",
    }
    only = api.get(f"{BASE}/{endpoint.pk}/deliveries", {"status": "succeeded"}).json()["items"]
    assert [d["delivery_id"] for d in only] == [older.pk]
    assert_error(api.get(f"{BASE}/{endpoint.pk}/deliveries", {"status": "lost"}), 400, "validation_error")


def test_resend_puts_a_failed_delivery_back_to_pending_due_now(api, user):
    endpoint = an_endpoint(user)
    delivery = a_delivery(endpoint, status=DeliveryStatus.FAILED, tries=3)
    response = post(api, f"{BASE}/{endpoint.pk}/deliveries/{delivery.pk}/resend", None)
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["status"] == "pending" and body["tries"] == 0 and body["next_attempt_at"] is not None
    assert len(body["attempts"]) == 3  # the earlier tries are kept


@pytest.mark.parametrize("delivery_id", ["999999", "abc", "9" * 30])
def test_resend_of_no_such_delivery_is_404(api, user, delivery_id):
    endpoint = an_endpoint(user)
    assert_error(post(api, f"{BASE}/{endpoint.pk}/deliveries/{delivery_id}/resend", None), 404, "not_found")


def test_resend_of_another_endpoints_delivery_is_404(api, user, other_user):
    mine = an_endpoint(user)
    theirs = a_delivery(an_endpoint(other_user))
    assert_error(post(api, f"{BASE}/{mine.pk}/deliveries/{theirs.pk}/resend", None), 404, "not_found")


# --- the OpenAPI description -------------------------------------------------------------------


def test_the_schema_documents_the_webhooks_operations_payload_and_signature_headers(api):
    schema = json.loads(client_for(None).get("/api/v1/schema", {"format": "json"}).content)
    paths = schema["paths"]
    for path in (
        "/api/v1/webhook-endpoints",
        "/api/v1/webhook-endpoints/{endpoint_id}",
        "/api/v1/webhook-endpoints/{endpoint_id}/rotate-secret",
        "/api/v1/webhook-endpoints/{endpoint_id}/deliveries",
        "/api/v1/webhook-endpoints/{endpoint_id}/deliveries/{delivery_id}/resend",
    ):
        assert all(op["tags"] == ["webhooks"] for op in paths[path].values()), path
    create_op = paths["/api/v1/webhook-endpoints"]["post"]
    callback = create_op["callbacks"]["event"]["{$request.body#/url}"]["post"]
    for header in ("webhook-id", "webhook-timestamp", "webhook-signature"):
        assert header in callback["description"]
    assert callback["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/WebhookEvent")
    components = schema["components"]["schemas"]
    assert "secret" in components["WebhookEndpointWithSecret"]["properties"]
    assert "secret" not in components["WebhookEndpoint"]["properties"]
    assert set(components["WebhookEventTypeEnum"]["enum"]) >= {"payment.executed", "recurring_payment.ended"}


def test_the_how_to_receivers_five_lines_verify_a_signed_event_and_refuse_a_forged_one():
    page = (Path(settings.BASE_DIR) / "docs/how-to/receive-webhooks.md").read_text()
    snippet = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert len([line for line in snippet.splitlines() if line.strip()]) <= 5
    secret = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    namespace = {"SECRET": secret}
    exec(snippet, namespace)  # our own documentation's code
    body = b'{"id":"evt_7","type":"payment.executed","data":{"version":2}}'
    headers = signed_headers(msg_id="evt_7", body=body.decode(), secrets=[secret])
    assert namespace["receive"](body, headers)["id"] == "evt_7"
    with pytest.raises(namespace["WebhookVerificationError"]):
        namespace["receive"](body.replace(b"2", b"3"), headers)
