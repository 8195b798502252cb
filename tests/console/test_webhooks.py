"""The webhooks console: endpoints without their secrets, the outbox, deliveries with their
attempts and the "Resend" act (confirmation page, reason, permission)."""

from urllib.parse import urlencode

import pytest
from django.contrib.admin import helpers
from django.contrib.admin.models import LogEntry
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils import timezone

from common.admin_tools import CONFIRMED
from tests.conftest import admin_client_for
from tests.factories import UserFactory
from webhooks.endpoints import endpoint_create
from webhooks.models import Delivery, DeliveryAttempt, DeliveryStatus, Event

pytestmark = pytest.mark.django_db


@pytest.fixture
def delivery():
    owner = UserFactory()
    created = endpoint_create(owner=owner, url="https://hooks.example.com/a", events=["payment.failed"])
    endpoint = created.endpoint
    endpoint.previous_secret = "whsec_previousSecretValue"
    endpoint.save(update_fields=["previous_secret"])
    event = Event.objects.create(type="payment.failed", owner=owner, payment_id="pay_adm", version=2, snapshot={})
    row = Delivery.objects.create(
        event=event, endpoint=endpoint, status=DeliveryStatus.FAILED, attempts=8, last_status_code=503, last_error=""
    )
    DeliveryAttempt.objects.create(
        delivery=row,
        attempt=8,
        started_at=timezone.now(),
        latency_ms=41,
        status_code=503,
        response_body="unavailable-marker",
    )
    return row


def test_endpoint_pages_never_show_a_secret(superuser, delivery):
    client = admin_client_for(superuser)
    endpoint = delivery.endpoint
    pages = [
        client.get(reverse("admin:webhooks_endpoint_changelist")),
        client.get(reverse("admin:webhooks_endpoint_change", args=[quote(endpoint.pk)])),
    ]
    for page in pages:
        assert page.status_code == 200
        html = page.content.decode()
        assert endpoint.secret not in html and "whsec_" not in html
        assert "hooks.example.com/a" in html


def test_endpoint_search_by_owner_username(superuser, delivery):
    client = admin_client_for(superuser)
    url = reverse("admin:webhooks_endpoint_changelist")
    assert delivery.endpoint.pk in client.get(url, {"q": delivery.endpoint.owner.username}).content.decode()
    assert delivery.endpoint.pk not in client.get(url, {"q": "nobody-such"}).content.decode()


def test_event_list_is_read_only_and_searchable_by_public_id(superuser, delivery):
    client = admin_client_for(superuser)
    url = reverse("admin:webhooks_event_changelist")
    page = client.get(url, {"q": f"evt_{delivery.event_id}"})
    assert page.status_code == 200 and "pay_adm" in page.content.decode()
    assert client.get(reverse("admin:webhooks_event_add")).status_code == 403


def test_delivery_page_shows_its_attempts_and_filters_by_status(superuser, delivery):
    client = admin_client_for(superuser)
    page = client.get(reverse("admin:webhooks_delivery_change", args=[delivery.pk]))
    assert page.status_code == 200 and "unavailable-marker" in page.content.decode()
    listed = client.get(reverse("admin:webhooks_delivery_changelist"), {"status__exact": "failed"})
    assert f"evt_{delivery.event_id}" in listed.content.decode()
    empty = client.get(reverse("admin:webhooks_delivery_changelist"), {"status__exact": "succeeded"})
    assert f"evt_{delivery.event_id}" not in empty.content.decode()


def resend_page(client, delivery, **data):
    return client.post(
        reverse("admin:webhooks_delivery_changelist"),
        {"action": "resend_selected", helpers.ACTION_CHECKBOX_NAME: [str(delivery.pk)], "index": "0", **data},
    )


def test_resend_asks_for_a_reason_then_resends_and_records_it(support_user, delivery):
    client = admin_client_for(support_user)
    page = resend_page(client, delivery)
    assert page.status_code == 303  # redirected to the confirmation page, a GET
    page = client.get(page["Location"])
    assert page.status_code == 200 and "Resend 1 delivery" in page.content.decode()
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.FAILED  # only the page, nothing done yet
    without_reason = resend_page(client, delivery, **{CONFIRMED: "1"})
    assert without_reason.status_code == 200
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.FAILED
    done = resend_page(client, delivery, **{CONFIRMED: "1", "reason": "receiver fixed, ticket 42"})
    assert done.status_code == 302
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.PENDING, 0)
    entry = LogEntry.objects.get(object_id=str(delivery.pk), user=support_user)
    assert "receiver fixed, ticket 42" in entry.get_change_message()


def test_the_delivery_pages_resend_button_url(support_user, delivery):
    client = admin_client_for(support_user)
    url = reverse("admin:webhooks_delivery_resend", args=[delivery.pk])
    assert client.get(url).status_code == 200
    assert client.post(url, {CONFIRMED: "1", "reason": "again"}).status_code == 302
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.PENDING


def test_an_auditor_reads_deliveries_but_may_not_resend(auditor_user, delivery):
    client = admin_client_for(auditor_user)
    assert client.get(reverse("admin:webhooks_delivery_changelist")).status_code == 200
    assert resend_page(client, delivery).status_code == 403
    assert client.get(reverse("admin:webhooks_delivery_resend", args=[delivery.pk])).status_code == 403
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.FAILED


def test_an_endpoints_deliveries_link_filters_to_that_endpoint(superuser, delivery):
    client = admin_client_for(superuser)
    endpoint = delivery.endpoint
    page = client.get(reverse("admin:webhooks_endpoint_change", args=[quote(endpoint.pk)])).content.decode()
    link = reverse("admin:webhooks_delivery_changelist") + "?" + urlencode({"endpoint__id__exact": endpoint.pk})
    assert f'href="{link}"' in page
    listed = client.get(link).context["cl"].result_list
    assert [d.pk for d in listed] == [delivery.pk]
