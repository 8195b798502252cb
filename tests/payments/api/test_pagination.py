"""List endpoints: ``{"items": [...], "next_cursor": ...}``, newest first, limit 1..100,
opaque cursors that stay correct while rows are inserted."""

import base64
import json
from datetime import timedelta

import pytest
from django.utils import timezone

from common.ids import new_id
from ledger.services import ledger_deposit
from payments.models import PaymentStatus, ScheduledPayment
from tests.api import assert_error
from tests.conftest import client_for
from tests.factories import funded_account

pytestmark = pytest.mark.django_db

T0 = timezone.now().replace(microsecond=0) + timedelta(days=30)


def make_payments(source, target, execute_ats, **fields):
    return [
        ScheduledPayment.objects.create(
            payer=source.owner, from_account=source, to_account=target, amount=1, execute_at=at, **fields
        )
        for at in execute_ats
    ]


def walk(client, url, limit, between_pages=None):
    """Every page of ``url``; ``between_pages(n)`` runs after page n is read."""
    items, cursor, pages = [], None, 0
    while pages < 100:  # a cursor that does not advance must fail the test, not hang it
        params = {"limit": limit} | ({"cursor": cursor} if cursor else {})
        response = client.get(url, params)
        assert response.status_code == 200, response.content
        body = response.json()
        assert set(body) == {"items", "next_cursor"}
        items += body["items"]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            return items, pages
        if between_pages:
            between_pages(pages)
    raise AssertionError("the cursor never reached the end")


@pytest.fixture
def accounts(user):
    return funded_account(owner=user, balance=100), funded_account()


def test_payments_are_listed_newest_due_first_with_a_default_page_of_20(api, accounts):
    made = make_payments(*accounts, [T0 + timedelta(minutes=i) for i in range(25)])
    first = api.get("/api/v1/payments").json()
    assert [p["payment_id"] for p in first["items"]] == [p.id for p in reversed(made)][:20]
    assert isinstance(first["next_cursor"], str) and "/" not in first["next_cursor"]  # a token, not a URL
    second = api.get("/api/v1/payments", {"cursor": first["next_cursor"]}).json()
    assert [p["payment_id"] for p in second["items"]] == [p.id for p in reversed(made)][20:]
    assert second["next_cursor"] is None


def test_an_empty_list_has_no_cursor(api):
    assert api.get("/api/v1/payments").json() == {"items": [], "next_cursor": None}


def test_ties_on_execute_at_are_ordered_by_id_and_walked_exactly_once(api, accounts):
    made = make_payments(*accounts, [T0] * 7 + [T0 - timedelta(seconds=1)] * 3)
    items, pages = walk(api, "/api/v1/payments", limit=3)
    expected = sorted(made, key=lambda p: (p.execute_at, p.id), reverse=True)
    assert [i["payment_id"] for i in items] == [p.id for p in expected]
    assert pages == 4


def test_a_walk_returns_every_existing_row_once_while_rows_are_inserted(api, accounts):
    """Rows inserted mid-walk (ties at the cursor, newer and older due times) never make a
    row that existed all along repeat or vanish; DRF's offset cursor would repeat one."""
    source, target = accounts
    existing = make_payments(source, target, [T0] * 6 + [T0 - timedelta(minutes=1)] * 4)

    def insert(page):
        # A tie with the cursor's execute_at (its id sorts before: it is newer), plus a
        # payment due later (before the cursor) and one due earlier (after it).
        make_payments(source, target, [T0, T0 + timedelta(hours=1), T0 - timedelta(hours=1)])

    items, _ = walk(api, "/api/v1/payments", limit=4, between_pages=insert)
    seen = [i["payment_id"] for i in items]
    assert len(seen) == len(set(seen)), "a row was returned twice"
    existing_ids = [p.id for p in sorted(existing, key=lambda p: (p.execute_at, p.id), reverse=True)]
    assert [i for i in seen if i in existing_ids] == existing_ids


@pytest.mark.parametrize("status", list(PaymentStatus))
def test_status_filters_the_list(api, accounts, status):
    make_payments(*accounts, [T0])
    cancelled = make_payments(*accounts, [T0], status=PaymentStatus.CANCELLED, cancelled_at=timezone.now())
    items = api.get("/api/v1/payments", {"status": status}).json()["items"]
    assert all(i["status"] == status for i in items)
    assert len(items) == {PaymentStatus.SCHEDULED: 1, PaymentStatus.CANCELLED: 1}.get(status, 0)
    if status == PaymentStatus.CANCELLED:
        assert items[0]["payment_id"] == cancelled[0].id


