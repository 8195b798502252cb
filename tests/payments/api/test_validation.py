"""POST /payments validation: one test per rule, through the HTTP layer. An invalid
request is a 4xx in the one error shape and leaves no payment and no idempotency key."""

import json
from datetime import UTC, timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from ledger.models import Account
from ledger.services import account_set_status
from payments.models import IdempotencyKey, ScheduledPayment
from tests.api import assert_error, future, payment_body, post
from tests.factories import funded_account

pytestmark = pytest.mark.django_db

URL = "/api/v1/payments"


@pytest.fixture
def accounts(user):
    return funded_account(owner=user, balance=100), funded_account()


def assert_rejected(response, field: str) -> dict:
    body = assert_error(response, 400, "validation_error")
    assert field in body["fields"], body
    assert all(isinstance(m, str) for m in body["fields"][field])
    assert not ScheduledPayment.objects.exists()
    assert not IdempotencyKey.objects.exists()
    return body


def raw_body(source, target, amount_literal: str, execute_at: str | None = None) -> str:
    """The body as text, so JSON literals such as 1e3 reach the server as written."""
    return (
        f'{{"from_account": "{source.id}", "to_account": "{target.id}", '
        f'"amount": {amount_literal}, "execute_at": "{execute_at or future()}"}}'
    )


@pytest.mark.parametrize("literal", ["1.5", '"10"', "10.0", "true", "false", "null", "1e3", "[10]", '{"v": 10}'])
def test_amount_must_be_a_json_integer(api, accounts, literal):
    assert_rejected(post(api, URL, raw_body(*accounts, literal), key="k"), "amount")


@pytest.mark.parametrize("amount", [0, -1, -(10**12)])
def test_amount_must_be_at_least_one(api, accounts, amount):
    assert_rejected(post(api, URL, payment_body(*accounts, amount=amount), key="k"), "amount")


def test_amount_may_not_exceed_the_maximum(api, accounts):
    assert_rejected(post(api, URL, payment_body(*accounts, amount=settings.DELAYPAY_MAX_AMOUNT + 1), key="k"), "amount")


def test_amount_bounds_are_inclusive(api, accounts):
    for i, amount in enumerate((1, settings.DELAYPAY_MAX_AMOUNT)):
        response = post(api, URL, payment_body(*accounts, amount=amount), key=f"k{i}")
        assert response.status_code == 201, response.content
        assert response.json()["amount"] == amount


def test_a_huge_integer_is_a_validation_error_not_a_database_error(api, accounts):
    assert_rejected(post(api, URL, raw_body(*accounts, "9" * 400), key="k"), "amount")


def test_funds_are_not_checked_at_schedule_time(api, user):
    empty, target = funded_account(owner=user, balance=0), funded_account()
    response = post(api, URL, payment_body(empty, target, amount=10**9), key="k")
    assert response.status_code == 201
    assert response.json()["status"] == "SCHEDULED"


@pytest.mark.parametrize(
    "when",
    [
        "2030-01-01T12:00:00",  # naive
        "2030-01-01 12:00:00",
        "2030-01-01T12:00:00.5",
        "2030-01-01T12:00Z",  # no seconds: ISO 8601 allows it, RFC 3339 does not
        "20300101T120000Z",  # ISO 8601 basic format
        "2030-W01-1T12:00:00Z",  # ISO week date
        "2030-01-01",
        "2030-01-01T25:00:00Z",
        "2030-02-30T12:00:00Z",
        "2030-01-01T12:00:60Z",  # leap second: Python cannot represent it
        "2030-01-01T12:00:00+24:00",
        "2030-01-01T12:00:00+0100",
        "tomorrow",
        "",
        "9999-12-31T23:59:59-23:59",  # overflows once converted to UTC
        "0001-01-01T00:00:00+23:59",
    ],
)
def test_execute_at_must_be_rfc3339_with_an_offset(api, accounts, when):
    body = assert_rejected(post(api, URL, payment_body(*accounts, execute_at=when), key="k"), "execute_at")
    if when.startswith("2030-01-01T12:00:00") and len(when) <= 21:
        assert "offset" in body["fields"]["execute_at"][0]


