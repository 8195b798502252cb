"""Recurring payments through the API: create, list, read with occurrences, pause, resume,
end, change; the rules (month end, daylight saving, count) seen by a client."""

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from payments.models import IdempotencyKey, RecurringEvent, RecurringPayment, ScheduledPayment
from payments.promoter import claim_due
from recurring.services import recurring_generate_due
from tests.api import assert_error, future, patch, post
from tests.conftest import client_for
from tests.factories import funded_account

pytestmark = pytest.mark.django_db

BASE = "/api/v1/recurring-payments"


@pytest.fixture
def accounts(user):
    return funded_account(owner=user, balance=100), funded_account()


def body_for(accounts, **overrides) -> dict:
    source, target = accounts
    body = {"from_account": source.id, "to_account": target.id, "amount": 10, "start_at": future(), "interval": "P1D"}
    return {k: v for k, v in {**body, **overrides}.items() if v is not ...}


def create(api, accounts, key="r", **overrides) -> dict:
    response = post(api, BASE, body_for(accounts, **overrides), key=key)
    assert response.status_code == 201, response.content
    return response.json()


def read(api, rec, **query) -> dict:
    response = api.get(f"{BASE}/{rec['recurring_id']}", query)
    assert response.status_code == 200, response.content
    return response.json()


def occurrence_times(api, rec) -> list[str]:
    return sorted(o["occurrence_at"] for o in read(api, rec, limit=100)["occurrences"]["items"])


def let_the_pending_occurrence_fall_due(rec) -> None:
    """Time passes: the occurrence generated ahead is due, so the next tick generates the
    one after it (instead of waiting a day, a month or a week for the real clock)."""
    RecurringPayment.objects.filter(pk=rec["recurring_id"]).update(
        last_occurrence_at=timezone.now() - timedelta(hours=1)
    )


def z(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


# --- create --------------------------------------------------------------------------------


def test_create_answers_201_active_with_the_first_occurrence_scheduled(api, accounts):
    start = timezone.now().replace(microsecond=0) + timedelta(hours=2)
    response = post(api, BASE, body_for(accounts, start_at=start.isoformat()), key="rent")
    assert response.status_code == 201, response.content
    rec = response.json()
    assert rec["recurring_id"].startswith("rec_") and rec["status"] == "ACTIVE"
    assert (rec["interval"], rec["cron"], rec["timezone"], rec["count"], rec["end_at"], rec["ends_at"]) == (
        "P1D", None, "UTC", None, None, None
    )
    assert rec["next_occurrence_at"] == z(start + timedelta(days=1))
    (first,) = rec["occurrences"]["items"]
    assert (first["occurrence_at"], first["execute_at"], first["status"], first["amount"]) == (
        z(start), z(start), "SCHEDULED", 10
    )
    payment = api.get(f"/api/v1/payments/{first['payment_id']}").json()
    assert (payment["recurring_id"], payment["occurrence_at"]) == (rec["recurring_id"], z(start))

    replay = post(api, BASE, body_for(accounts, start_at=start.isoformat()), key="rent")
    assert replay.content == response.content and replay["Idempotent-Replayed"] == "true"
    assert RecurringPayment.objects.count() == 1 and ScheduledPayment.objects.count() == 1


def test_create_needs_an_idempotency_key(api, accounts):
    assert_error(post(api, BASE, body_for(accounts)), 400, "idempotency_key_required")
    assert not RecurringPayment.objects.exists()


def test_a_cron_rule_with_a_time_zone(api, accounts):
    rec = create(api, accounts, interval=..., cron="0 12 * * FRI", timezone="Europe/Berlin",
                 start_at="2027-03-20T00:00:00Z")
    assert (rec["interval"], rec["cron"], rec["timezone"]) == (None, "0 12 * * FRI", "Europe/Berlin")
    # Noon in Berlin: 11:00 UTC before daylight saving starts (2027-03-28), 10:00 UTC after.
    assert rec["occurrences"]["items"][0]["occurrence_at"] == "2027-03-26T11:00:00Z"
    assert rec["next_occurrence_at"] == "2027-04-02T10:00:00Z"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"cron": "0 12 * * *"}, "interval"),  # both
        ({"interval": ...}, "interval"),  # neither
        ({"interval": ""}, "interval"),
        ({"interval": "P1X"}, "interval"),
        ({"interval": "PT30S"}, "interval"),  # below DELAYPAY_MIN_RECURRING_INTERVAL (60)
        ({"interval": "P11Y"}, "interval"),
        ({"interval": "P10Y1D"}, "interval"),  # the bound covers the whole duration (issue 33)
        ({"interval": "P3660D"}, "interval"),
        ({"interval": "PT87700H"}, "interval"),
        ({"interval": 1}, "interval"),
        ({"interval": ..., "cron": "61 * * * *"}, "cron"),
        ({"interval": ..., "cron": "0 0 30 2 *"}, "cron"),  # no 30th of February
        ({"interval": ..., "cron": "@daily"}, "cron"),
        ({"interval": ..., "cron": "* * * * * *"}, "cron"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"timezone": ""}, "timezone"),
        ({"count": 0}, "count"),
        ({"count": 10_001}, "count"),
        ({"count": "3"}, "count"),
        ({"end_at": "2000-01-01T00:00:00Z"}, "end_at"),
        ({"start_at": future(400 * 86400)}, "start_at"),
        ({"start_at": "2030-01-01T00:00:00"}, "start_at"),
        ({"start_at": ...}, "start_at"),
        ({"amount": "10"}, "amount"),
        ({"amount": 0}, "amount"),
        ({"jitter_seconds": 10}, "jitter_seconds"),
        ({"from_account": "acc_nobody"}, "from_account"),
    ],
)
def test_create_refuses_invalid_rules_and_creates_nothing(api, accounts, overrides, field):
    response = post(api, BASE, body_for(accounts, **overrides), key="bad")
    assert field in assert_error(response, 400, "validation_error")["fields"], response.json()
    assert not RecurringPayment.objects.exists()
    assert not ScheduledPayment.objects.exists()
    assert not IdempotencyKey.objects.exists()


