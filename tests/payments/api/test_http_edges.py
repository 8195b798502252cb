"""HTTP edges the API answers in its error shape (issue 14): bodies past Django's own
limit, media types that only match JSON by wildcard, If-Match on every conditional write,
and an Idempotency-Key header sent twice. The server in front (gunicorn: malformed
requests, chunked bodies) is tests/ops/test_http_server.py."""

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission

from payments.models import PaymentStatus, ScheduledPayment
from tests.api import assert_error, payment_body, post
from tests.conftest import client_for
from tests.factories import UserFactory, claimed, due_payment, funded_account, parked_payment

pytestmark = pytest.mark.django_db


@pytest.fixture
def accounts(user):
    return funded_account(owner=user, balance=100), funded_account()


def create(api, accounts, key: str = "p") -> dict:
    response = post(api, "/api/v1/payments", payment_body(*accounts, amount=10), key=key)
    assert response.status_code == 201, response.content
    return response.json()


def url(payment) -> str:
    return f"/api/v1/payments/{payment['payment_id'] if isinstance(payment, dict) else payment.id}"


# --- Bodies past DATA_UPLOAD_MAX_MEMORY_SIZE -----------------------------------------------


@pytest.mark.parametrize("path", ["/api/v1/payments", "/api/v1/auth/token", "/api/v1/recurring-payments"])
def test_a_body_over_djangos_memory_limit_is_413_not_400(api, path):
    huge = '{"a": "' + "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 10) + '"}'
    body = assert_error(post(api, path, huge, key="big"), 413, "payload_too_large")
    assert str(settings.DELAYPAY_MAX_BODY_BYTES) in body["detail"]


def test_a_patch_body_over_djangos_memory_limit_is_413(api, accounts):
    payment = create(api, accounts)
    huge = '{"amount": 1, "x": "' + "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 10) + '"}'
    response = api.patch(url(payment), data=huge, content_type="application/json")
    assert_error(response, 413, "payload_too_large")


def test_request_data_too_big_raised_outside_a_view_is_413_under_the_api(rf):
    from django.core.exceptions import RequestDataTooBig

    from api.errors import bad_request

    response = bad_request(rf.post("/api/v1/payments"), RequestDataTooBig("too big"))
    assert response.status_code == 413
    assert response["Content-Type"] == "application/json"


# --- Content-Type: application/json only ---------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        "*/*",
        "application/*",
        "*/json",
        "application/json; profile=x",
        "application/json; charset=utf-8; charset=latin-1",
        "application/jsonx",
        "application/json-seq",
        "application/json/x",
    ],
)
def test_a_content_type_that_is_not_exactly_json_is_415(api, accounts, content_type):
    response = api.generic(
        "POST", "/api/v1/payments", '{"amount": 1}', content_type=content_type, HTTP_IDEMPOTENCY_KEY="k"
    )
    assert_error(response, 415, "unsupported_media_type")
    assert not ScheduledPayment.objects.exists()


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "Application/JSON", "application/json;charset=utf-8", 'application/json; charset="UTF-8"'],
)
def test_json_with_at_most_a_charset_is_parsed(api, accounts, content_type):
    import json

    response = api.generic(
        "POST", "/api/v1/payments", json.dumps(payment_body(*accounts)), content_type=content_type,
        HTTP_IDEMPOTENCY_KEY="k",
    )
    assert response.status_code == 201, response.content


def test_a_wildcard_content_type_is_415_on_patch_too(api, accounts):
    payment = create(api, accounts)
    response = api.generic("PATCH", url(payment), '{"amount": 11}', content_type="*/*")
    assert_error(response, 415, "unsupported_media_type")
    assert ScheduledPayment.objects.get(pk=payment["payment_id"]).amount == 10


# --- If-Match on every conditional write ---------------------------------------------------


def test_cancel_with_a_stale_if_match_is_412_and_cancels_nothing(api, accounts):
    payment = create(api, accounts)
    assert api.patch(url(payment), {"amount": 11}, format="json").status_code == 200  # version 2
    body = assert_error(api.delete(url(payment), HTTP_IF_MATCH='"1"'), 412, "version_mismatch")
    assert body["version"] == 2
    assert ScheduledPayment.objects.get(pk=payment["payment_id"]).status == PaymentStatus.SCHEDULED


