from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from ledger.models import ISSUANCE_ACCOUNT_ID, Account, Transfer
from ledger.services import account_set_status
from payments.execution import execute_batch
from payments.models import IdempotencyKey, PaymentStatus, ScheduledPayment
from payments.promoter import claim_due
from tests.api import future, post
from tests.conftest import client_for
from tests.factories import PASSWORD, UserFactory, due_payment, funded_account

pytestmark = pytest.mark.django_db


def test_token_exchange(user):
    response = post(client_for(None), "/api/v1/auth/token", {"username": user.username, "password": PASSWORD})
    assert response.status_code == 200
    token = response.json()["token"]
    client = client_for(None)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/v1/accounts").status_code == 200


def test_token_exchange_with_wrong_password(user):
    response = post(client_for(None), "/api/v1/auth/token", {"username": user.username, "password": "nope"})
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_credentials"


def test_anonymous_gets_401_with_error_shape():
    response = client_for(None).get("/api/v1/accounts")
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"


def test_create_and_read_account(api, user):
    response = post(api, "/api/v1/accounts", {"name": "wallet"})
    assert response.status_code == 201
    body = response.json()
    assert body["balance"] == 0 and body["name"] == "wallet" and body["account_id"].startswith("acc_")
    assert body["owner"] == user.username
    assert api.get(f"/api/v1/accounts/{body['account_id']}").json()["account_id"] == body["account_id"]


def test_other_users_account_is_404(api):
    stranger = funded_account()
    response = api.get(f"/api/v1/accounts/{stranger.id}")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_deposit_is_staff_only_and_idempotent(api, staff_api, user):
    account = funded_account(owner=user)
    url = f"/api/v1/accounts/{account.id}/deposits"
    assert post(api, url, {"amount": 10, "reason": "r"}, key="d1").status_code == 403
    first = post(staff_api, url, {"amount": 10, "reason": "r"}, key="d1")
    assert first.status_code == 201
    replay = post(staff_api, url, {"amount": 10, "reason": "r"}, key="d1")
    assert replay.status_code == 201
    assert replay.content == first.content
    assert replay["Idempotent-Replayed"] == "true"
    account.refresh_from_db()
    assert account.balance == 10


def test_a_deposit_answers_its_ledger_key_and_the_balance_right_after(staff_api):
    account = funded_account(balance=7)
    response = post(staff_api, f"/api/v1/accounts/{account.id}/deposits", {"amount": 10, "reason": "r"}, key="d1")
    assert response.status_code == 201
    body = response.json()
    transfer = Transfer.objects.get(key=body["deposit_id"])
    assert body["deposit_id"].startswith("dep_") and transfer.credit_account_id == account.id
    assert list(body) == ["deposit_id", "account_id", "amount", "balance", "created_at"]
    assert (body["account_id"], body["amount"], body["balance"]) == (account.id, 10, 17)
    assert body["created_at"] == transfer.created_at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def test_a_deposit_into_a_system_account_is_409_before_the_key_or_the_body_is_read(staff_api):
    url = f"/api/v1/accounts/{ISSUANCE_ACCOUNT_ID}/deposits"
    for response in (post(staff_api, url, {"amount": 5}), post(staff_api, url, {"amount": 0}, key="k")):
        assert response.status_code == 409
        assert response.json() == {"code": "deposit_rejected", "detail": "Deposits go to user accounts only."}
    assert not Transfer.objects.exists() and not IdempotencyKey.objects.exists()


def test_a_deposit_into_a_closed_account_is_409_and_keeps_no_key(staff_api):
    account = funded_account()
    account_set_status(account_id=account.id, status=Account.Status.CLOSED)
    response = post(staff_api, f"/api/v1/accounts/{account.id}/deposits", {"amount": 5, "reason": "r"}, key="d1")
    assert response.status_code == 409
    assert response.json() == {"code": "deposit_rejected", "detail": "The deposit was rejected: account_closed."}
    assert not Transfer.objects.filter(credit_account_id=account.id).exists()
    assert not IdempotencyKey.objects.exists()