@pytest.mark.parametrize("status", ["scheduled", "NOPE", "", "SCHEDULED,FAILED"])
def test_an_unknown_status_is_400(api, status):
    body = assert_error(api.get("/api/v1/payments", {"status": status}), 400, "validation_error")
    assert "status" in body["fields"]


@pytest.mark.parametrize("limit", ["0", "101", "-1", "abc", "1.0", "", " 5", "1e1", "\u0665"])
@pytest.mark.parametrize("url", ["/api/v1/payments", "/api/v1/accounts"])
def test_limit_must_be_1_to_100(api, url, limit):
    body = assert_error(api.get(url, {"limit": limit}), 400, "validation_error")
    assert "limit" in body["fields"]


def test_limit_bounds_are_inclusive(api, accounts):
    make_payments(*accounts, [T0 + timedelta(seconds=i) for i in range(101)])
    assert len(api.get("/api/v1/payments", {"limit": "100"}).json()["items"]) == 100
    one = api.get("/api/v1/payments", {"limit": "1"}).json()
    assert len(one["items"]) == 1 and one["next_cursor"]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    "cursor",
    [
        "garbage!",
        _b64("nonsense"),
        _b64("p=" + json.dumps(["2030-01-01T00:00:00Z"])),  # wrong arity
        _b64("p=" + json.dumps(["2030-01-01T00:00:00", "pay_X"])),  # naive time
        _b64("p=" + json.dumps(["yesterday", "pay_X"])),
        _b64("p=" + json.dumps([1, 2])),
        _b64("p=" + json.dumps({"a": 1})),
        _b64("p=" + "[" * 3000),
        _b64("p=" + json.dumps(["2030-01-01T00:00:00Z", "x" * 41])),
        _b64("o=5&p=" + json.dumps(["2030-01-01T00:00:00Z", "pay_X"])),  # offsets are not ours
        _b64("r=1&p=" + json.dumps(["2030-01-01T00:00:00Z", "pay_X"])),  # nor is reverse
        "A" * 600,
        "\u00e9",
    ],
)
def test_an_invalid_cursor_is_400(api, cursor):
    body = assert_error(api.get("/api/v1/payments", {"cursor": cursor}), 400, "validation_error")
    assert "cursor" in body["fields"]


def test_unknown_and_repeated_query_parameters_are_400(api):
    body = assert_error(api.get("/api/v1/payments", {"stauts": "FAILED"}), 400, "validation_error")
    assert "stauts" in body["fields"]
    body = assert_error(api.get("/api/v1/payments?limit=1&limit=2"), 400, "validation_error")
    assert "limit" in body["fields"]


def test_account_payments_list_one_accounts_payments(api, auditor_user, user, accounts):
    source, target = accounts
    other_source = funded_account(owner=user, balance=5)
    mine = make_payments(source, target, [T0, T0 + timedelta(minutes=1)])
    make_payments(other_source, target, [T0])
    incoming = make_payments(target, source, [T0 + timedelta(minutes=2)])  # paid by someone else
    url = f"/api/v1/accounts/{source.id}/payments"
    assert [i["payment_id"] for i in api.get(url).json()["items"]] == [mine[1].id, mine[0].id]
    # Staff who may read every payment see both directions.
    auditor = client_for(auditor_user)
    assert [i["payment_id"] for i in auditor.get(url).json()["items"]] == [incoming[0].id, mine[1].id, mine[0].id]
    assert api.get(url, {"status": "FAILED"}).json()["items"] == []
    items, pages = walk(api, url, limit=1)
    assert [i["payment_id"] for i in items] == [mine[1].id, mine[0].id] and pages == 2


def test_transfers_are_the_ledger_history_newest_first(api, user, accounts):
    source = accounts[0]
    for amount in (1, 2, 3):
        ledger_deposit(key=new_id("dep"), account_id=source.id, amount=amount)
    items, pages = walk(api, f"/api/v1/accounts/{source.id}/transfers", limit=2)
    assert [t["amount"] for t in items] == [3, 2, 1, 100]
    assert pages == 2
    assert all(t["credit_account"] == source.id and t["key"].startswith("dep_") for t in items)
    assert items[0]["created_at"].endswith("Z")


def test_accounts_are_paginated_too(api, user):
    made = [funded_account(owner=user) for _ in range(5)]
    items, pages = walk(api, "/api/v1/accounts", limit=2)
    assert sorted(a["account_id"] for a in items) == sorted(a.id for a in made)
    assert pages == 3
    created = [a["created_at"] for a in items]
    assert created == sorted(created, reverse=True)
