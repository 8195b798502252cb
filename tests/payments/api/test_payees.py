"""Payees and payouts through the API: a payee is its creator's; a payout is a payment
with to_payee instead of to_account (exactly one of them)."""

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.db import connection

from payments.models import Payee, Payout, ScheduledPayment
from tests.api import assert_error, future, post
from tests.conftest import client_for
from tests.factories import UserFactory, claim_payouts, due_payout, funded_account, payee_for

pytestmark = pytest.mark.django_db


def payee(api, destination="acct_bob", key="y1"):
    response = post(api, "/api/v1/payees", {"name": "Bob", "rail": "sandbox", "destination": destination}, key=key)
    assert response.status_code == 201, response.json()
    return response.json()


def test_a_payee_is_created_listed_read_and_deleted_by_its_owner_only(api, user):
    body = payee(api)
    assert body["payee_id"].startswith("pye_") and body["rail"] == "sandbox" and body["destination"] == "acct_bob"
    assert [p["payee_id"] for p in api.get("/api/v1/payees").json()["items"]] == [body["payee_id"]]
    assert api.get(f"/api/v1/payees/{body['payee_id']}").status_code == 200
    stranger = client_for(UserFactory())
    assert stranger.get("/api/v1/payees").json()["items"] == []
    assert_error(stranger.get(f"/api/v1/payees/{body['payee_id']}"), 404, "not_found")
    assert_error(stranger.delete(f"/api/v1/payees/{body['payee_id']}"), 404, "not_found")
    assert api.delete(f"/api/v1/payees/{body['payee_id']}").status_code == 204
    assert_error(api.get(f"/api/v1/payees/{body['payee_id']}"), 404, "not_found")
    assert api.get("/api/v1/payees").json()["items"] == []


def test_staff_who_may_read_a_payee_may_not_delete_it_403_and_anyone_else_404(api, user):
    body = payee(api)
    reader = UserFactory(is_staff=True)
    reader.user_permissions.add(Permission.objects.get(codename="view_payee", content_type__app_label="payments"))
    staff = client_for(reader)
    assert staff.get(f"/api/v1/payees/{body['payee_id']}").status_code == 200
    refused = assert_error(staff.delete(f"/api/v1/payees/{body['payee_id']}"), 403, "permission_denied")
    assert "only its owner" in refused["detail"]
    assert_error(client_for(UserFactory(is_staff=True)).delete(f"/api/v1/payees/{body['payee_id']}"), 404, "not_found")
    assert Payee.objects.get(pk=body["payee_id"]).deleted_at is None
    assert api.delete(f"/api/v1/payees/{body['payee_id']}").status_code == 204
    # Deleted, it is no one's to read: 404 for the reader too.
    assert_error(staff.delete(f"/api/v1/payees/{body['payee_id']}"), 404, "not_found")


@pytest.mark.parametrize(("field", "value"), [("rail", "swift"), ("destination", "has space"),
                                               ("destination", "x" * 65), ("name", "")])
def test_bad_payees_are_400(api, field, value):
    body = {"name": "Bob", "rail": "sandbox", "destination": "acct_bob", field: value}
    response = post(api, "/api/v1/payees", body, key="bad")
    assert_error(response, 400, "validation_error")
    assert field in response.json()["fields"]


def test_a_payout_is_scheduled_with_to_payee_and_shows_it(api, user):
    source = funded_account(owner=user, balance=100)
    p = payee(api)
    response = post(api, "/api/v1/payments", {"from_account": source.id, "to_payee": p["payee_id"], "amount": 7,
                                              "execute_at": future()}, key="po")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["to_payee"], body["to_account"], body["payout"]) == (p["payee_id"], None, None)
    assert ScheduledPayment.objects.get(pk=body["payment_id"]).rail == "sandbox"
    # A pending payout keeps its payee; cancelled, it may go.
    assert_error(api.delete(f"/api/v1/payees/{p['payee_id']}"), 409, "payee_in_use")
    assert api.delete(f"/api/v1/payments/{body['payment_id']}").status_code == 200
    assert api.delete(f"/api/v1/payees/{p['payee_id']}").status_code == 204


def test_a_payout_shows_its_record_at_the_rail(api, user):
    source = funded_account(owner=user, balance=100)
    p = payee(api)
    body = post(api, "/api/v1/payments", {"from_account": source.id, "to_payee": p["payee_id"], "amount": 7,
                                          "execute_at": future()}, key="po").json()
    Payout.objects.create(payment_id=body["payment_id"], rail="sandbox", destination="acct_bob", amount=7)
    payout = api.get(f"/api/v1/payments/{body['payment_id']}").json()["payout"]
    assert payout["state"] == "pending" and payout["reference"] == "" and payout["destination"] == "acct_bob"
    # Its funds are reserved at the rail: the creator may not cancel it.
    assert_error(api.delete(f"/api/v1/payments/{body['payment_id']}"), 409, "payout_outcome_unknown")