def test_schedule_payment_and_replay(api, user):
    source, target = funded_account(owner=user, balance=100), funded_account()
    body = {"from_account": source.id, "to_account": target.id, "amount": 25, "execute_at": future()}
    first = post(api, "/api/v1/payments", body, key="k-1")
    assert first.status_code == 201, first.content
    created = first.json()
    assert created["status"] == "SCHEDULED" and created["amount"] == 25
    assert created["execute_at"].endswith("Z")
    replay = post(api, "/api/v1/payments", body, key="k-1")
    assert replay.status_code == 201
    assert replay.content == first.content
    assert replay["Idempotent-Replayed"] == "true"
    assert ScheduledPayment.objects.count() == 1
    assert IdempotencyKey.objects.get(key="k-1").response_status == 201


def test_schedule_requires_idempotency_key(api, user):
    source, target = funded_account(owner=user), funded_account()
    body = {"from_account": source.id, "to_account": target.id, "amount": 25, "execute_at": future()}
    response = post(api, "/api/v1/payments", body)
    assert response.status_code == 400
    assert response.json()["code"] == "idempotency_key_required"


def test_same_key_different_body_is_409(api, user):
    source, target = funded_account(owner=user), funded_account()
    body = {"from_account": source.id, "to_account": target.id, "amount": 25, "execute_at": future()}
    assert post(api, "/api/v1/payments", body, key="k").status_code == 201
    response = post(api, "/api/v1/payments", {**body, "amount": 26}, key="k")
    assert response.status_code == 409
    assert response.json()["code"] == "idempotency_key_reused"


@pytest.mark.parametrize("amount", [1.5, "10", 10.0, True, None, 0, -1, 10**12 + 1])
def test_amount_must_be_a_positive_json_integer(api, user, amount):
    source, target = funded_account(owner=user), funded_account()
    body = {"from_account": source.id, "to_account": target.id, "amount": amount, "execute_at": future()}
    response = post(api, "/api/v1/payments", body, key="k")
    assert response.status_code == 400
    assert response.json()["code"] == "validation_error"
    assert "amount" in response.json()["fields"]
    assert not ScheduledPayment.objects.exists()
    assert not IdempotencyKey.objects.exists()


def test_naive_and_past_times_are_rejected(api, user):
    source, target = funded_account(owner=user), funded_account()
    base = {"from_account": source.id, "to_account": target.id, "amount": 1}
    naive = (datetime.now(UTC) + timedelta(hours=1)).replace(tzinfo=None).isoformat()
    for when in (naive, (timezone.now() - timedelta(seconds=5)).isoformat(), "tomorrow"):
        response = post(api, "/api/v1/payments", {**base, "execute_at": when}, key=f"k-{when}")
        assert response.status_code == 400, when
        assert "execute_at" in response.json()["fields"]


def test_get_payment_with_attempts(api, user):
    source, target = funded_account(owner=user, balance=5), funded_account()
    payment = due_payment(source=source, target=target, amount=5)
    body = api.get(f"/api/v1/payments/{payment.id}").json()
    assert body["status"] == "SCHEDULED" and body["attempts"] == [] and body["failure_reason"] is None
    assert set(body) >= {"payment_id", "status", "amount", "from_account", "to_account", "execute_at",
                         "executed_at", "failure_reason", "attempts"}


def test_payment_of_someone_else_is_404_but_staff_with_the_view_permission_see_it(api, staff_api, auditor_user):
    source, target = funded_account(balance=5), funded_account()
    payment = due_payment(source=source, target=target, amount=5)
    assert api.get(f"/api/v1/payments/{payment.id}").status_code == 404
    assert api.delete(f"/api/v1/payments/{payment.id}").status_code == 404
    assert staff_api.get(f"/api/v1/payments/{payment.id}").status_code == 404  # staff, but no payments.view_*
    assert client_for(auditor_user).get(f"/api/v1/payments/{payment.id}").status_code == 200


