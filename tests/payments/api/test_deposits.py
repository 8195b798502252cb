"""Deposits through the API (issue 14): every deposit has an author and a reason; above
DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD a deposit is a request (202) that another staff member
with ledger.approve_deposit approves (the money moves once) or rejects; staff who cancel
someone else's payment say why."""

import pytest
from django.contrib.auth.models import Permission

from ledger.models import Account, DepositRequest, StaffAction, Transfer
from ledger.services import account_set_status
from tests.api import assert_error, post
from tests.conftest import client_for
from tests.factories import UserFactory, funded_account, future_payment

pytestmark = pytest.mark.django_db

REQUESTS = "/api/v1/deposit-requests"


@pytest.fixture(autouse=True)
def _threshold(settings):
    settings.DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD = 1_000


def staff_with(*codenames: str):
    user = UserFactory(is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return type(user).objects.get(pk=user.pk)


@pytest.fixture
def requester(db):
    return staff_with("view_account", "deposit_account", "view_depositrequest")


@pytest.fixture
def approver(db):
    return staff_with("view_account", "view_depositrequest", "approve_deposit")


def deposit(client, account, amount, reason="quarterly funding", key="k1"):
    return post(client, f"/api/v1/accounts/{account.id}/deposits", {"amount": amount, "reason": reason}, key=key)


def balance(account) -> int:
    return Account.objects.get(pk=account.pk).balance


def test_a_deposit_at_the_threshold_is_201_and_records_its_author_and_reason(requester):
    account = funded_account(balance=0)
    response = deposit(client_for(requester), account, 1_000)
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["amount"], body["balance"]) == (1_000, 1_000)
    action = StaffAction.objects.get(account=account)
    assert (action.action, action.actor, action.reason, action.transfer_key, action.amount) == (
        "deposit", requester, "quarterly funding", body["deposit_id"], 1_000
    )


@pytest.mark.parametrize("reason", [None, "", "   ", 5, "x" * 501])
def test_a_deposit_needs_a_reason(requester, reason):
    account = funded_account(balance=0)
    body = {"amount": 10} if reason is None else {"amount": 10, "reason": reason}
    response = post(client_for(requester), f"/api/v1/accounts/{account.id}/deposits", body, key="k")
    assert "reason" in assert_error(response, 400, "validation_error")["fields"]
    assert balance(account) == 0 and not StaffAction.objects.exists()


def test_a_deposit_above_the_threshold_is_202_a_pending_request_and_moves_nothing(requester):
    account = funded_account(balance=0)
    client = client_for(requester)
    response = deposit(client, account, 5_000)
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["request_id"].startswith("dreq_")
    assert (body["account_id"], body["amount"], body["status"], body["requested_by"]) == (
        account.id, 5_000, "pending", requester.username
    )
    assert (body["reason"], body["decided_by"], body["deposit_id"]) == ("quarterly funding", None, None)
    assert balance(account) == 0 and not Transfer.objects.filter(credit_account=account).exists()
    replay = deposit(client, account, 5_000)  # the same Idempotency-Key: the same request, not a second one
    assert (replay.status_code, replay.content, replay["Idempotent-Replayed"]) == (202, response.content, "true")
    assert DepositRequest.objects.count() == 1

    listed = client.get(REQUESTS, {"status": "pending"}).json()["items"]
    assert [r["request_id"] for r in listed] == [body["request_id"]]
    assert client.get(f"{REQUESTS}/{body['request_id']}").json() == body


