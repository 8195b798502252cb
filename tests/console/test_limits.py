"""The admin's "Per-user limits" page (console/admin_limits.py): who stands where
against the limits, users at or near one first."""

from datetime import UTC, datetime, time, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from payments.services import payment_schedule
from recurring.services import recurring_create
from tests.conftest import admin_client_for
from tests.factories import UserFactory, funded_account

pytestmark = pytest.mark.django_db

URL = reverse("admin-limits")
NOON = datetime.combine((timezone.now() + timedelta(days=3)).date(), time(12), tzinfo=UTC)


def schedule(source, target, *, amount: int = 10, at: datetime = NOON):
    return payment_schedule(
        payer=source.owner, from_account_id=source.id, to_account_id=target.id, amount=amount, execute_at=at
    )


@pytest.fixture
def world(settings):
    """Caps of 5 pending, 2 series and 1,000 a day; ``full`` is at the pending cap,
    ``busy`` has 850 due on one day (85%), ``calm`` is far from everything."""
    settings.DELAYPAY_MAX_PENDING_PAYMENTS_PER_USER = 5
    settings.DELAYPAY_MAX_ACTIVE_SERIES_PER_USER = 2
    settings.DELAYPAY_MAX_DAILY_OUTFLOW_PER_USER = 1000
    target = funded_account()
    users = {}
    for name in ("full", "busy", "calm"):
        users[name] = funded_account(owner=UserFactory(username=name))
    for _ in range(5):
        schedule(users["full"], target)
    schedule(users["busy"], target, amount=800)
    recurring_create(payer=users["busy"].owner, from_account_id=users["busy"].id, to_account_id=target.id,
                     amount=25, start_at=NOON + timedelta(days=1), interval="PT12H")
    schedule(users["calm"], target, amount=1)
    return users


def usernames(response) -> list[str]:
    return [row.usage.username for row in response.context["rows"]]


def test_the_page_lists_users_at_or_near_a_limit_first(auditor_user, world):
    response = admin_client_for(auditor_user).get(URL)
    assert response.status_code == 200
    assert usernames(response) == ["full", "busy", "calm"]
    full, busy, calm = response.context["rows"]
    assert (full.tone, full.pending.used, full.pending.percent) == ("red", 5, "100%")
    assert (busy.tone, busy.usage.series_daily, busy.outflow.used, busy.outflow.percent) == ("amber", 50, 850, "85%")
    assert busy.usage.busiest_day == NOON.date()
    assert calm.tone == ""
    assert (response.context["at_cap"], response.context["near_cap"]) == (1, 1)
    html = response.content.decode()
    assert "at a limit" in html and "near a limit" in html
    assert "DELAYPAY_MAX_DAILY_OUTFLOW_PER_USER" in html
    # Each count links to the user's payments in the console.
    assert f'{reverse("admin:payments_scheduledpayment_changelist")}?q=full&amp;status__exact=SCHEDULED' in html


def test_a_lookup_by_username_shows_those_users(auditor_user, world):
    response = admin_client_for(auditor_user).get(URL, {"q": "calm nobody"})
    assert response.status_code == 200
    assert usernames(response) == ["calm"]
    assert response.context["missing"] == ["nobody"]
    assert "No such user: nobody" in response.content.decode()


def test_limits_that_are_off_say_so(auditor_user, world, settings):
    settings.DELAYPAY_MAX_PENDING_PAYMENTS_PER_USER = 0
    response = admin_client_for(auditor_user).get(URL)
    full = next(r for r in response.context["rows"] if r.usage.username == "full")
    assert full.pending.ratio is None and full.tone == ""
    assert "<td>off</td>" in response.content.decode()


def test_the_page_renders_with_nobody_to_show(auditor_user):
    response = admin_client_for(auditor_user).get(URL)
    assert response.status_code == 200 and response.context["rows"] == []


def test_the_page_is_linked_from_the_index(auditor_user):
    assert f'href="{URL}"' in admin_client_for(auditor_user).get(reverse("admin:index")).content.decode()


def test_staff_without_the_view_permission_get_403_and_others_the_login(world):
    assert admin_client_for(UserFactory(is_staff=True)).get(URL).status_code == 403
    response = admin_client_for(world["full"].owner).get(URL)
    assert response.status_code == 302 and response["Location"].startswith(reverse("admin:login"))