def test_cancel_then_cancel_again_then_too_late(api, user):
    source, target = funded_account(owner=user, balance=5), funded_account()
    payment = due_payment(source=source, target=target, amount=5)
    first = api.delete(f"/api/v1/payments/{payment.id}")
    assert first.status_code == 200
    assert first.json()["status"] == "CANCELLED"
    assert api.delete(f"/api/v1/payments/{payment.id}").json()["status"] == "CANCELLED"

    claimed = due_payment(source=source, target=target, amount=5)
    claim_due(batch=10, lease_seconds=60)
    response = api.delete(f"/api/v1/payments/{claimed.id}")
    assert response.status_code == 409
    assert response.json() == {
        "code": "payment_not_cancellable",
        "detail": "The payment is EXECUTING and can no longer be cancelled.",
        "status": "EXECUTING",
    }
    assert ScheduledPayment.objects.get(pk=claimed.id).status == PaymentStatus.EXECUTING


def test_cannot_schedule_from_someone_elses_account(api):
    source, target = funded_account(balance=100), funded_account()
    body = {"from_account": source.id, "to_account": target.id, "amount": 1, "execute_at": future()}
    response = post(api, "/api/v1/payments", body, key="k")
    assert response.status_code == 400
    assert "from_account" in response.json()["fields"]


def test_unknown_fields_rejected(api, user):
    response = post(api, "/api/v1/accounts", {"name": "x", "balance": 10**6})
    assert response.status_code == 400
    assert "balance" in response.json()["fields"]
    assert not Account.objects.filter(owner=user).exists()


def test_two_users_may_use_the_same_key():
    alice, bob = UserFactory(), UserFactory()
    for person in (alice, bob):
        source, target = funded_account(owner=person), funded_account()
        body = {"from_account": source.id, "to_account": target.id, "amount": 1, "execute_at": future()}
        response = post(client_for(person), "/api/v1/payments", body, key="shared")
        assert response.status_code == 201
        assert "Idempotent-Replayed" not in response
    assert ScheduledPayment.objects.count() == 2


def _run_due_payments():
    claim = claim_due(batch=100, lease_seconds=60)
    execute_batch(pairs=claim.fresh + claim.reclaimed, worker="test-worker")


@pytest.mark.parametrize(("balance", "final"), [(5, PaymentStatus.EXECUTED), (4, PaymentStatus.FAILED)])
def test_a_finished_payment_cannot_be_cancelled(api, user, balance, final):
    source, target = funded_account(owner=user, balance=balance), funded_account()
    payment = due_payment(source=source, target=target, amount=5)
    _run_due_payments()
    response = api.delete(f"/api/v1/payments/{payment.id}")
    assert response.status_code == 409
    assert response.json()["code"] == "payment_not_cancellable"
    assert response.json()["status"] == final
    assert ScheduledPayment.objects.get(pk=payment.id).status == final


def test_a_failed_payment_carries_its_reason_and_every_payment_its_attempts(api, user):
    source, target = funded_account(owner=user, balance=1), funded_account()
    failed = due_payment(source=source, target=target, amount=5)
    _run_due_payments()
    body = api.get(f"/api/v1/payments/{failed.id}").json()
    assert body["status"] == "FAILED"
    assert body["failure_reason"] == "insufficient_funds"
    assert body["executed_at"] is None
    [attempt] = body["attempts"]
    assert attempt["attempt"] == 1 and attempt["outcome"] == "failed"
    assert attempt["started_at"].endswith("Z") and attempt["finished_at"].endswith("Z")
    listed = api.get("/api/v1/payments", {"status": "FAILED"}).json()["items"]
    assert [p["attempts"] for p in listed] == [body["attempts"]]