def test_the_minimum_interval_is_a_setting(api, accounts, settings):
    settings.DELAYPAY_MIN_RECURRING_INTERVAL = 5
    create(api, accounts, interval="PT5S")
    assert_error(post(api, BASE, body_for(accounts, interval="PT4S"), key="r2"), 400, "validation_error")


# --- the rules a person expects, through the API -------------------------------------------


def test_month_end_falls_on_the_last_day_of_shorter_months(api, accounts):
    rec = create(api, accounts, start_at="2027-01-31T09:00:00Z", interval="P1M")
    for _ in range(3):
        let_the_pending_occurrence_fall_due(rec)
        recurring_generate_due()
    assert occurrence_times(api, rec) == [
        "2027-01-31T09:00:00Z", "2027-02-28T09:00:00Z", "2027-03-31T09:00:00Z", "2027-04-30T09:00:00Z"
    ]
    assert read(api, rec)["next_occurrence_at"] == "2027-05-31T09:00:00Z"


def test_a_daily_rule_keeps_the_local_time_across_daylight_saving(api, accounts):
    # 08:30 in New York: 13:30 UTC in winter, 12:30 UTC once clocks go forward (2027-03-14).
    rec = create(api, accounts, start_at="2027-03-13T13:30:00Z", interval="P1D", timezone="America/New_York")
    let_the_pending_occurrence_fall_due(rec)
    recurring_generate_due()
    assert occurrence_times(api, rec) == ["2027-03-13T13:30:00Z", "2027-03-14T12:30:00Z"]


def test_each_occurrence_is_generated_once_however_many_ticks_run(api, accounts):
    rec = create(api, accounts)
    let_the_pending_occurrence_fall_due(rec)
    assert [recurring_generate_due() for _ in range(3)] == [1, 0, 0]
    assert len(occurrence_times(api, rec)) == 2


def test_a_count_ends_the_series_after_that_many_occurrences(api, accounts):
    rec = create(api, accounts, start_at="2027-01-01T00:00:00Z", count=3)
    assert rec["ends_at"] == "2027-01-03T00:00:00Z"
    for _ in range(2):
        let_the_pending_occurrence_fall_due(rec)
        recurring_generate_due()
    final = read(api, rec)
    assert (final["status"], final["next_occurrence_at"]) == ("ENDED", None)  # the last one is generated
    assert recurring_generate_due() == 0
    assert occurrence_times(api, rec) == ["2027-01-01T00:00:00Z", "2027-01-02T00:00:00Z", "2027-01-03T00:00:00Z"]
    assert [o["status"] for o in final["occurrences"]["items"]] == ["SCHEDULED"] * 3  # and paid when due


def test_end_at_and_count_together_end_at_whichever_comes_first(api, accounts):
    rec = create(api, accounts, start_at="2027-01-01T00:00:00Z", count=10, end_at="2027-01-04T12:00:00Z")
    assert rec["ends_at"] == "2027-01-04T12:00:00Z"