def test_to_account_and_to_payee_are_exclusive_and_the_payee_must_be_yours(api, user):
    source, target = funded_account(owner=user, balance=100), funded_account()
    p = payee(api)
    base = {"from_account": source.id, "amount": 7, "execute_at": future()}
    both = post(api, "/api/v1/payments", {**base, "to_account": target.id, "to_payee": p["payee_id"]}, key="a")
    assert_error(both, 400, "validation_error")
    assert "to_payee" in both.json()["fields"]
    neither = post(api, "/api/v1/payments", base, key="b")
    assert "to_account" in neither.json()["fields"]
    theirs = payee(client_for(UserFactory()), key="t")
    response = post(api, "/api/v1/payments", {**base, "to_payee": theirs["payee_id"]}, key="c")
    assert_error(response, 400, "validation_error")
    assert "to_payee" in response.json()["fields"]
    assert not ScheduledPayment.objects.exists()


def test_a_recurring_payout(api, user):
    source = funded_account(owner=user, balance=100)
    p = payee(api)
    response = post(api, "/api/v1/recurring-payments", {"from_account": source.id, "to_payee": p["payee_id"],
                                                         "amount": 3, "start_at": future(), "interval": "P1D"},
                    key="rec")
    assert response.status_code == 201, response.json()
    assert response.json()["to_payee"] == p["payee_id"] and response.json()["to_account"] is None
    occurrence = ScheduledPayment.objects.get(recurring_id=response.json()["recurring_id"])
    assert (occurrence.to_payee_id, occurrence.rail, occurrence.to_account_id) == (p["payee_id"], "sandbox", None)
    assert_error(api.delete(f"/api/v1/payees/{p['payee_id']}"), 409, "payee_in_use")


def documented_cancel_refusals() -> dict[str, str]:
    """What docs/reference/payouts.md says a cancel of a payout answers, from its
    **Cancel** bullet: for each status a sentence names next to a 409, that code."""
    page = (Path(settings.BASE_DIR) / "docs/reference/payouts.md").read_text()
    bullet = " ".join(re.search(r"^- \*\*Cancel\*\*(.*?)(?=^- |^#|\Z)", page, re.M | re.S)[1].split())
    refusals = {}
    for sentence in re.split(r"(?<=\.) ", bullet):
        for code in re.findall(r"409 `(\w+)`", sentence):
            for status in re.findall(r"\b(SCHEDULED|EXECUTING|NEEDS_REVIEW)\b", sentence):
                refusals[status] = code
    return refusals


def put_in_status(payment_id: str, status: str) -> None:
    with connection.cursor() as cur:  # set-up only: replica mode fires no trigger
        cur.execute("SET session_replication_role = replica")
        cur.execute(
            "UPDATE payments_scheduledpayment SET status = %s, review_reason = CASE WHEN %s = 'NEEDS_REVIEW' "
            "THEN 'outcome_unknown' ELSE '' END WHERE id = %s",
            [status, status, payment_id],
        )
        cur.execute("SET session_replication_role = origin")


@pytest.mark.parametrize(
    ("status", "reserved"),
    [("EXECUTING", False), ("EXECUTING", True), ("NEEDS_REVIEW", True), ("SCHEDULED", True)],
)
def test_a_refused_payout_cancel_answers_the_code_the_payouts_page_names(api, user, status, reserved):
    """Issue 33: the page named payout_outcome_unknown for an EXECUTING payout, which the
    API refuses as any claimed payment (payment_not_cancellable)."""
    documented = documented_cancel_refusals()
    assert documented == {
        "EXECUTING": "payment_not_cancellable", "NEEDS_REVIEW": "payout_outcome_unknown",
        "SCHEDULED": "payout_outcome_unknown",
    }
    payout = due_payout(source=funded_account(owner=user, balance=100), payee=payee_for(user), amount=7)
    if status == "EXECUTING":
        assert [pair[0] for pair in claim_payouts()] == [payout.id]
    else:
        put_in_status(payout.id, status)  # parked (NEEDS_REVIEW), or re-driven after it (SCHEDULED)
    if reserved:
        Payout.objects.create(payment_id=payout.id, rail="sandbox", destination="acct_bob", amount=7)
    body = assert_error(api.delete(f"/api/v1/payments/{payout.id}"), 409, documented[status])
    assert body["status"] == status
    assert ScheduledPayment.objects.get(pk=payout.pk).status == status
