"""A refused act is the console's own 403 page (issue 36, point 4): the console's header and
navigation, a way back, the permission that was missing and the staff group that grants it.
A staff user in no group is told on the front page what to ask for."""

import json

import pytest
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.test import RequestFactory
from django.urls import get_resolver, reverse
from knox.models import AuthToken

from common.admin_tools import id_in_url
from tests.conftest import admin_client_for
from tests.factories import UserFactory, funded_account, future_payment

pytestmark = pytest.mark.django_db

PAYMENTS = reverse("admin:payments_scheduledpayment_changelist")
SITE_HEADER = "delaypay operations"


def refused(response) -> str:
    assert response.status_code == 403
    html = response.content.decode()
    assert SITE_HEADER in html and 'id="user-tools"' in html  # the console's header, the user's links
    assert 'id="dp-back"' in html
    return html


def test_a_refused_list_action_names_the_permission_and_the_group_that_grants_it(auditor_user):
    payment = future_payment(source=funded_account(balance=10), target=funded_account())
    response = admin_client_for(auditor_user).post(
        PAYMENTS, {"action": "cancel_selected", "_selected_action": [payment.pk]},
        HTTP_REFERER=f"http://testserver{PAYMENTS}",
    )
    html = refused(response)
    assert "Can cancel a scheduled payment" in html and "payments.cancel_scheduledpayment" in html
    assert response.context["granting_groups"] == ["support"]
    assert "<strong>support</strong> grants it" in html
    assert f'href="http://testserver{PAYMENTS}" id="dp-back"' in html  # back where the user came from


def test_a_refused_deposit_names_the_treasury_group(support_user):
    account = funded_account()
    response = admin_client_for(support_user).get(reverse("admin:ledger_account_deposit", args=[id_in_url(account.pk)]))
    html = refused(response)
    assert "ledger.deposit_account" in html
    assert response.context["granting_groups"] == ["treasury"]
    assert f'href="{reverse("admin:index")}" id="dp-back"' in html  # no referer: the front page


def test_a_refused_confirmation_page_names_its_permission(auditor_user):
    payment = future_payment(source=funded_account(balance=10), target=funded_account())
    response = admin_client_for(auditor_user).get(
        reverse("admin:payments_scheduledpayment_redrive", args=[id_in_url(payment.pk)])
    )
    assert "payments.redrive_scheduledpayment" in refused(response)
    assert response.context["granting_groups"] == ["support"]


def test_a_page_for_which_no_group_holds_the_permission_says_so(support_user):
    html = refused(admin_client_for(support_user).get(reverse("admin:auth_user_changelist")))
    assert "auth.view_user" in html and "No staff group grants it" in html


def test_the_dashboard_refused_to_a_groupless_user_names_every_group_that_reads(staff_groups):
    groupless = UserFactory(is_staff=True)
    response = admin_client_for(groupless).get(reverse("admin-dashboard"))
    refused(response)
    assert response.context["permission"] == "payments.view_scheduledpayment"
    assert response.context["granting_groups"] == ["auditor", "support", "treasury"]


def test_a_page_offered_to_nobody_does_not_blame_a_permission(superuser):
    token, _ = AuthToken.objects.create(UserFactory())
    response = admin_client_for(superuser).post(
        reverse("admin:knox_authtoken_change", args=[quote(token.pk)]), {"_save": "Save"}
    )
    html = refused(response)
    assert response.context["permission"] == ""
    assert "not offered to your account" in html


def test_a_403_outside_the_console_is_still_the_apis_json():
    request = RequestFactory().get("/api/v1/payments")
    response = get_resolver().resolve_error_handler(403)(request, exception=PermissionDenied())
    assert response.status_code == 403
    assert json.loads(response.content)["code"] == "permission_denied"


def test_the_front_page_of_a_staff_user_in_no_group_says_whom_to_ask_and_what_each_group_does(staff_groups):
    groupless = UserFactory(is_staff=True)
    response = admin_client_for(groupless).get(reverse("admin:index"))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="dp-no-group"' in html and "ask an administrator" in html.lower()
    for group in ("support", "auditor", "treasury"):
        assert f"<strong>{group}</strong>" in html
    assert "can also cancel a scheduled payment" in html  # support
    assert "reads every page, changes nothing" in html  # auditor
    assert "deposit into an account" in html  # treasury


def test_the_front_page_of_a_user_in_a_group_has_no_such_notice(support_user):
    html = admin_client_for(support_user).get(reverse("admin:index")).content.decode()
    assert 'id="dp-no-group"' not in html