def test_cancel_with_the_current_if_match_cancels(api, accounts):
    payment = create(api, accounts)
    response = api.delete(url(payment), HTTP_IF_MATCH='"1"')
    assert response.status_code == 200, response.content
    assert response.json()["status"] == PaymentStatus.CANCELLED
    assert response["ETag"] == '"2"'


@pytest.mark.parametrize("if_match", ['"2", "1"', 'W/"1"', "*"])
def test_cancel_accepts_any_if_match_that_names_the_current_version(api, accounts, if_match):
    payment = create(api, accounts)
    assert api.delete(url(payment), HTTP_IF_MATCH=if_match).status_code == 200


def test_cancel_with_a_malformed_if_match_is_400(api, accounts):
    payment = create(api, accounts)
    body = assert_error(api.delete(url(payment), HTTP_IF_MATCH="1"), 400, "validation_error")
    assert "If-Match" in body["fields"]
    assert ScheduledPayment.objects.get(pk=payment["payment_id"]).status == PaymentStatus.SCHEDULED


def test_a_retried_cancel_with_its_now_stale_if_match_answers_200(api, accounts):
    payment = create(api, accounts)
    assert api.delete(url(payment), HTTP_IF_MATCH='"1"').status_code == 200
    again = api.delete(url(payment), HTTP_IF_MATCH='"1"')  # the response was lost; the retry
    assert again.status_code == 200 and again.json()["status"] == PaymentStatus.CANCELLED


def test_cancel_after_the_claim_is_409_whatever_if_match_says(api, user, accounts):
    payment = due_payment(source=accounts[0], target=accounts[1], amount=1, payer=user)
    assert claimed(payment)
    assert_error(api.delete(url(payment), HTTP_IF_MATCH='"7"'), 409, "payment_not_cancellable")


@pytest.fixture
def reviewer_api():
    user = UserFactory(is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["redrive_scheduledpayment", "view_scheduledpayment"])
    )
    return client_for(user)


@pytest.fixture
def parked(settings):
    return parked_payment(settings, source=funded_account(balance=10), target=funded_account())


@pytest.mark.parametrize(("action", "body"), [("redrive", {"reason": "fixed"}),
                                              ("resolve", {"outcome": "failed", "reason": "gone"})])
def test_review_actions_with_a_stale_if_match_are_412(reviewer_api, parked, action, body):
    version = ScheduledPayment.objects.get(pk=parked.pk).version
    response = post(reviewer_api, f"{url(parked)}/{action}", body, HTTP_IF_MATCH=f'"{version + 5}"')
    assert assert_error(response, 412, "version_mismatch")["version"] == version
    assert ScheduledPayment.objects.get(pk=parked.pk).status == PaymentStatus.NEEDS_REVIEW


@pytest.mark.parametrize(("action", "body"), [("redrive", {"reason": "fixed"}),
                                              ("resolve", {"outcome": "failed", "reason": "gone"})])
def test_review_actions_with_the_current_if_match_apply_and_a_retry_answers_200(reviewer_api, parked, action, body):
    version = ScheduledPayment.objects.get(pk=parked.pk).version
    first = post(reviewer_api, f"{url(parked)}/{action}", body, HTTP_IF_MATCH=f'"{version}"')
    assert first.status_code == 200, first.content
    assert first["ETag"] == f'"{version + 1}"'
    again = post(reviewer_api, f"{url(parked)}/{action}", body, HTTP_IF_MATCH=f'"{version}"')
    assert again.status_code == 200, again.content


def test_a_review_action_on_a_payment_not_in_review_is_409_before_412(reviewer_api, api, accounts):
    payment = create(api, accounts)
    response = post(reviewer_api, f"{url(payment)}/redrive", {"reason": "x"}, HTTP_IF_MATCH='"9"')
    assert_error(response, 409, "payment_not_in_review")


# --- Idempotency-Key sent twice ------------------------------------------------------------


# WSGI servers join a repeated header with "," (gunicorn: no space; others ", ").
@pytest.mark.parametrize("header", ["one,two", "one, two", '"one","two"', '"one", two', "one,one"])
def test_a_repeated_idempotency_key_header_is_400_and_creates_nothing(api, accounts, header):
    response = post(api, "/api/v1/payments", payment_body(*accounts), key=header)
    assert_error(response, 400, "idempotency_key_repeated")
    assert not ScheduledPayment.objects.exists()


def test_a_quoted_key_may_still_hold_a_comma(api, accounts):
    response = post(api, "/api/v1/payments", payment_body(*accounts), key='"one,two"')
    assert response.status_code == 201, response.content