@pytest.mark.parametrize("value", [1893456000, None, True, ["2030-01-01T12:00:00Z"]])
def test_execute_at_must_be_a_string(api, accounts, value):
    assert_rejected(post(api, URL, payment_body(*accounts, execute_at=value), key="k"), "execute_at")


def test_execute_at_must_be_after_the_database_clock(api, accounts):
    assert_rejected(post(api, URL, payment_body(*accounts, execute_at=future(-1)), key="k"), "execute_at")


def test_execute_at_may_be_at_most_365_days_ahead(api, accounts):
    days = settings.DELAYPAY_MAX_SCHEDULE_DAYS
    too_far = future(timedelta(days=days, minutes=1).total_seconds())
    assert_rejected(post(api, URL, payment_body(*accounts, execute_at=too_far), key="k"), "execute_at")
    almost = future(timedelta(days=days, minutes=-1).total_seconds())
    assert post(api, URL, payment_body(*accounts, execute_at=almost), key="k2").status_code == 201


def test_execute_at_with_an_offset_is_stored_and_returned_in_utc_with_z(api, accounts):
    local = (timezone.now() + timedelta(days=2)).astimezone(timezone.get_fixed_timezone(-330))
    body = post(api, URL, payment_body(*accounts, execute_at=local.isoformat()), key="k").json()
    assert body["execute_at"].endswith("Z")
    assert body["execute_at"] == local.astimezone(UTC).isoformat().replace("+00:00", "Z")
    assert ScheduledPayment.objects.get().execute_at == local


def test_fractions_beyond_microseconds_are_truncated(api, accounts):
    when = (timezone.now() + timedelta(days=1)).replace(microsecond=123456).strftime("%Y-%m-%dT%H:%M:%S")
    body = post(api, URL, payment_body(*accounts, execute_at=f"{when}.123456789Z"), key="k").json()
    assert body["execute_at"] == f"{when}.123456Z"


def test_from_and_to_must_differ(api, user, accounts):
    source = accounts[0]
    assert_rejected(post(api, URL, payment_body(source, source), key="k"), "to_account")


def test_from_account_must_be_yours(api, accounts):
    theirs, target = funded_account(balance=100), accounts[1]
    assert_rejected(post(api, URL, payment_body(theirs, target), key="k"), "from_account")


def test_from_account_must_exist(api, accounts):
    body = payment_body(*accounts, from_account="acc_00000000000000000000000000")
    assert_rejected(post(api, URL, body, key="k"), "from_account")


@pytest.mark.parametrize("state", [Account.Status.FROZEN, Account.Status.CLOSED])
def test_from_account_must_be_active(api, accounts, state):
    account_set_status(account_id=accounts[0].id, status=state)
    assert_rejected(post(api, URL, payment_body(*accounts), key="k"), "from_account")


def test_to_account_must_exist(api, accounts):
    body = payment_body(*accounts, to_account="acc_00000000000000000000000000")
    assert_rejected(post(api, URL, body, key="k"), "to_account")


def test_to_account_may_not_be_closed(api, accounts):
    account_set_status(account_id=accounts[1].id, status=Account.Status.CLOSED)
    assert_rejected(post(api, URL, payment_body(*accounts), key="k"), "to_account")


def test_a_frozen_to_account_may_still_receive(api, accounts):
    account_set_status(account_id=accounts[1].id, status=Account.Status.FROZEN)
    assert post(api, URL, payment_body(*accounts), key="k").status_code == 201


@pytest.mark.parametrize("field", ["from_account", "to_account", "amount", "execute_at"])
def test_every_field_is_required(api, accounts, field):
    body = payment_body(*accounts)
    del body[field]
    assert_rejected(post(api, URL, body, key="k"), field)


@pytest.mark.parametrize("extra", ["status", "payer", "currency", "Amount"])
def test_unknown_fields_are_rejected(api, accounts, extra):
    assert_rejected(post(api, URL, {**payment_body(*accounts), extra: "x"}, key="k"), extra)


