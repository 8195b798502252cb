"""schemathesis against the served /api/v1/schema: generated requests (valid and
invalid) for every operation, through the real Django WSGI app and PostgreSQL. No
response may be a server error or disagree with the schema (status, headers, content
type, body)."""

import re
from datetime import timedelta

import pytest
import schemathesis
from django.conf import settings
from django.contrib.auth.models import Permission
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.utils import timezone
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from knox.models import AuthToken
from schemathesis.specs.openapi.checks import positive_data_acceptance, use_after_free

from common.ids import new_id
from ledger.models import Account
from ledger.services import ledger_deposit
from payments.models import RecurringPayment, ScheduledPayment
from tests.factories import UserFactory
from webhooks.models import Delivery, DeliveryStatus, Endpoint, Event

pytestmark = pytest.mark.django_db

# Known ids, so that generated requests also reach existing resources, not only 404s.
OWN_ACCOUNT = "acc_schemathesis_own"
TARGET_ACCOUNT = "acc_schemathesis_target"
PAYMENT = "pay_schemathesis_scheduled"
RECURRING = "rec_schemathesis_active"
ENDPOINT = "whe_schemathesis_own"
DELIVERY = 424242


def _schema_valid_id(value) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_]{1,64}", value) is not None


def _reach_known_resources(context, path_parameters):
    """Sometimes swap a generated id for a known one. Only valid ids are swapped: a
    deliberately invalid (negative) case must stay invalid."""
    if not isinstance(path_parameters, dict) or not all(map(_schema_valid_id, path_parameters.values())):
        return st.just(path_parameters)
    options = [path_parameters]
    if "account_id" in path_parameters:
        options += [{**path_parameters, "account_id": OWN_ACCOUNT}, {**path_parameters, "account_id": TARGET_ACCOUNT}]
    if "payment_id" in path_parameters:
        options.append({**path_parameters, "payment_id": PAYMENT})
    if "recurring_id" in path_parameters:
        options.append({**path_parameters, "recurring_id": RECURRING})
    if "endpoint_id" in path_parameters:
        known = {**path_parameters, "endpoint_id": ENDPOINT}
        options.append(known)
        if "delivery_id" in path_parameters:
            options.append({**known, "delivery_id": str(DELIVERY)})
    return st.sampled_from(options)


# The creates whose schema-valid bodies are sometimes made plausible: their required
# fields, and the time field to move to tomorrow.
CREATES = {
    "/api/v1/payments": ({"from_account", "to_account", "amount", "execute_at"}, "execute_at"),
    "/api/v1/recurring-payments": ({"from_account", "to_account", "amount", "start_at"}, "start_at"),
}


def _schedule_from_own_account(context, body):
    """Sometimes make a schema-valid create body plausible too (own account, a near
    future time; for a recurring payment a daily rule), so that creates and replays are
    exercised, not only rejections."""
    operation = context.operation
    if operation.method.upper() != "POST" or operation.path not in CREATES:
        return st.just(body)
    required, when = CREATES[operation.path]
    schema_valid = (
        isinstance(body, dict)
        and required <= set(body)
        and all(isinstance(body[k], str) and 1 <= len(body[k]) <= 40 for k in ("from_account", "to_account"))
        and type(body["amount"]) is int
        and 1 <= body["amount"] <= settings.DELAYPAY_MAX_AMOUNT
        and isinstance(body[when], str)
    )
    if not schema_valid:
        return st.just(body)
    plausible = {
        **body,
        "from_account": OWN_ACCOUNT,
        "to_account": TARGET_ACCOUNT,
        when: (timezone.now() + timedelta(days=1)).isoformat(),
    }
    if operation.path == "/api/v1/recurring-payments":
        plausible = {k: v for k, v in plausible.items() if k not in ("cron", "end_at", "count")} | {
            "interval": "P1D"
        }
    return st.sampled_from([body, plausible])


def in_test_transaction(application):
    """The WSGI app, minus Django's end-of-request connection cleanup: the test's open
    transaction (and so the database connection) must survive each request, as Django's
    own test client arranges."""

    def app(environ, start_response):
        for signal in (request_started, request_finished):
            signal.disconnect(close_old_connections)
        try:
            response = application(environ, start_response)
            body = b"".join(response)
            response.close()
        finally:
            for signal in (request_started, request_finished):
                signal.connect(close_old_connections)
        return [body]

    return app


# Loaded at collection (generating the schema needs no database). schemathesis's lazy
# from_fixture loader does not work with pytest 9 (it sets Function._nodeid).
schema = schemathesis.openapi.from_wsgi("/api/v1/schema?format=json", in_test_transaction(get_wsgi_application()))
schema.hook("flatmap_path_parameters")(_reach_known_resources)
schema.hook("flatmap_body")(_schedule_from_own_account)


@pytest.fixture
def token(db):
    """A staff user (so deposits and every read succeed, not only fail: the deposit
    permission and every view permission) who owns an account, plus a target account, a
    scheduled payment, an active recurring payment and a webhook endpoint with a failed
    delivery, under known ids."""
    staff = UserFactory(is_staff=True)
    staff.user_permissions.add(
        *Permission.objects.filter(codename="deposit_account", content_type__app_label="ledger"),
        *Permission.objects.filter(codename__startswith="view_", content_type__app_label__in=["ledger", "payments"]),
    )
    Account.objects.create(id=OWN_ACCOUNT, owner=staff, name="own")
    ledger_deposit(key=new_id("dep"), account_id=OWN_ACCOUNT, amount=1000)
    Account.objects.create(id=TARGET_ACCOUNT, owner=UserFactory(), name="target")
    tomorrow = timezone.now() + timedelta(days=1)
    ScheduledPayment.objects.create(
        id=PAYMENT, payer=staff, from_account_id=OWN_ACCOUNT, to_account_id=TARGET_ACCOUNT, amount=1,
        execute_at=tomorrow,
    )
    RecurringPayment.objects.create(
        id=RECURRING, payer=staff, from_account_id=OWN_ACCOUNT, to_account_id=TARGET_ACCOUNT, amount=1,
        start_at=tomorrow, interval="P1D", next_occurrence_at=tomorrow,
    )
    endpoint = Endpoint.objects.create(
        id=ENDPOINT, owner=staff, url="https://hooks.example.com/schemathesis", events=["payment.executed"]
    )
    event = Event.objects.create(type="payment.executed", owner=staff, payment_id=PAYMENT, version=1, snapshot={})
    Delivery.objects.create(id=DELIVERY, event=event, endpoint=endpoint, status=DeliveryStatus.FAILED)
    _, key = AuthToken.objects.create(staff)
    return key


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@schema.parametrize()
@hypothesis_settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case, token):
    case.call_and_validate(
        headers={"Authorization": f"Token {token}"},
        excluded_checks=[
            # Business rules (ownership, the database clock, existence) reject some
            # schema-valid requests with a documented 4xx: that is correct, not a failure.
            positive_data_acceptance,
            # DELETE cancels: the payment stays readable (CANCELLED), as the API promises.
            use_after_free,
        ],
    )
