"""One error shape everywhere: DRF's errors, ours, and Django's own (404/400/500)."""

import logging

import pytest
from django.db import InterfaceError, OperationalError
from rest_framework import exceptions as drf_exceptions

from api import errors
from api.parsers import PayloadTooLarge
from common.authz import ConflictOfInterest
from ledger.services import DepositRefused
from payments import exceptions as domain
from tests.api import assert_error, payment_body, post
from tests.conftest import client_for
from tests.factories import UserFactory, funded_account
from webhooks import endpoints as webhook_endpoints
from webhooks.safety import WebhookURLRefused

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", ["/api/v1/nope", "/api/v1/payments/", "/api/v1/payments/pay-with-dash", "/api/v2/x"])
def test_unknown_api_paths_are_404_json(api, path):
    assert_error(api.get(path), 404, "not_found")


def test_unknown_paths_outside_the_api_keep_djangos_html(api):
    response = api.get("/nope")
    assert response.status_code == 404 and response["Content-Type"].startswith("text/html")


@pytest.mark.parametrize(
    ("path", "method", "allow"),
    [
        ("/api/v1/payments/pay_X", "put", "GET, PATCH, DELETE, HEAD"),
        ("/api/v1/payments/pay_X", "options", "GET, PATCH, DELETE, HEAD"),
        ("/api/v1/payments", "patch", "GET, POST, HEAD"),
        ("/api/v1/recurring-payments/rec_X", "post", "GET, PATCH, DELETE, HEAD"),
        ("/api/v1/recurring-payments/rec_X/pause", "get", "POST"),
        ("/api/v1/recurring-payments/rec_X/resume", "delete", "POST"),
    ],
)
def test_a_wrong_method_is_405_json_with_allow(api, path, method, allow):
    response = getattr(api, method)(path, {}, format="json")
    assert_error(response, 405, "method_not_allowed")
    assert response["Allow"] == allow


def test_an_accept_header_without_json_is_406_json(api):
    response = api.get("/api/v1/accounts", HTTP_ACCEPT="text/html")
    assert_error(response, 406, "not_acceptable")


def test_token_endpoint_errors_have_the_shape_too():
    anonymous = client_for(None)
    assert_error(post(anonymous, "/api/v1/auth/token", {"username": "x", "password": "y"}), 400,
                 "invalid_credentials")
    assert_error(post(anonymous, "/api/v1/auth/token", {"username": "x"}), 400, "validation_error")
    assert_error(post(anonymous, "/api/v1/auth/token", '{"a": ' + " " * 70_000 + "1}"), 413, "payload_too_large")
    response = anonymous.generic("POST", "/api/v1/auth/token", "username=x", content_type="text/plain")
    assert_error(response, 415, "unsupported_media_type")


def test_a_disallowed_host_is_djangos_400_in_the_error_shape(api):
    assert_error(api.get("/api/v1/accounts", HTTP_HOST="evil.example"), 400, "bad_request")


@pytest.mark.urls("tests.payments.api.urls_broken")
def test_an_unhandled_error_is_a_500_in_the_error_shape(caplog):
    client = client_for(None)
    client.raise_request_exception = False
    with caplog.at_level(logging.CRITICAL, logger="django.request"):
        assert_error(client.get("/api/v1/broken"), 500, "server_error")
        assert client.get("/broken")["Content-Type"].startswith("text/html")


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_code_the_code_base_raises_is_in_the_published_catalog():
    raised = {c.code for c in _subclasses(domain.DomainError)} | {code for _, code in errors._DRF_CODES}
    raised.add(DepositRefused.code)
    raised |= {"bad_request", "server_error", PayloadTooLarge.default_code}
    assert raised <= set(errors.ERROR_CODES), raised - set(errors.ERROR_CODES)
    # Every DRF exception a view can raise maps to a specific code, never the fallback.
    for exc in (drf_exceptions.NotAuthenticated, drf_exceptions.Throttled, drf_exceptions.ParseError):
        assert errors.exception_handler(exc(), {}).data["code"] != "error"


DOMAIN_ERRORS = [
    (domain.PaymentValidationError({"amount": ["Too big."]}), 400),
    (domain.IdempotencyKeyRequired(), 400),
    (domain.IdempotencyKeyInvalid(), 400),
    (domain.IdempotencyKeyRepeated(), 400),
    (domain.InvalidCredentials(), 400),
    (domain.StaffActionForbidden(), 403),
    (domain.PaymentCancelForbidden(), 403),
    (domain.PaymentReviewForbidden(), 403),
    (domain.PaymentNotFound(), 404),
    (domain.PaymentArchived("2026-01"), 410),
    (domain.AccountNotFound(), 404),
    (domain.RecurringNotFound(), 404),
    (domain.PaymentNotCancellable("EXECUTED"), 409),
    (domain.PaymentNotEditable("EXECUTING"), 409),
    (domain.PaymentNotInReview("SCHEDULED"), 409),
    (domain.RecurringStateError("ENDED"), 409),
    (domain.IdempotencyKeyReused(), 409),
    (domain.IdempotencyKeyInUse(), 409),
    (domain.SystemAccountPayee(), 400),
    (domain.PendingPaymentsLimit("At the limit.", limit=3, usage=3), 409),
    (domain.ActiveSeriesLimit("At the limit.", limit=2, usage=2), 409),
    (domain.DailyOutflowLimit("Over the limit.", limit=100, usage=90, requested=20, day="2030-01-01"), 409),
    (DepositRefused("The deposit was rejected: account_closed.", reason="account_closed"), 409),
    (domain.VersionMismatch(3), 412),
    (domain.PayeeNotFound(), 404),
    (domain.PayeeInUse(2), 409),
    (domain.PayoutOutcomeUnknown("NEEDS_REVIEW"), 409),
    (domain.PayoutPaidAtRail("po_123"), 409),
    (domain.RailUnavailable(), 503),
    (domain.PayeeDeleteForbidden(), 403),
    (WebhookURLRefused("only https:// URLs are allowed"), 400),
    (webhook_endpoints.EndpointActForbidden(), 403),
    (webhook_endpoints.EndpointNotFound(), 404),
    (webhook_endpoints.DeliveryNotFound(), 404),
    (webhook_endpoints.EndpointLimit(limit=10, usage=10), 409),
    (webhook_endpoints.EndpointVersionMismatch(2), 412),
]