@pytest.mark.parametrize("field", ["from_account", "to_account"])
@pytest.mark.parametrize("value", [123, None, True, "", "x" * 41])
def test_account_ids_must_be_short_strings(api, accounts, field, value):
    assert_rejected(post(api, URL, payment_body(*accounts, **{field: value}), key="k"), field)


@pytest.mark.parametrize("body", ["[]", '"x"', "42", "null"])
def test_body_must_be_a_json_object(api, body):
    assert_rejected(post(api, URL, body, key="k"), "non_field_errors")


@pytest.mark.parametrize(
    "body",
    [
        "{",
        "{'amount': 1}",
        '{"amount": NaN}',
        '{"amount": Infinity}',
        '{"amount": 1, "amount": 1000}',  # duplicate keys: ambiguous, refused
        '{"from_account": "\\ud800"}',  # a lone surrogate cannot be stored as UTF-8
        "[" * 5000 + "]" * 5000,  # deeper than the parser's recursion limit
        '{"amount": ' + "9" * 5000 + "}",  # more digits than Python parses
    ],
)
def test_malformed_json_is_a_parse_error(api, body):
    assert_error(post(api, URL, body, key="k"), 400, "parse_error")
    assert not IdempotencyKey.objects.exists()


def test_body_over_64_kib_is_413(api, accounts):
    body = json.dumps({**payment_body(*accounts), "padding": "x" * (64 * 1024)})
    assert_error(post(api, URL, body, key="k"), 413, "payload_too_large")
    assert not ScheduledPayment.objects.exists()


def test_body_of_exactly_64_kib_is_parsed(api, accounts):
    body = json.dumps(payment_body(*accounts))
    body = body[:-1] + " " * (64 * 1024 - len(body)) + "}"
    assert len(body.encode()) == 64 * 1024
    assert post(api, URL, body, key="k").status_code == 201


def test_a_body_longer_than_its_content_length_claims_is_still_bounded(api, accounts):
    body = json.dumps({**payment_body(*accounts), "padding": "x" * (70 * 1024)})
    # Django limits the stream to Content-Length; a lie makes the JSON truncated, not big.
    response = api.generic("POST", URL, body, content_type="application/json", CONTENT_LENGTH="100",
                           HTTP_IDEMPOTENCY_KEY="k")
    assert_error(response, 400, "parse_error")


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/xml"],
)
def test_non_json_content_types_are_415(api, accounts, content_type):
    response = api.generic("POST", URL, json.dumps(payment_body(*accounts)), content_type=content_type,
                           HTTP_IDEMPOTENCY_KEY="k")
    assert_error(response, 415, "unsupported_media_type")
    assert not ScheduledPayment.objects.exists()


def test_json_with_a_charset_is_accepted(api, accounts):
    response = api.generic("POST", URL, json.dumps(payment_body(*accounts)).encode("utf-16"),
                           content_type="application/json; charset=utf-16", HTTP_IDEMPOTENCY_KEY="k")
    assert response.status_code == 201, response.content


def test_a_decompressing_charset_is_refused(api, accounts):
    response = api.generic("POST", URL, b"x", content_type="application/json; charset=bz2_codec",
                           HTTP_IDEMPOTENCY_KEY="k")
    assert_error(response, 400, "parse_error")


def test_account_name_is_validated_too(api, user):
    for body in ({"name": ""}, {"name": "x" * 101}, {"name": 5}, {"name": "a\x00b"}, {}):
        assert_error(post(api, "/api/v1/accounts", body), 400, "validation_error")
    assert not Account.objects.filter(owner=user).exists()


@pytest.mark.parametrize("amount", [0, 1.5, "10", None, settings.DELAYPAY_MAX_AMOUNT + 1])
def test_deposit_amount_is_validated(staff_api, amount):
    account = funded_account()
    response = post(staff_api, f"/api/v1/accounts/{account.id}/deposits", {"amount": amount, "reason": "r"}, key="k")
    body = assert_error(response, 400, "validation_error")
    assert "amount" in body["fields"]
    account.refresh_from_db()
    assert account.balance == 0
    assert not IdempotencyKey.objects.exists()
