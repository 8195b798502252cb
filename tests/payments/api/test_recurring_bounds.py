"""Recurring payments through the API at the edges (issue 14): dates at either end of the
calendar, intervals and counts that would overflow, cron rules that fire rarely or
never, each answered 400 validation_error naming the field, never 500; the expensive
requests bounded, measured in croniter steps (not seconds); and the history of a
series (an occurrence cancelled with DELETE /payments/{id} stays cancelled)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from payments.models import RecurringEvent, RecurringPayment, ScheduledPayment
from payments.rules import CRON_PROBE_YEARS, MAX_CRON_COUNT
from tests.api import assert_error, future, patch, post
from tests.factories import funded_account
from tests.payments.test_rules_properties import counted_steps

pytestmark = pytest.mark.django_db

BASE = "/api/v1/recurring-payments"
CALENDAR = "Must be between 1970-01-01T00:00:00Z and 9999-12-30T00:00:00Z."
RARE = "The cron expression must match at least once every 366 days."
# What validating any rule may cost, in croniter steps: the probe of the year boundaries,
# and the first occurrence after now (with the one before it).
VALIDATION_STEPS = 2 * CRON_PROBE_YEARS + 4


@pytest.fixture
def accounts(user):
    return funded_account(owner=user, balance=100), funded_account()


def body_for(accounts, **overrides) -> dict:
    source, target = accounts
    body = {"from_account": source.id, "to_account": target.id, "amount": 10, "start_at": future(), "interval": "P1D"}
    return {k: v for k, v in {**body, **overrides}.items() if v is not ...}


def refused(api, accounts, key: str, **overrides) -> dict:
    response = post(api, BASE, body_for(accounts, **overrides), key=key)
    fields = assert_error(response, 400, "validation_error")["fields"]
    assert not RecurringPayment.objects.exists()
    return fields


# --- the calendar's edges -----------------------------------------------------------------


def test_a_start_in_year_one_with_a_count_is_a_400_not_an_overflow(api, accounts):
    fields = refused(api, accounts, "y1", start_at="0001-01-01T00:00:00Z", count=5)
    assert fields == {"start_at": [CALENDAR]}
    fields = refused(api, accounts, "y1-cron", start_at="0001-01-01T00:00:00Z", interval=..., cron="0 0 * * *",
                     count=5, timezone="America/Adak")
    assert fields == {"start_at": [CALENDAR]}


def test_a_start_at_the_end_of_year_9999_in_kiritimati_is_a_400_not_an_overflow(api, accounts):
    fields = refused(api, accounts, "y9999", start_at="9999-12-31T23:00:00Z", interval=..., cron="0 0 * * *",
                     timezone="Pacific/Kiritimati")
    assert fields == {"start_at": [CALENDAR, "Must be at most 365 days ahead."]}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"end_at": "0001-01-01T00:00:00Z"}, "end_at"),
        ({"interval": "P99999999999999999999999999999999999Y"}, "interval"),
        ({"interval": "PT99999999999999999999999999999999999S"}, "interval"),
        ({"interval": "P10Y", "count": 10_001}, "count"),
        ({"interval": "P1D", "count": 10**30}, "count"),
        ({"interval": ..., "cron": "0 0 30 2 *"}, "cron"),  # never
        ({"interval": ..., "cron": "0 0 29 2 *"}, "cron"),  # every four years
        ({"interval": ..., "cron": "0 0 * 2 1#5"}, "cron"),  # a fifth Monday in February
        ({"interval": ..., "cron": "0 0 * * *", "timezone": "../../etc/passwd"}, "timezone"),
    ],
    ids=["end-year-1", "years-overflow", "seconds-overflow", "count-over", "count-huge", "cron-never",
         "cron-leap-day", "cron-fifth-monday", "zone-path"],
)
def test_values_that_would_overflow_or_never_fire_are_400_naming_the_field(api, accounts, overrides, field):
    fields = refused(api, accounts, "edge", **overrides)
    assert list(fields) == [field], fields


def test_an_end_at_the_last_instant_of_the_calendar_is_fine(api, accounts):
    response = post(api, BASE, body_for(accounts, end_at="9999-12-31T23:59:59.999999Z"), key="end")
    assert response.status_code == 201, response.content
    assert response.json()["ends_at"] == "9999-12-31T23:59:59.999999Z"


def test_a_count_running_past_the_calendar_is_accepted_and_ends_with_it(api, accounts):
    response = post(api, BASE, body_for(accounts, interval="P10Y", count=10_000), key="long")
    assert response.status_code == 201, response.content
    assert response.json()["ends_at"] is None


def test_a_patch_to_the_edge_of_the_calendar_is_a_400_and_changes_nothing(api, accounts):
    created = post(api, BASE, body_for(accounts), key="p").json()
    url = f"{BASE}/{created['recurring_id']}"
    for body, field in [
        ({"start_at": "0001-01-01T00:00:00Z", "count": 3}, "start_at"),
        ({"cron": "0 0 29 2 *", "timezone": "Pacific/Kiritimati"}, "cron"),
        ({"cron": "0 0 29 2 1", "count": MAX_CRON_COUNT + 1}, "count"),
    ]:
        assert list(assert_error(patch(api, url, body), 400, "validation_error")["fields"]) == [field]
    assert api.get(url).json()["version"] == created["version"]


# --- the cost of a request is bounded -----------------------------------------------------


def test_a_large_count_with_a_rarely_firing_cron_is_refused_before_any_walk(api, accounts):
    # "0 0 29 2 1" fires on 29 February or a Monday in February: 10,000 of them reach
    # the year 4400, and used to be walked one by one (seconds of CPU per request).
    with counted_steps() as steps:
        fields = refused(api, accounts, "rare", interval=..., cron="0 0 29 2 1", count=10_000)
    message = f"With a cron rule, count is at most {MAX_CRON_COUNT}; give end_at for a longer series."
    assert fields == {"count": [message]}
    assert steps.cron <= VALIDATION_STEPS, steps


def test_the_largest_cron_count_costs_one_croniter_step_per_occurrence(api, accounts):
    with counted_steps() as steps:
        response = post(api, BASE, body_for(accounts, interval=..., cron="0 0 29 2 1", count=MAX_CRON_COUNT), key="1k")
    assert response.status_code == 201, response.content
    # The count walked once, plus validation, the first occurrence and the per-user
    # limits' look at the series' first year (a handful of occurrences of this rule).
    assert MAX_CRON_COUNT < steps.cron <= MAX_CRON_COUNT + 2 * VALIDATION_STEPS, steps


def test_an_interval_count_costs_no_walk_at_all(api, accounts):
    with counted_steps() as steps:
        response = post(api, BASE, body_for(accounts, interval="PT1M", count=10_000), key="min")
    assert response.status_code == 201, response.content
    assert response.json()["ends_at"] is not None
    assert steps.cron == 0 and steps.interval <= 16, steps


# --- history: an occurrence cancelled on its own stays cancelled ------------------------------


def occurrences(api, rec: dict) -> list[dict]:
    return api.get(f"{BASE}/{rec['recurring_id']}", {"limit": 100}).json()["occurrences"]["items"]


def test_delete_an_occurrence_then_patch_the_amount_never_pays_it(api, accounts):
    rec = post(api, BASE, body_for(accounts), key="h").json()
    (x,) = occurrences(api, rec)
    assert api.delete(f"/api/v1/payments/{x['payment_id']}").status_code == 200
    response = patch(api, f"{BASE}/{rec['recurring_id']}", {"amount": 25})
    assert response.status_code == 200, response.content
    assert [(o["payment_id"], o["status"]) for o in occurrences(api, rec)] == [(x["payment_id"], "CANCELLED")]
    event = RecurringEvent.objects.filter(recurring_id=rec["recurring_id"], kind="updated").get()
    assert [kept["payment_id"] for kept in event.data["kept_cancelled"]] == [x["payment_id"]]


def test_delete_an_occurrence_then_pause_and_resume_never_pays_it(api, accounts):
    rec = post(api, BASE, body_for(accounts), key="h2").json()
    (x,) = occurrences(api, rec)
    assert api.delete(f"/api/v1/payments/{x['payment_id']}").status_code == 200
    url = f"{BASE}/{rec['recurring_id']}"
    assert post(api, f"{url}/pause", {}).status_code == 200
    resumed = post(api, f"{url}/resume", {})
    assert resumed.status_code == 200, resumed.content
    assert [(o["payment_id"], o["status"]) for o in occurrences(api, rec)] == [(x["payment_id"], "CANCELLED")]
    # The series carries on with the occurrence after it.
    assert resumed.json()["next_occurrence_at"] is not None


def test_patch_while_the_occurrence_is_due_leaves_it_to_run(api, accounts):
    rec = post(api, BASE, body_for(accounts), key="h3").json()
    (x,) = occurrences(api, rec)
    # The occurrence fell due a moment ago and no tick has claimed it yet.
    ScheduledPayment.objects.filter(pk=x["payment_id"]).update(execute_at=timezone.now() - timedelta(seconds=5))
    response = patch(api, f"{BASE}/{rec['recurring_id']}", {"amount": 25})
    assert response.status_code == 200, response.content
    statuses = {o["payment_id"]: (o["status"], o["amount"]) for o in occurrences(api, rec)}
    assert statuses[x["payment_id"]] == ("SCHEDULED", 10)
    event = RecurringEvent.objects.filter(recurring_id=rec["recurring_id"], kind="updated").get()
    assert event.data["left_to_run"] == [x["payment_id"]]