def test_another_staff_member_approves_and_the_money_moves_once(requester, approver):
    account = funded_account(balance=0)
    request_id = deposit(client_for(requester), account, 5_000).json()["request_id"]
    client = client_for(approver)
    response = post(client, f"{REQUESTS}/{request_id}/approve", {"reason": "contract checked"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["status"], body["decided_by"], body["decision_reason"], body["deposit_id"]) == (
        "approved", approver.username, "contract checked", request_id
    )
    assert balance(account) == 5_000
    assert Transfer.objects.get(key=request_id).amount == 5_000
    again = post(client, f"{REQUESTS}/{request_id}/approve", {"reason": "contract checked"})  # a retry
    assert again.status_code == 200 and again.json() == body
    assert balance(account) == 5_000
    assert [(a.action, a.actor) for a in StaffAction.objects.order_by("id")] == [
        ("deposit_requested", requester), ("deposit_approved", approver)
    ]


def test_self_approval_is_403_with_a_stable_code(requester):
    requester.user_permissions.add(Permission.objects.get(codename="approve_deposit"))
    client = client_for(type(requester).objects.get(pk=requester.pk))
    account = funded_account(balance=0)
    request_id = deposit(client, account, 5_000).json()["request_id"]
    for act in ("approve", "reject"):
        assert_error(post(client, f"{REQUESTS}/{request_id}/{act}", {"reason": "mine"}), 403, "self_approval_forbidden")
    assert DepositRequest.objects.get(pk=request_id).status == "pending"
    assert balance(account) == 0


def test_deciding_needs_the_approve_permission_and_a_reason(requester, approver):
    account = funded_account(balance=0)
    request_id = deposit(client_for(requester), account, 5_000).json()["request_id"]
    other_requester = client_for(staff_with("deposit_account", "view_depositrequest"))
    assert_error(post(other_requester, f"{REQUESTS}/{request_id}/approve", {"reason": "r"}), 403, "permission_denied")
    for body in ({}, {"reason": ""}, {"reason": "  "}):
        response = post(client_for(approver), f"{REQUESTS}/{request_id}/approve", body)
        assert "reason" in assert_error(response, 400, "validation_error")["fields"]
    assert balance(account) == 0
    assert_error(post(client_for(approver), f"{REQUESTS}/dreq_nope/approve", {"reason": "r"}), 404, "not_found")


def test_a_rejected_request_moves_nothing_and_cannot_be_approved(requester, approver):
    account = funded_account(balance=0)
    request_id = deposit(client_for(requester), account, 5_000).json()["request_id"]
    client = client_for(approver)
    rejected = post(client, f"{REQUESTS}/{request_id}/reject", {"reason": "no contract"})
    assert rejected.status_code == 200 and rejected.json()["status"] == "rejected"
    body = assert_error(post(client, f"{REQUESTS}/{request_id}/approve", {"reason": "r"}), 409,
                        "deposit_request_not_pending")
    assert body["status"] == "rejected"
    assert balance(account) == 0


def test_an_approval_into_a_closed_account_is_409_and_the_request_stays_pending(requester, approver):
    account = funded_account(balance=0)
    request_id = deposit(client_for(requester), account, 5_000).json()["request_id"]
    account_set_status(account_id=account.id, status=Account.Status.CLOSED)
    assert_error(post(client_for(approver), f"{REQUESTS}/{request_id}/approve", {"reason": "r"}), 409,
                 "deposit_rejected")
    assert DepositRequest.objects.get(pk=request_id).status == "pending"


def test_reading_requests_needs_the_view_permission(requester, approver):
    request_id = deposit(client_for(requester), funded_account(balance=0), 5_000).json()["request_id"]
    no_view = client_for(staff_with("deposit_account"))
    assert_error(no_view.get(REQUESTS), 403, "permission_denied")
    assert_error(no_view.get(f"{REQUESTS}/{request_id}"), 403, "permission_denied")
    assert_error(client_for(approver).get(f"{REQUESTS}/dreq_nope"), 404, "not_found")


def test_the_request_list_filters_by_status_and_account(requester, approver):
    a, b = funded_account(balance=0), funded_account(balance=0)
    client = client_for(requester)
    first = deposit(client, a, 2_000, key="1").json()["request_id"]
    second = deposit(client, b, 3_000, key="2").json()["request_id"]
    post(client_for(approver), f"{REQUESTS}/{first}/approve", {"reason": "ok"})
    ids = lambda **q: [r["request_id"] for r in client.get(REQUESTS, q).json()["items"]]  # noqa: E731
    assert ids() == [second, first]  # newest first
    assert ids(status="pending") == [second] and ids(status="approved") == [first]
    assert ids(account_id=a.id) == [first]
    assert_error(client.get(REQUESTS, {"status": "nope"}), 400, "validation_error")


# --- staff cancels through the API -------------------------------------------------------------


def test_a_staff_cancel_of_someone_elses_payment_needs_a_reason_and_records_it():
    source, target = funded_account(balance=50), funded_account()
    payment = future_payment(source=source, target=target, amount=9)
    support = client_for(staff_with("view_scheduledpayment", "cancel_scheduledpayment"))
    url = f"/api/v1/payments/{payment.pk}"
    assert "reason" in assert_error(support.delete(url), 400, "validation_error")["fields"]
    assert "reason" in assert_error(support.delete(f"{url}?reason=+"), 400, "validation_error")["fields"]
    payment.refresh_from_db()
    assert payment.status == "SCHEDULED"
    response = support.delete(f"{url}?reason=payer+reported+fraud")
    assert response.status_code == 200 and response.json()["status"] == "CANCELLED"
    action = StaffAction.objects.get()
    assert (action.action, action.reason, action.payment_id, action.account_id, action.amount) == (
        "payment_cancel", "payer reported fraud", payment.pk, source.pk, 9
    )


def test_the_payer_cancels_without_a_reason_and_no_staff_action():
    source, target = funded_account(balance=50), funded_account()
    payment = future_payment(source=source, target=target, amount=9)
    response = client_for(source.owner).delete(f"/api/v1/payments/{payment.pk}")
    assert response.status_code == 200 and response.json()["status"] == "CANCELLED"
    assert not StaffAction.objects.exists()