# --- list and read -------------------------------------------------------------------------


def test_the_list_is_yours_newest_first_paginated_and_filterable(api, accounts, other_user):
    mine = [create(api, accounts, key=f"r{i}")["recurring_id"] for i in range(3)]
    create(client_for(other_user), (funded_account(owner=other_user), accounts[1]), key="theirs")
    first = api.get(BASE, {"limit": 2}).json()
    second = api.get(BASE, {"limit": 2, "cursor": first["next_cursor"]}).json()
    assert [r["recurring_id"] for r in first["items"] + second["items"]] == mine[::-1]
    assert second["next_cursor"] is None
    assert "occurrences" not in first["items"][0]
    api.post(f"{BASE}/{mine[0]}/pause")
    assert [r["recurring_id"] for r in api.get(BASE, {"status": "PAUSED"}).json()["items"]] == [mine[0]]
    for query in ({"status": "SCHEDULED"}, {"limit": 0}, {"cursor": "nope"}, {"sort": "id"}):
        assert_error(api.get(BASE, query), 400, "validation_error")


def test_occurrences_are_paged_newest_first(api, accounts):
    rec = create(api, accounts, start_at="2027-01-01T00:00:00Z")
    for _ in range(4):
        let_the_pending_occurrence_fall_due(rec)
        recurring_generate_due()
    seen, cursor = [], None
    while True:
        page = read(api, rec, limit=2, **({"cursor": cursor} if cursor else {}))["occurrences"]
        assert len(page["items"]) <= 2
        seen += [o["occurrence_at"] for o in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"2027-01-0{d}T00:00:00Z" for d in (5, 4, 3, 2, 1)]
    assert set(read(api, rec)["occurrences"]["items"][0]) == {
        "payment_id", "occurrence_at", "execute_at", "amount", "status", "failure_reason"
    }
    for query in ({"limit": 101}, {"cursor": "x"}, {"status": "ACTIVE"}):
        assert_error(api.get(f"{BASE}/{rec['recurring_id']}", query), 400, "validation_error")


def test_get_carries_the_version_as_etag(api, accounts):
    rec = create(api, accounts)
    assert api.get(f"{BASE}/{rec['recurring_id']}")["ETag"] == '"1"'


# --- pause, resume, end --------------------------------------------------------------------


def test_pause_cancels_the_scheduled_occurrence_and_generates_nothing_more(api, accounts):
    rec = create(api, accounts)
    response = api.post(f"{BASE}/{rec['recurring_id']}/pause")
    assert response.status_code == 200 and response["ETag"] == '"2"'
    paused = response.json()
    assert (paused["status"], paused["version"], paused["next_occurrence_at"]) == ("PAUSED", 2, None)
    assert [o["status"] for o in paused["occurrences"]["items"]] == ["CANCELLED"]
    let_the_pending_occurrence_fall_due(rec)
    assert recurring_generate_due() == 0
    again = api.post(f"{BASE}/{rec['recurring_id']}/pause")
    assert (again.status_code, again.json()["version"]) == (200, 2)  # already paused: nothing changes


@pytest.mark.django_db(transaction=True)
def test_resume_starts_from_now_and_records_the_missed_occurrences_without_paying_them(api, accounts, settings):
    settings.DELAYPAY_MIN_RECURRING_INTERVAL = 1
    start = timezone.now() + timedelta(seconds=1)
    rec = create(api, accounts, start_at=start.isoformat(), interval="PT1S", count=30)
    assert api.post(f"{BASE}/{rec['recurring_id']}/pause").status_code == 200
    time.sleep(max(0.0, (start + timedelta(seconds=2.5) - timezone.now()).total_seconds()))
    resumed = api.post(f"{BASE}/{rec['recurring_id']}/resume").json()

    assert resumed["status"] == "ACTIVE" and resumed["ends_at"] == rec["ends_at"]  # the count stays put
    items = resumed["occurrences"]["items"]
    assert [o["status"] for o in items] == ["SCHEDULED", "CANCELLED"]
    assert datetime.fromisoformat(items[0]["occurrence_at"]) > start + timedelta(seconds=2.5)
    skipped = RecurringEvent.objects.get(recurring_id=rec["recurring_id"], kind="resumed").data["skipped"]
    assert len(skipped) >= 3 and skipped[0] == start.astimezone(UTC).isoformat()
    assert ScheduledPayment.objects.filter(recurring_id=rec["recurring_id"]).count() == 2  # not paid in a burst


