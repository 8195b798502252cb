"""schemathesis against the served /api/v1/schema: generated requests (valid and
invalid) for every operation, through the real Django WSGI app and PostgreSQL. No
response may be a server error or disagree with the schema (status, headers, content
type, body)."""

import json
import re
from datetime import timedelta

import pytest
import schemathesis
from django.contrib.auth.models import Permission
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, transaction
from django.utils import timezone
from hypothesis import HealthCheck, Phase
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from knox.models import AuthToken
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance, use_after_free

from common.ids import new_id
from ledger.models import Account
from ledger.services import ledger_deposit
from payments.models import RecurringPayment, ScheduledPayment
from tests.conftest import client_for
from tests.factories import UserFactory
from tests.scale import SCALE, scaled
from webhooks.models import Delivery, DeliveryStatus, Endpoint, Event

pytestmark = pytest.mark.django_db

# Known ids, so that generated requests also reach existing resources, not only 404s.
OWN_ACCOUNT = "acc_schemathesis_own"
TARGET_ACCOUNT = "acc_schemathesis_target"
PAYMENT = "pay_schemathesis_scheduled"
RECURRING = "rec_schemathesis_active"
ENDPOINT = "whe_schemathesis_own"
DELIVERY = 424242

# The stateful phase's budget: scenarios, and calls in each (about a minute in all).
STATEFUL_SCENARIOS = scaled(40)
STATEFUL_STEPS = 8


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


def _tomorrow() -> str:
    return (timezone.now() + timedelta(days=1)).isoformat()


def _amount(body: dict) -> int:
    amount = body.get("amount")
    return amount if type(amount) is int and 1 <= amount <= 100 else 1


# The creates whose bodies are sometimes made plausible: what each would need to succeed
# (own account, a known target, tomorrow, a daily rule, an https URL), from the generated
# body. Without this almost every generated create is refused, and the workflows that
# start from a create (the links: api/schema.py, LINKS) never get further.
PLAUSIBLE = {
    "/api/v1/payments": lambda body: {
        "from_account": OWN_ACCOUNT, "to_account": TARGET_ACCOUNT, "amount": _amount(body), "execute_at": _tomorrow(),
    },
    "/api/v1/recurring-payments": lambda body: {
        "from_account": OWN_ACCOUNT, "to_account": TARGET_ACCOUNT, "amount": _amount(body), "start_at": _tomorrow(),
        "interval": "P1D",
    },
    "/api/v1/payees": lambda body: {"name": "schemathesis payee", "rail": "sandbox", "destination": "acct_st"},
    "/api/v1/webhook-endpoints": lambda body: {
        "url": "https://hooks.example.com/schemathesis", "events": ["payment.executed", "payment.failed"],
    },
    "/api/v1/accounts": lambda body: {"name": "schemathesis account"},
}


def _plausible_creates(context, case):
    """Sometimes make a positive create's body plausible too, so that creates, replays and
    the workflows after them are exercised, not only rejections. A negative case is left
    alone: it must stay invalid."""
    meta = case.meta
    path = context.operation.path
    if (
        context.operation.method.upper() != "POST"
        or path not in PLAUSIBLE
        or meta is None
        or meta.generation.mode != GenerationMode.POSITIVE
    ):
        return st.just(case)

    def made_plausible(plausible: bool):
        if plausible:  # schemathesis sees the body changed and validates it again
            case.body = PLAUSIBLE[path](case.body if isinstance(case.body, dict) else {})
        return case

    return st.booleans().map(made_plausible)


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
schema.hook("flatmap_case")(_plausible_creates)


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


EXCLUDED_CHECKS = [
    # Business rules (ownership, the database clock, existence) reject some schema-valid
    # requests with a documented 4xx: that is correct, not a failure.
    positive_data_acceptance,
    # DELETE cancels a payment and ends a recurring payment: both stay readable (CANCELLED,
    # ENDED), as the API promises.
    use_after_free,
]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@schema.parametrize()
@hypothesis_settings(max_examples=scaled(30), deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case, token):
    case.call_and_validate(headers={"Authorization": f"Token {token}"}, excluded_checks=EXCLUDED_CHECKS)


def test_every_operation_of_the_served_schema_is_tested():
    """schemathesis loads every operation (none skipped for a schema it cannot read), so
    the parametrized test above runs each of them."""
    served = json.loads(client_for(None).get("/api/v1/schema", {"format": "json"}).content)
    documented = {(method.upper(), path) for path, item in served["paths"].items() for method in item}
    loaded = [result.ok() for result in schema.get_all_operations()]
    assert {(operation.method.upper(), operation.path) for operation in loaded} == documented


# Only the links the schema publishes: schemathesis would also infer some from names
# (list -> item), which spreads the phase's small budget over chains no client is told of.
schema.config.phases.stateful.inference.algorithms = []
# The coverage phase (each parameter's boundary and wrong-type values, a fixed set of about
# 13 s here whatever max_examples says) runs in full runs only: make test-fast leaves it
# to make test (tests/scale.py).
schema.config.phases.coverage.enabled = SCALE == 1


class Workflows(schema.as_state_machine()):
    """Sequences of calls that follow the schema's links (api/schema.py, LINKS):
    create, then read, change, cancel or delete what was made, with the id from the answer."""

    token = ""

    def setup(self):
        # Each scenario starts from the fixture's rows: what one made is rolled back at its
        # end, so Hypothesis replays a scenario (to shrink a failure) against the same state.
        super().setup()
        self.scenario = transaction.atomic()
        self.scenario.__enter__()

    def teardown(self):
        transaction.set_rollback(True)
        self.scenario.__exit__(None, None, None)
        super().teardown()

    def get_call_kwargs(self, case):
        return {"headers": {"Authorization": f"Token {self.token}"}}

    def validate_response(self, response, case, additional_checks=None, **kwargs):
        case.validate_response(
            response,
            additional_checks=additional_checks,
            excluded_checks=EXCLUDED_CHECKS,
            headers=kwargs.get("headers"),  # the token sent: auth checks judge it, not a generated one
            transport_kwargs=kwargs or None,
            recorder=getattr(self, "recorder", None),
        )


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_api_workflows_conform_to_its_schema(token):
    """The stateful phase: the same checks as above (server errors, status codes, content
    types, response bodies and headers, negative data), over chains of calls the links name."""
    Workflows.token = token
    Workflows.run(
        settings=hypothesis_settings(
            max_examples=STATEFUL_SCENARIOS,
            stateful_step_count=STATEFUL_STEPS,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.generate],
        )
    )
