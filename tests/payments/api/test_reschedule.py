"""PATCH /payments/{id} with ETag / If-Match, jitter_seconds and expires_after, through the API."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from ledger.models import Transfer
from payments.execution import execute_batch
from payments.models import IdempotencyKey, PaymentEvent, PaymentStatus, ScheduledPayment
from payments.promoter import claim_due
from tests.api import assert_error, future, patch, payment_body, post
from tests.concurrency import run_concurrently, start_thread, wait_for_lock_waiters
from tests.conftest import client_for
from tests.factories import funded_account

pytestmark = pytest.mark.django_db


@pytest.fixture
def accounts(user):
    return funded_account(owner=user, balance=100), funded_account()


@pytest.fixture
def payment(api, accounts):
    response = post(api, "/api/v1/payments", payment_body(*accounts, amount=10), key="p")
    assert response.status_code == 201, response.content
    return response.json()


def url(payment) -> str:
    return f"/api/v1/payments/{payment['payment_id']}"


def stored(payment) -> ScheduledPayment:
    return ScheduledPayment.objects.get(pk=payment["payment_id"])


# --- PATCH ---------------------------------------------------------------------------------


def test_get_carries_the_version_as_etag(api, payment):
    response = api.get(url(payment))
    assert response["ETag"] == '"1"'
    assert response.json()["version"] == 1


def test_patch_reschedules_changes_the_amount_bumps_the_version_and_records_old_and_new(api, payment):
    later = (timezone.now() + timedelta(days=2)).replace(microsecond=0)
    response = patch(api, url(payment), {"execute_at": later.isoformat(), "amount": 42}, HTTP_IF_MATCH='"1"')
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["amount"], body["version"], response["ETag"]) == (42, 2, '"2"')
    assert body["execute_at"] == body["requested_execute_at"] == later.isoformat().replace("+00:00", "Z")
    assert api.get(url(payment))["ETag"] == '"2"'
    event = PaymentEvent.objects.get(payment_id=payment["payment_id"], kind="updated")
    assert event.data["old"]["amount"] == 10 and event.data["new"]["amount"] == 42
    assert event.data["old"]["execute_at"] != event.data["new"]["execute_at"] == later.isoformat()
    assert event.actor_user_id == stored(payment).payer_id


def test_patch_without_if_match_changes_whatever_the_version(api, payment):
    patch(api, url(payment), {"amount": 11})
    response = patch(api, url(payment), {"amount": 12})
    assert (response.status_code, response.json()["version"]) == (200, 3)


def test_a_stale_if_match_is_412_version_mismatch_and_changes_nothing(api, payment):
    assert patch(api, url(payment), {"amount": 11}, HTTP_IF_MATCH='"1"').status_code == 200
    body = assert_error(patch(api, url(payment), {"amount": 12}, HTTP_IF_MATCH='"1"'), 412, "version_mismatch")
    assert body["version"] == 2
    assert (stored(payment).amount, stored(payment).version) == (11, 2)


def test_a_retried_patch_is_a_no_op_that_answers_200(api, payment):
    first = patch(api, url(payment), {"amount": 50}, HTTP_IF_MATCH='"1"')
    again = patch(api, url(payment), {"amount": 50}, HTTP_IF_MATCH='"1"')  # the response was lost
    assert again.status_code == 200
    assert again.json() == first.json() and again["ETag"] == '"2"'
    assert PaymentEvent.objects.filter(payment_id=payment["payment_id"], kind="updated").count() == 1


@pytest.mark.parametrize(
    ("if_match", "status"),
    [('W/"1"', 200), ('"7", "1"', 200), ('"7",W/"1"', 200), ("*", 200), ('  "1"  ', 200),
     ('"7"', 412), ('"abc"', 412), ('"01"', 412), ('"7", "8"', 412), ('W/"2"', 412)],
)
def test_if_match_takes_strong_weak_and_lists_of_entity_tags(api, payment, if_match, status):
    response = patch(api, url(payment), {"amount": 13}, HTTP_IF_MATCH=if_match)
    assert response.status_code == status, response.content
    assert stored(payment).amount == (13 if status == 200 else 10)


@pytest.mark.parametrize("if_match", ["1", '"1', '1"', "W/1", '"1",', ',"1"', '"1" "2"', "", 'w/"1"', '"1";', "**"])
def test_a_malformed_if_match_is_400(api, payment, if_match):
    body = assert_error(patch(api, url(payment), {"amount": 13}, HTTP_IF_MATCH=if_match), 400, "validation_error")
    assert "If-Match" in body["fields"]
    assert stored(payment).amount == 10


def test_patch_after_the_claim_is_409_payment_not_editable(api, payment):
    ScheduledPayment.objects.filter(pk=payment["payment_id"]).update(execute_at=timezone.now() - timedelta(minutes=2))
    claim_due(batch=10, lease_seconds=60)
    body = assert_error(patch(api, url(payment), {"amount": 11}, HTTP_IF_MATCH='"1"'), 409, "payment_not_editable")
    assert body["status"] == "EXECUTING"
    execute_batch(pairs=[(payment["payment_id"], 1)])
    body = assert_error(patch(api, url(payment), {"amount": 11}), 409, "payment_not_editable")
    assert body["status"] == "EXECUTED"
    assert stored(payment).amount == 10


def test_patch_after_cancel_is_409_even_with_a_stale_if_match(api, payment):
    cancelled = api.delete(url(payment))
    assert cancelled["ETag"] == '"2"'  # the cancel bumped the version
    body = assert_error(patch(api, url(payment), {"amount": 11}, HTTP_IF_MATCH='"1"'), 409, "payment_not_editable")
    assert body["status"] == "CANCELLED"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "non_field_errors"),
        ({"amount": "10"}, "amount"),
        ({"amount": 0}, "amount"),
        ({"amount": 10.0}, "amount"),
        ({"amount": None}, "amount"),
        ({"execute_at": "2030-01-01T12:00:00"}, "execute_at"),
        ({"execute_at": "2000-01-01T12:00:00Z"}, "execute_at"),
        ({"execute_at": future(400 * 86400)}, "execute_at"),
        ({"jitter_seconds": 5}, "jitter_seconds"),
        ({"status": "CANCELLED"}, "status"),
        ({"from_account": "acc_X"}, "from_account"),
    ],
)
def test_patch_validates_like_create_and_rejects_other_fields(api, payment, body, field):
    response = assert_error(patch(api, url(payment), body), 400, "validation_error")
    assert field in response["fields"]
    assert (stored(payment).amount, stored(payment).version) == (10, 1)


def test_patch_of_a_jittered_payment_draws_again_within_the_window(api, accounts):
    created = post(api, "/api/v1/payments", payment_body(*accounts, jitter_seconds=600), key="j").json()
    later = timezone.now().replace(microsecond=0) + timedelta(days=3)
    body = patch(api, url(created), {"execute_at": later.isoformat()}).json()
    assert body["requested_execute_at"] == later.isoformat().replace("+00:00", "Z")
    assert later <= stored(created).execute_at <= later + timedelta(seconds=600)


# --- jitter -------------------------------------------------------------------------------


def test_jitter_returns_both_times_and_never_runs_early(api, accounts):
    requested = timezone.now().replace(microsecond=0) + timedelta(hours=1)
    drawn = []
    for i in range(20):
        body = post(api, "/api/v1/payments", payment_body(*accounts, execute_at=requested.isoformat(),
                                                          jitter_seconds=3600), key=f"j{i}").json()
        assert body["requested_execute_at"] == requested.isoformat().replace("+00:00", "Z")
        assert body["jitter_seconds"] == 3600
        drawn.append(stored(body).execute_at)
    assert all(requested <= at <= requested + timedelta(hours=1) for at in drawn)
    assert len(set(drawn)) > 1


def test_without_jitter_the_payment_runs_when_asked(api, accounts):
    body = post(api, "/api/v1/payments", payment_body(*accounts), key="n").json()
    assert body["execute_at"] == body["requested_execute_at"]
    assert (body["jitter_seconds"], body["expires_after"], body["recurring_id"], body["occurrence_at"]) == (
        0, None, None, None
    )


@pytest.mark.parametrize("jitter", [0, 3600])
def test_jitter_bounds_are_inclusive(api, accounts, jitter):
    response = post(api, "/api/v1/payments", payment_body(*accounts, jitter_seconds=jitter), key="j")
    assert response.status_code == 201 and response.json()["jitter_seconds"] == jitter


@pytest.mark.parametrize("jitter", [-1, 3601, 1.5, "10", True, None, 10.0])
def test_jitter_outside_0_to_3600_or_not_an_integer_is_refused(api, accounts, jitter):
    body = assert_error(post(api, "/api/v1/payments", payment_body(*accounts, jitter_seconds=jitter), key="j"),
                        400, "validation_error")
    assert "jitter_seconds" in body["fields"]
    assert not ScheduledPayment.objects.exists() and not IdempotencyKey.objects.exists()


# --- expires_after (the overdue policy) ---------------------------------------------------


@pytest.mark.parametrize(
    ("given", "returned"),
    [("PT30M", "PT30M"), ("PT1S", "PT1S"), ("P1DT12H", "P1DT12H"), ("P2W", "P14D"), ("PT90S", "PT1M30S"),
     ("P365D", "P365D")],
)
def test_expires_after_is_an_iso_8601_duration_returned_in_canonical_form(api, accounts, given, returned):
    response = post(api, "/api/v1/payments", payment_body(*accounts, expires_after=given), key="e")
    assert response.status_code == 201, response.content
    assert response.json()["expires_after"] == returned
    assert api.get(url(response.json())).json()["expires_after"] == returned


@pytest.mark.parametrize("given", ["P1M", "P1Y", "PT0S", "P366D", "PT1.5S", "pt30m", "30", 30, "", None, "P", "PT"])
def test_expires_after_must_be_a_fixed_span_of_1_second_to_365_days(api, accounts, given):
    response = post(api, "/api/v1/payments", payment_body(*accounts, expires_after=given), key="e")
    assert "expires_after" in assert_error(response, 400, "validation_error")["fields"]
    assert not ScheduledPayment.objects.exists()


def test_a_payment_not_started_by_its_expiry_fails_expired_and_nothing_moves(api, accounts):
    source, target = accounts
    strict = post(api, "/api/v1/payments", payment_body(*accounts, amount=30, expires_after="PT1M"), key="s").json()
    patient = post(api, "/api/v1/payments", payment_body(*accounts, amount=40), key="p").json()
    # An outage: both were due two minutes ago and nothing ran them.
    ScheduledPayment.objects.filter(pk__in=[strict["payment_id"], patient["payment_id"]]).update(
        execute_at=timezone.now() - timedelta(minutes=2)
    )
    execute_batch(pairs=claim_due(batch=10, lease_seconds=60).fresh)

    strict_now, patient_now = api.get(url(strict)).json(), api.get(url(patient)).json()
    assert (strict_now["status"], strict_now["failure_reason"]) == ("FAILED", "expired")
    assert strict_now["attempts"][0]["outcome"] == "failed"
    assert patient_now["status"] == "EXECUTED"  # the default: run late, never drop
    assert not Transfer.objects.filter(key=strict["payment_id"]).exists()
    source.refresh_from_db()
    target.refresh_from_db()
    assert (source.balance, target.balance) == (60, 40)


def test_a_payment_started_within_its_expiry_runs(api, accounts):
    body = post(api, "/api/v1/payments", payment_body(*accounts, amount=30, expires_after="PT10M"), key="s").json()
    ScheduledPayment.objects.filter(pk=body["payment_id"]).update(execute_at=timezone.now() - timedelta(minutes=2))
    execute_batch(pairs=claim_due(batch=10, lease_seconds=60).fresh)
    assert stored(body).status == PaymentStatus.EXECUTED


# --- races: PATCH against PATCH and against the claim ---------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_patches_with_the_same_if_match_one_wins_the_other_is_412(user, accounts):
    payment = post(client_for(user), "/api/v1/payments", payment_body(*accounts, amount=10), key="p").json()
    results = run_concurrently(
        lambda: patch(client_for(user), url(payment), {"amount": 20}, HTTP_IF_MATCH='"1"'),
        lambda: patch(client_for(user), url(payment), {"amount": 30}, HTTP_IF_MATCH='"1"'),
    )
    assert sorted(r.status_code for r in results) == [200, 412]
    winner = next(r for r in results if r.status_code == 200).json()
    assert (stored(payment).amount, stored(payment).version) == (winner["amount"], 2)
    assert PaymentEvent.objects.filter(payment_id=payment["payment_id"], kind="updated").count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_patch_that_waits_on_the_claim_answers_409(user, accounts):
    payment = post(client_for(user), "/api/v1/payments", payment_body(*accounts), key="p").json()
    ScheduledPayment.objects.filter(pk=payment["payment_id"]).update(execute_at=timezone.now() - timedelta(minutes=2))
    with transaction.atomic():
        assert claim_due(batch=10, lease_seconds=60).fresh == [(payment["payment_id"], 1)]  # not committed yet
        join = start_thread(lambda: patch(client_for(user), url(payment), {"amount": 99}))
        wait_for_lock_waiters(1)  # the PATCH waits on the claimed row
    body = assert_error(join(), 409, "payment_not_editable")
    assert body["status"] == "EXECUTING"
    assert stored(payment).amount == 25

