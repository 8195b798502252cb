"""Every name, description and reason a client gives refuses control, format
(bidirectional and zero-width), private-use and separator characters (common/text.py):
400 validation_error naming the field, and nothing is stored (issue 33: a bell and a
right-to-left override were stored in names)."""

import uuid
from urllib.parse import quote

import pytest
from django.contrib.auth.models import Permission

from ledger.models import Account, DepositRequest, StaffAction
from payments.models import Payee, PaymentEvent, PaymentStatus, ScheduledPayment
from tests.api import assert_error, patch, post
from tests.conftest import client_for
from tests.factories import UserFactory, funded_account, future_payment, webhook_endpoint
from webhooks.models import Endpoint

pytestmark = pytest.mark.django_db

# The two characters the issue found stored, a zero-width space and a line break.
CHARACTERS = {"bell": "\u0007", "rlo": "\u202e", "zwsp": "\u200b", "newline": "\n"}


def sneaked(character: str) -> str:
    return f"Bob{character}dcba"


def assert_refused(response, field: str, character: str) -> None:
    body = assert_error(response, 400, "validation_error")
    assert list(body["fields"]) == [field], body
    assert f"U+{ord(character):04X}" in body["fields"][field][0], body


def staff_with(*codenames: str):
    user = UserFactory(is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


@pytest.fixture(autouse=True)
def _production_webhook_rules(settings):
    settings.DEBUG = False
    settings.DELAYPAY_WEBHOOK_ALLOW_HOSTS = []


@pytest.mark.parametrize("character", CHARACTERS.values(), ids=CHARACTERS.keys())
def test_an_account_name(api, user, character):
    assert_refused(post(api, "/api/v1/accounts", {"name": sneaked(character)}), "name", character)
    assert not Account.objects.filter(owner=user).exists()
    assert post(api, "/api/v1/accounts", {"name": "Bob's «savings» 🙂"}).status_code == 201


@pytest.mark.parametrize("character", CHARACTERS.values(), ids=CHARACTERS.keys())
def test_a_payee_name(api, character):
    body = {"name": sneaked(character), "rail": "sandbox", "destination": "acct_bob"}
    assert_refused(post(api, "/api/v1/payees", body, key="k1"), "name", character)
    assert not Payee.objects.exists()


@pytest.mark.parametrize("character", CHARACTERS.values(), ids=CHARACTERS.keys())
def test_a_webhook_endpoint_description_and_url_on_create(api, character):
    body = {"url": "https://hooks.example.com/x", "events": ["payment.failed"], "description": sneaked(character)}
    assert_refused(post(api, "/api/v1/webhook-endpoints", body, key=uuid.uuid4().hex), "description", character)
    body = {"url": f"https://hooks.example.com/{sneaked(character)}", "events": ["payment.failed"]}
    assert_refused(post(api, "/api/v1/webhook-endpoints", body, key=uuid.uuid4().hex), "url", character)
    assert not Endpoint.objects.exists()


@pytest.mark.parametrize("character", CHARACTERS.values(), ids=CHARACTERS.keys())
def test_a_webhook_endpoint_description_and_url_on_update(api, user, character):
    endpoint = webhook_endpoint(user, description="mine")
    path = f"/api/v1/webhook-endpoints/{endpoint.id}"
    assert_refused(patch(api, path, {"description": sneaked(character)}), "description", character)
    assert_refused(patch(api, path, {"url": f"https://hooks.example.com/{sneaked(character)}"}), "url", character)
    assert Endpoint.objects.get(pk=endpoint.pk).description == "mine"


@pytest.mark.parametrize("character", CHARACTERS.values(), ids=CHARACTERS.keys())
def test_a_deposit_reason(character):
    staff = staff_with("view_account", "deposit_account")
    account = funded_account()
    response = post(
        client_for(staff), f"/api/v1/accounts/{account.id}/deposits",
        {"amount": 5, "reason": sneaked(character)}, key="k1",
    )
    assert_refused(response, "reason", character)
    assert not StaffAction.objects.exists() and not DepositRequest.objects.exists()


@pytest.mark.parametrize("act", ["approve", "reject"])
@pytest.mark.parametrize("character", CHARACTERS.values(), ids=CHARACTERS.keys())
def test_a_deposit_decision_reason(settings, act, character):
    settings.DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD = 1
    requester = staff_with("view_account", "deposit_account")
    account = funded_account()
    response = post(client_for(requester), f"/api/v1/accounts/{account.id}/deposits",
                    {"amount": 5, "reason": "funding"}, key="k1")
    request_id = response.json()["request_id"]
    approver = client_for(staff_with("view_account", "view_depositrequest", "approve_deposit"))
    response = post(approver, f"/api/v1/deposit-requests/{request_id}/{act}", {"reason": sneaked(character)})
    assert_refused(response, "reason", character)
    assert DepositRequest.objects.get(pk=request_id).status == "pending"


@pytest.mark.parametrize("act", ["redrive", "resolve"])
@pytest.mark.parametrize("character", CHARACTERS.values(), ids=CHARACTERS.keys())
def test_a_review_reason(act, character):
    payment = future_payment(source=funded_account(balance=10), target=funded_account())
    reviewer = client_for(staff_with("view_scheduledpayment", "redrive_scheduledpayment"))
    body = {"reason": sneaked(character), **({"outcome": "failed"} if act == "resolve" else {})}
    assert_refused(post(reviewer, f"/api/v1/payments/{payment.id}/{act}", body), "reason", character)
    assert not PaymentEvent.objects.filter(payment=payment).exclude(kind="created").exists()


@pytest.mark.parametrize("character", CHARACTERS.values(), ids=CHARACTERS.keys())
def test_a_staff_cancel_reason(character):
    payment = future_payment(source=funded_account(balance=10), target=funded_account())
    staff = client_for(staff_with("view_scheduledpayment", "cancel_scheduledpayment"))
    response = staff.delete(f"/api/v1/payments/{payment.id}?reason={quote(sneaked(character), safe='')}")
    assert_refused(response, "reason", character)
    assert ScheduledPayment.objects.get(pk=payment.pk).status == PaymentStatus.SCHEDULED
    assert not StaffAction.objects.exists()
