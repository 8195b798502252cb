"""Payments into system accounts and the per-user limits, as a client sees them: the
status, the code, the numbers in the body, and nothing created or stored."""

from datetime import UTC, datetime, time, timedelta

import pytest
from django.utils import timezone

from api.errors import ERROR_CODES
from ledger.models import ISSUANCE_ACCOUNT_ID
from payments.models import IdempotencyKey, RecurringPayment, ScheduledPayment
from tests.api import assert_error, patch, payment_body, post
from tests.conftest import client_for
from tests.factories import funded_account

pytestmark = pytest.mark.django_db

PAYMENTS = "/api/v1/payments"
RECURRING = "/api/v1/recurring-payments"
NOON = datetime.combine((timezone.now() + timedelta(days=3)).date(), time(12), tzinfo=UTC)


@pytest.fixture
def accounts(user):
    return funded_account(owner=user, balance=100), funded_account()


def at(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def recurring_body(source, target, **overrides) -> dict:
    body = {"from_account": source.id, "to_account": target.id, "amount": 10, "start_at": at(NOON), "interval": "P1D"}
    return {**body, **overrides}


def test_a_payment_into_the_issuance_account_is_400_system_account_and_stores_nothing(api, accounts):
    response = post(api, PAYMENTS, payment_body(*accounts, to_account=ISSUANCE_ACCOUNT_ID), key="k")
    body = assert_error(response, 400, "system_account")
    assert set(body) == {"code", "detail"}
    assert not ScheduledPayment.objects.exists()
    assert not IdempotencyKey.objects.exists()  # fix it and retry with the same key


def test_a_recurring_payment_into_the_issuance_account_is_400_system_account(api, accounts):
    response = post(api, RECURRING, recurring_body(*accounts, to_account=ISSUANCE_ACCOUNT_ID), key="k")
    assert_error(response, 400, "system_account")
    assert not RecurringPayment.objects.exists()


def test_the_pending_payments_limit_is_409_with_the_numbers(api, accounts, settings):
    settings.DELAYPAY_MAX_PENDING_PAYMENTS_PER_USER = 2
    for key in ("k1", "k2"):
        assert post(api, PAYMENTS, payment_body(*accounts), key=key).status_code == 201
    response = post(api, PAYMENTS, payment_body(*accounts), key="k3")
    body = assert_error(response, 409, "limit_pending_payments")
    assert (body["limit"], body["usage"]) == (2, 2)
    assert "DELAYPAY_MAX_PENDING_PAYMENTS_PER_USER" in body["detail"]
    assert ScheduledPayment.objects.count() == 2
    assert not IdempotencyKey.objects.filter(key="k3").exists()


def test_the_active_series_limit_is_409_with_the_numbers(api, accounts, settings):
    settings.DELAYPAY_MAX_ACTIVE_SERIES_PER_USER = 1
    assert post(api, RECURRING, recurring_body(*accounts), key="r1").status_code == 201
    body = assert_error(post(api, RECURRING, recurring_body(*accounts), key="r2"), 409, "limit_active_series")
    assert (body["limit"], body["usage"]) == (1, 1)
    assert RecurringPayment.objects.count() == 1


def test_the_daily_outflow_limit_is_409_on_create_and_on_patch(api, accounts, settings):
    settings.DELAYPAY_MAX_DAILY_OUTFLOW_PER_USER = 100
    first = post(api, PAYMENTS, payment_body(*accounts, amount=60, execute_at=at(NOON)), key="k1").json()
    post(api, PAYMENTS, payment_body(*accounts, amount=40, execute_at=at(NOON + timedelta(hours=1))), key="k2")
    response = post(api, PAYMENTS, payment_body(*accounts, amount=1, execute_at=at(NOON)), key="k3")
    body = assert_error(response, 409, "limit_daily_outflow")
    assert {k: body[k] for k in ("limit", "usage", "requested", "day")} == {
        "limit": 100, "usage": 100, "requested": 1, "day": NOON.date().isoformat()
    }
    response = patch(api, f"{PAYMENTS}/{first['payment_id']}", {"amount": 61})
    body = assert_error(response, 409, "limit_daily_outflow")
    assert (body["usage"], body["requested"]) == (40, 61)
    assert api.get(f"{PAYMENTS}/{first['payment_id']}").json()["amount"] == 60
    assert patch(api, f"{PAYMENTS}/{first['payment_id']}", {"amount": 59}).status_code == 200


def test_the_daily_outflow_limit_is_409_on_a_recurring_create_and_patch(api, accounts, settings):
    settings.DELAYPAY_MAX_DAILY_OUTFLOW_PER_USER = 100
    rec = post(api, RECURRING, recurring_body(*accounts, amount=50), key="r1").json()
    body = assert_error(post(api, RECURRING, recurring_body(*accounts, amount=51), key="r2"), 409,
                        "limit_daily_outflow")
    assert (body["limit"], body["usage"], body["requested"]) == (100, 50, 51)
    response = patch(api, f"{RECURRING}/{rec['recurring_id']}", {"interval": "PT6H"})  # four a day: 200
    body = assert_error(response, 409, "limit_daily_outflow")
    assert (body["usage"], body["requested"]) == (0, 200)
    assert api.get(f"{RECURRING}/{rec['recurring_id']}").json()["interval"] == "P1D"


def test_the_schema_publishes_the_codes_and_the_numbers():
    schema = client_for(None).get("/api/v1/schema", {"format": "json"}).json()
    error = schema["components"]["schemas"]["Error"]["properties"]
    codes = {"system_account", "limit_pending_payments", "limit_active_series", "limit_daily_outflow"}
    assert codes <= set(ERROR_CODES)  # the Error schema's code enum
    assert {"limit", "usage", "requested", "day"} <= set(error)
    create = schema["paths"]["/api/v1/payments"]["post"]["responses"]
    assert "limit_pending_payments" in create["409"]["description"]
    assert "system_account" in create["400"]["description"]