def test_delete_ends_the_series_and_cancels_the_scheduled_occurrence(api, accounts):
    rec = create(api, accounts)
    url = f"{BASE}/{rec['recurring_id']}"
    ended = api.delete(url)
    assert ended.status_code == 200 and ended.json()["status"] == "ENDED"
    assert [o["status"] for o in ended.json()["occurrences"]["items"]] == ["CANCELLED"]
    assert api.delete(url).json() == ended.json()  # again: 200, nothing changes
    for response in (api.post(f"{url}/pause"), api.post(f"{url}/resume"), patch(api, url, {"amount": 5})):
        assert assert_error(response, 409, "recurring_not_editable")["status"] == "ENDED"


def test_an_occurrence_already_claimed_runs_even_if_the_series_is_paused(api, accounts):
    rec = create(api, accounts)
    (first,) = rec["occurrences"]["items"]
    ScheduledPayment.objects.filter(pk=first["payment_id"]).update(execute_at=timezone.now() - timedelta(minutes=2))
    claim_due(batch=10, lease_seconds=60)
    paused = api.post(f"{BASE}/{rec['recurring_id']}/pause").json()
    assert [o["status"] for o in paused["occurrences"]["items"]] == ["EXECUTING"]


# --- PATCH ----------------------------------------------------------------------------------


def test_patch_changes_future_occurrences_and_bumps_the_version(api, accounts):
    rec = create(api, accounts, amount=10)
    url = f"{BASE}/{rec['recurring_id']}"
    response = patch(api, url, {"amount": 25}, HTTP_IF_MATCH='"1"')
    assert response.status_code == 200 and response["ETag"] == '"2"'
    changed = response.json()
    assert (changed["amount"], changed["version"]) == (25, 2)
    assert [(o["amount"], o["status"]) for o in changed["occurrences"]["items"]] == [
        (25, "SCHEDULED"), (10, "CANCELLED")
    ]
    event = RecurringEvent.objects.get(recurring_id=rec["recurring_id"], kind="updated")
    assert (event.data["old"]["amount"], event.data["new"]["amount"]) == (10, 25)

    retry = patch(api, url, {"amount": 25}, HTTP_IF_MATCH='"1"')  # the response was lost
    assert (retry.status_code, retry.json()["version"]) == (200, 2)
    assert_error(patch(api, url, {"amount": 30}, HTTP_IF_MATCH='"1"'), 412, "version_mismatch")
    assert read(api, rec)["amount"] == 25


def test_patch_may_switch_between_interval_and_cron_and_clear_the_count(api, accounts):
    rec = create(api, accounts, count=5)
    url = f"{BASE}/{rec['recurring_id']}"
    changed = patch(api, url, {"cron": "0 9 * * MON", "timezone": "Europe/Paris", "count": None}).json()
    assert (changed["interval"], changed["cron"], changed["count"], changed["ends_at"]) == (
        None, "0 9 * * MON", None, None
    )
    back = patch(api, url, {"interval": "P1W"}).json()
    assert (back["interval"], back["cron"]) == ("P1W", None)


@pytest.mark.parametrize(
    ("body", "field"),
    [({}, "non_field_errors"), ({"amount": "5"}, "amount"), ({"status": "PAUSED"}, "status"),
     ({"interval": "PT1S"}, "interval"), ({"interval": "P1D", "cron": "0 0 * * *"}, "interval"),
     ({"count": 0}, "count"), ({"timezone": "Nowhere/Land"}, "timezone")],
)
def test_patch_validates_and_changes_nothing_when_invalid(api, accounts, body, field):
    rec = create(api, accounts)
    response = patch(api, f"{BASE}/{rec['recurring_id']}", body)
    assert field in assert_error(response, 400, "validation_error")["fields"]
    assert read(api, rec)["version"] == 1


@pytest.mark.parametrize("action", ["pause", "resume", "end"])
def test_transitions_honour_if_match(api, accounts, action):
    rec = create(api, accounts)
    url = f"{BASE}/{rec['recurring_id']}"
    if action == "resume":
        api.post(f"{url}/pause")  # now at version 2
    send = (lambda **h: api.delete(url, **h)) if action == "end" else (lambda **h: api.post(f"{url}/{action}", **h))
    assert_error(send(HTTP_IF_MATCH="1"), 400, "validation_error")
    assert_error(send(HTTP_IF_MATCH='"9"'), 412, "version_mismatch")
    current = read(api, rec)["version"]
    assert send(HTTP_IF_MATCH=f'"{current}"').status_code == 200