@pytest.mark.parametrize(("exc", "status"), DOMAIN_ERRORS, ids=lambda v: type(v).__name__)
def test_each_domain_exception_leaves_with_its_status_code_and_fields(exc, status):
    response = errors.exception_handler(exc, {})
    assert response.status_code == status
    assert response.data == {"code": exc.code, "detail": exc.detail, **getattr(exc, "extra", {})}


def test_a_conflict_of_interest_is_403_with_its_code():
    exc = ConflictOfInterest("You own this account: another staff member must freeze or unfreeze it.")
    response = errors.exception_handler(exc, {})
    assert response.status_code == 403
    assert response.data == {"code": "conflict_of_interest", "detail": exc.detail}
    assert "conflict_of_interest" in errors.ERROR_CODES


def test_every_domain_exception_has_its_status_in_the_one_mapping():
    assert {type(exc) for exc, _ in DOMAIN_ERRORS} == set(_subclasses(domain.DomainError)) | {DepositRefused}
    assert not hasattr(domain.DomainError, "http_status")  # HTTP lives in api/errors.py only


# --- throttling -----------------------------------------------------------------------------


@pytest.fixture
def low_rates(settings):
    rates = {"token": "2/min", "create": "3/min"}
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": rates}


def assert_throttled(response) -> None:
    body = assert_error(response, 429, "throttled")
    retry_after = int(response["Retry-After"])
    assert 1 <= retry_after <= 60
    assert body["retry_after"] == retry_after


def test_the_token_endpoint_is_throttled_per_client_address(low_rates, user):
    client = client_for(None)
    creds = {"username": user.username, "password": "wrong"}
    for _ in range(2):
        assert post(client, "/api/v1/auth/token", creds).status_code == 400
    assert_throttled(post(client, "/api/v1/auth/token", creds))
    # A forged X-Forwarded-For does not buy a fresh budget (no proxy is trusted by default).
    assert_throttled(post(client, "/api/v1/auth/token", creds, HTTP_X_FORWARDED_FOR="203.0.113.9"))
    assert post(client, "/api/v1/auth/token", creds, REMOTE_ADDR="198.51.100.7").status_code == 400


def test_create_endpoints_are_throttled_per_user_and_a_throttled_request_creates_nothing(low_rates, api, user):
    source, target = funded_account(owner=user, balance=100), funded_account()
    for i in range(3):
        assert post(api, "/api/v1/payments", payment_body(source, target), key=f"k{i}").status_code == 201
    assert_throttled(post(api, "/api/v1/payments", payment_body(source, target), key="k3"))
    assert_throttled(post(api, "/api/v1/accounts", {"name": "more"}))
    assert api.get("/api/v1/payments").json()["items"].__len__() == 3  # reads are not throttled
    other = UserFactory()
    assert post(client_for(other), "/api/v1/accounts", {"name": "theirs"}).status_code == 201


def test_throttling_fails_open_when_the_cache_is_down(low_rates, settings, api, user, caplog):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": "redis://127.0.0.1:1/1"}}
    source, target = funded_account(owner=user, balance=100), funded_account()
    with caplog.at_level(logging.WARNING, logger="api.throttling"):
        for i in range(5):
            assert post(api, "/api/v1/payments", payment_body(source, target), key=f"k{i}").status_code == 201
    assert "throttle cache unavailable" in caplog.text


def test_a_rate_of_off_disables_a_throttle(settings, api):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"token": None, "create": None}}
    for i in range(5):
        assert post(api, "/api/v1/accounts", {"name": f"a{i}"}).status_code == 201


@pytest.mark.parametrize("error", [OperationalError("connection refused"), InterfaceError("connection already closed")])
def test_a_database_that_does_not_answer_is_a_503_to_retry_not_a_500(api, monkeypatch, caplog, error):
    """Not a bug: the database is restarting, failing over, or rolled the request back.
    The client is told to retry; nothing was written (the chaos run's primary crashes)."""
    from api import accounts as accounts_api

    def unavailable(**kwargs):
        raise error

    monkeypatch.setattr(accounts_api, "account_visible_to", unavailable)
    with caplog.at_level(logging.WARNING, logger="api.errors"):
        response = api.get("/api/v1/accounts")
    body = assert_error(response, 503, "database_unavailable")
    assert body["retry_after"] == int(response["Retry-After"]) == errors.DATABASE_RETRY_AFTER
    assert "database unavailable" in caplog.text
