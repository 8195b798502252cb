"""The review queue over the API: staff re-drive or resolve a payment parked in
NEEDS_REVIEW (POST /payments/{id}/redrive, /resolve); its creator sees it and may cancel it."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from payments import execution
from payments.fields import format_utc
from payments.models import PaymentEvent, PaymentStatus, ScheduledPayment
from tests.api import assert_error, future, post
from tests.conftest import client_for
from tests.factories import UserFactory, claimed, funded_account, future_payment, parked_payment

pytestmark = pytest.mark.django_db


@pytest.fixture
def accounts():
    return funded_account(balance=10), funded_account()


@pytest.fixture
def parked(settings, accounts):
    """A payment whose budget is spent, parked by the executor (DELAYPAY_MAX_ATTEMPTS=1)."""
    return parked_payment(settings, source=accounts[0], target=accounts[1])


def staff_with(*codenames: str):
    user = UserFactory(is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames, content_type__app_label="payments"))
    return user


def reviewer_with_permission():
    """Staff who may read every payment and re-drive or resolve it."""
    return staff_with("view_scheduledpayment", "redrive_scheduledpayment")


@pytest.fixture
def reviewer():
    return reviewer_with_permission()


@pytest.fixture
def reviewer_api(reviewer):
    return client_for(reviewer)


def redrive(client, payment, **body):
    return post(client, f"/api/v1/payments/{payment.id}/redrive", {"reason": "worker bug fixed", **body})


def resolve(client, payment, **body):
    return post(client, f"/api/v1/payments/{payment.id}/resolve", {"outcome": "failed", "reason": "payee gone", **body})


def events(payment, kind) -> list[PaymentEvent]:
    return list(PaymentEvent.objects.filter(payment_id=payment.id, kind=kind).order_by("id"))


# --- what the creator sees -------------------------------------------------------------


def test_the_creator_sees_a_parked_payment_with_its_tries_and_review_reason(parked):
    api = client_for(parked.payer)
    body = api.get(f"/api/v1/payments/{parked.id}").json()
    assert (body["status"], body["tries"], body["review_reason"]) == ("NEEDS_REVIEW", 2, "attempts_exhausted")
    assert body["next_attempt_at"] is None and body["failure_reason"] is None
    assert body["attempts"][-1]["outcome"] == "parked"
    listed = api.get("/api/v1/payments", {"status": "NEEDS_REVIEW"}).json()["items"]
    assert [p["payment_id"] for p in listed] == [parked.id]
    assert api.get("/api/v1/payments", {"status": "SCHEDULED"}).json()["items"] == []


def test_a_retry_waiting_on_the_ladder_shows_its_next_attempt_at(api, user):
    payment = future_payment(source=funded_account(owner=user, balance=5), target=funded_account())
    retry_at = timezone.now() + timedelta(minutes=5)
    ScheduledPayment.objects.filter(pk=payment.pk).update(next_attempt_at=retry_at, tries=1)
    body = api.get(f"/api/v1/payments/{payment.id}").json()
    assert (body["next_attempt_at"], body["tries"], body["review_reason"]) == (format_utc(retry_at), 1, None)
    cancelled = api.delete(f"/api/v1/payments/{payment.id}").json()
    assert cancelled["status"] == "CANCELLED" and cancelled["next_attempt_at"] is None


def test_the_creator_may_cancel_a_parked_payment(parked):
    response = client_for(parked.payer).delete(f"/api/v1/payments/{parked.id}")
    assert response.status_code == 200, response.content
    assert (response.json()["status"], response.json()["review_reason"]) == ("CANCELLED", None)
    (event,) = events(parked, PaymentEvent.Kind.CANCELLED)
    assert (event.from_status, event.actor_user) == ("NEEDS_REVIEW", parked.payer)


# --- re-drive ------------------------------------------------------------------------------


def test_redrive_sends_a_parked_payment_through_again_and_audits_it(parked, reviewer, reviewer_api, accounts):
    response = redrive(reviewer_api, parked)
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["status"], body["tries"], body["review_reason"], body["next_attempt_at"]) == (
        "SCHEDULED", 0, None, None
    )
    assert response["ETag"] == f'"{body["version"]}"'
    assert response.json() == reviewer_api.get(f"/api/v1/payments/{parked.id}").json()  # as GET shows it
    (event,) = events(parked, PaymentEvent.Kind.REDRIVEN)
    assert (event.from_status, event.to_status) == ("NEEDS_REVIEW", "SCHEDULED")
    assert (event.actor, event.actor_user, event.data) == (
        f"user:{reviewer.pk}", reviewer, {"reason": "worker bug fixed"}
    )
    # Due at once, with a fresh budget: it executes like any other payment.
    (pair,) = claimed(parked)
    assert execution.execute_batch(pairs=[pair]).executed == [parked.id]


def test_repeating_a_redrive_answers_200_and_changes_nothing(parked, reviewer_api):
    first = redrive(reviewer_api, parked)
    again = redrive(reviewer_api, parked)
    assert again.status_code == 200, again.content
    assert again.json() == first.json()
    assert len(events(parked, PaymentEvent.Kind.REDRIVEN)) == 1


def test_redrive_at_a_later_time_shows_it_as_next_attempt_at(parked, reviewer_api):
    later = timezone.now().replace(microsecond=0) + timedelta(hours=2)
    response = redrive(reviewer_api, parked, execute_at=later.isoformat())
    assert response.status_code == 200, response.content
    assert (response.json()["status"], response.json()["next_attempt_at"]) == ("SCHEDULED", format_utc(later))
    assert claimed(parked) == []  # not before then
    assert events(parked, PaymentEvent.Kind.REDRIVEN)[0].data["execute_at"] == later.isoformat()


# --- resolve -------------------------------------------------------------------------------


def test_resolve_ends_a_parked_payment_failed_and_audits_it(parked, reviewer, reviewer_api, accounts):
    response = resolve(reviewer_api, parked)
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["status"], body["failure_reason"], body["review_reason"]) == ("FAILED", "resolved_by_staff", None)
    assert response["ETag"] == f'"{body["version"]}"'
    (event,) = [e for e in events(parked, PaymentEvent.Kind.FAILED) if e.from_status == "NEEDS_REVIEW"]
    assert (event.actor_user, event.data["reason"]) == (reviewer, "payee gone")
    again = resolve(reviewer_api, parked)
    assert again.status_code == 200 and again.json() == body
    assert len(events(parked, PaymentEvent.Kind.FAILED)) == 1
    source = accounts[0]
    source.refresh_from_db()
    assert source.balance == 10  # nothing moved


# --- refusals --------------------------------------------------------------------------


@pytest.mark.parametrize("act", [redrive, resolve])
def test_a_payment_not_in_review_is_409_with_its_status(act, reviewer_api, accounts):
    payment = future_payment(source=accounts[0], target=accounts[1])
    body = assert_error(act(reviewer_api, payment), 409, "payment_not_in_review")
    assert body["status"] == "SCHEDULED"
    payment.refresh_from_db()
    assert (payment.status, payment.version) == (PaymentStatus.SCHEDULED, 1)


def test_resolve_after_a_redrive_is_409(parked, reviewer_api):
    redrive(reviewer_api, parked)
    assert assert_error(resolve(reviewer_api, parked), 409, "payment_not_in_review")["status"] == "SCHEDULED"
    assert redrive(reviewer_api, parked).status_code == 200  # the re-drive itself stays a 200 no-op


@pytest.mark.parametrize("act", [redrive, resolve])
def test_the_creator_and_staff_who_may_only_read_get_403_strangers_404(act, parked):
    assert_error(act(client_for(parked.payer), parked), 403, "permission_denied")
    assert_error(act(client_for(staff_with("view_scheduledpayment")), parked), 403, "permission_denied")
    # Staff who may not read the payment are strangers to it, whatever else they may do.
    assert_error(act(client_for(UserFactory(is_staff=True)), parked), 404, "not_found")
    assert_error(act(client_for(staff_with("redrive_scheduledpayment")), parked), 404, "not_found")
    assert_error(act(client_for(UserFactory()), parked), 404, "not_found")
    assert_error(act(client_for(None), parked), 401, "not_authenticated")
    assert_error(act(client_for(reviewer_with_permission()), ScheduledPayment(id="pay_nope")), 404, "not_found")
    parked.refresh_from_db()
    assert parked.status == PaymentStatus.NEEDS_REVIEW
    assert not events(parked, PaymentEvent.Kind.REDRIVEN)


def test_a_superuser_may_redrive(parked):
    root = client_for(UserFactory(is_staff=True, is_superuser=True))
    assert redrive(root, parked).json()["status"] == "SCHEDULED"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("redrive", {}, "reason"),
        ("redrive", {"reason": "   "}, "reason"),
        ("redrive", {"reason": 7}, "reason"),
        ("redrive", {"reason": "x" * 501}, "reason"),
        ("redrive", {"reason": "r", "execute_at": "2020-01-01T00:00:00Z"}, "execute_at"),  # the past
        ("redrive", {"reason": "r", "execute_at": "2030-01-01T00:00:00"}, "execute_at"),  # no offset
        ("redrive", {"reason": "r", "execute_at": future(400 * 86400)}, "execute_at"),  # too far ahead
        ("redrive", {"reason": "r", "outcome": "failed"}, "outcome"),  # unknown here
        ("resolve", {"reason": "r"}, "outcome"),
        ("resolve", {"outcome": "executed", "reason": "it did"}, "outcome"),
        ("resolve", {"outcome": "failed"}, "reason"),
        ("resolve", {"outcome": "failed", "reason": ""}, "reason"),
    ],
)
def test_invalid_bodies_are_400_and_change_nothing(parked, reviewer_api, path, body, field):
    version = parked.version
    response = post(reviewer_api, f"/api/v1/payments/{parked.id}/{path}", body)
    assert field in assert_error(response, 400, "validation_error")["fields"]
    parked.refresh_from_db()
    assert (parked.status, parked.version) == (PaymentStatus.NEEDS_REVIEW, version)


def test_a_body_that_is_not_json_is_400(parked, reviewer_api):
    assert_error(post(reviewer_api, f"/api/v1/payments/{parked.id}/redrive", "{"), 400, "parse_error")
    assert_error(post(reviewer_api, f"/api/v1/payments/{parked.id}/resolve", "[]"), 400, "validation_error")
