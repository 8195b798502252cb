"""The payment page and the payment list for investigations (issue 18, items 1 to 3):
what happened to a payment at a glance, account-level parties, prefix and pasted-id
search, the amount / due-date / direction / one-off filters, the CSV export, the live
refresh and the saved views, ids in URLs as the API shows them."""

import csv
import io
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils import timezone

from console.admin import display, review
from console.admin import payments as admin_payments
from console.admin.filters import parse_due
from console.admin.payments import export_filename
from console.admin_rails import id_in_url
from payments.models import PaymentStatus, ScheduledPayment
from recurring.services import recurring_create
from tests.conftest import admin_client_for
from tests.factories import UserFactory, due_payment, funded_account, future_payment, parked_payment

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:payments_scheduledpayment_changelist")
EXPORT = reverse("admin:payments_scheduledpayment_export")


def change_url(payment) -> str:
    return reverse("admin:payments_scheduledpayment_change", args=[payment.pk])


def listed(response) -> set[str]:
    assert response.status_code == 200, response.status_code
    return {str(p.pk) for p in response.context["cl"].result_list}


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def exported(response) -> list[list[str]]:
    assert response.status_code == 200, response.status_code
    assert response.streaming
    return list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))


@pytest.fixture
def people():
    """alice pays from two named accounts; bob receives; carol pays bob too."""
    alice = UserFactory(username="alice")
    bob = UserFactory(username="bob")
    carol = UserFactory(username="carol")
    return {
        "alice_main": funded_account(owner=alice, balance=10_000, name="Main"),
        "alice_savings": funded_account(owner=alice, balance=10_000, name="Savings"),
        "bob": funded_account(owner=bob, name="Household"),
        "carol": funded_account(owner=carol, balance=10_000, name="Carol's purse"),
    }


@pytest.fixture
def payments(people):
    a, s, b, c = people["alice_main"], people["alice_savings"], people["bob"], people["carol"]
    return {
        "small": future_payment(source=a, target=b, amount=5, minutes=30),
        "large": future_payment(source=s, target=b, amount=1_234_567, minutes=60 * 24 * 3),
        "carols": future_payment(source=c, target=b, amount=700, minutes=60 * 24 * 10),
        "to_alice": future_payment(source=c, target=a, amount=40, minutes=60 * 24 * 20),
    }


def names(payments, *keys) -> set[str]:
    return {payments[k].pk for k in keys}


# --- item 1: the payment page -----------------------------------------------------------


def test_the_payment_page_puts_what_happened_first(superuser, people, payments):
    payment = payments["large"]
    response = admin_client_for(superuser).get(change_url(payment))
    assert response.status_code == 200
    html = response.content.decode()
    first = response.context["adminform"].fieldsets[0]
    assert first[0] == "What happened"
    assert first[1]["fields"][:2] == ("status_col", "amount_col")
    assert {"failure_reason_detail", "review_reason_detail", "next_attempt_at_detail", "executed_at_detail"} <= set(
        first[1]["fields"]
    )
    assert '<span class="dp-badge dp-blue">SCHEDULED</span>' in html
    assert "1,234,567" in html  # thousands separators
    assert "Savings" in html and "Household" in html  # account names, with their owners
    payer_link = f'href="{CHANGELIST}?payer={payment.payer_id}"'
    assert payer_link in html
    assert reverse("admin:auth_user_change", args=[payment.payer_id]) not in html
    # The id is the page's subtitle; no field or inline prints it again.
    assert "id" not in {f for _, opts in response.context["adminform"].fieldsets for f in opts["fields"]}
    assert response.context["inline_admin_formsets"] == []


def test_the_payer_link_lists_that_users_payments(superuser, people, payments):
    alice = people["alice_main"].owner
    response = admin_client_for(superuser).get(CHANGELIST, {"payer": alice.pk})
    assert listed(response) == names(payments, "small", "large")
    assert "alice" in response.content.decode()  # the filter names the user


def test_a_bad_payer_parameter_is_a_message_not_an_error(superuser, payments):
    response = admin_client_for(superuser).get(CHANGELIST, {"payer": "alice"})
    assert listed(response) == names(payments, *payments)
    assert any("not a user id" in m for m in messages_of(response))


def test_the_timeline_lists_attempts_and_events_oldest_first(superuser, people):
    from payments.execution import execute_batch
    from payments.promoter import claim_due

    payment = due_payment(source=people["alice_main"], target=people["bob"], amount=10, seconds_ago=60)
    claim = claim_due(batch=100, lease_seconds=60)
    execute_batch(pairs=[pair for pair in claim.fresh if pair[0] == payment.pk], worker="w1")
    response = admin_client_for(superuser).get(change_url(payment))
    whats = [str(entry.what) for entry in response.context["timeline"]]
    assert whats[:2] == ["created → SCHEDULED", "claimed SCHEDULED → EXECUTING"]
    # No event for a first claim (decision record 0010): the entry comes from the row.
    assert response.context["timeline"][1].detail.endswith("the payment's claimed_at")
    assert whats[2].startswith("attempt 1:") and ">executed<" in whats[2]  # right after its claim
    assert whats[3] == "executed EXECUTING → EXECUTED"
    html = response.content.decode()
    assert 'id="dp-timeline"' in html and "worker:w1" in html
    assert html.index('id="dp-timeline"') < html.index(">Schedule<")  # under the first section


def test_the_timeline_shows_a_first_claim_that_wrote_no_event_and_the_claim_that_superseded_it(superuser, people):
    """A first claim writes no event (decision record 0010): the timeline takes its time
    from the row while it is the latest claim, then from the reclaim's previous_claimed_at."""
    from payments.execution import execute_batch
    from payments.models import PaymentEvent
    from payments.promoter import claim_due
    from tests.factories import expire_lease

    payment = due_payment(source=people["alice_main"], target=people["bob"], amount=10, seconds_ago=60)
    claim_due(batch=100, lease_seconds=60)
    first = ScheduledPayment.objects.get(pk=payment.pk).claimed_at
    assert review.first_claim(ScheduledPayment.objects.get(pk=payment.pk), []) == review.FirstClaim(
        first, "the payment's claimed_at")
    expire_lease(payment)
    claim_due(batch=100, lease_seconds=60)
    assert execute_batch(pairs=[(payment.pk, 1)], worker="w1").stale  # the superseded attempt, late
    execute_batch(pairs=[(payment.pk, 2)], worker="w2")
    response = admin_client_for(superuser).get(change_url(payment))
    timeline = response.context["timeline"]
    whats = [str(entry.what) for entry in timeline]
    assert whats[:2] == ["created → SCHEDULED", "claimed SCHEDULED → EXECUTING"]
    assert timeline[1].at == first and timeline[1].detail.endswith("the second claim's previous_claimed_at")
    assert whats[2].startswith("attempt 1:") and ">stale<" in whats[2]
    assert whats[3] == "reclaimed" and timeline[3].detail.startswith("attempt 2; previous_claimed_at: ")
    assert whats[4].startswith("attempt 2:") and ">executed<" in whats[4]
    assert whats[5] == "executed EXECUTING → EXECUTED"
    # A payment claimed before the change has its own "claimed" event: nothing is made up.
    events = list(PaymentEvent.objects.filter(payment_id=payment.pk))
    legacy = PaymentEvent(kind=PaymentEvent.Kind.CLAIMED, attempt=1)
    assert review.first_claim(ScheduledPayment.objects.get(pk=payment.pk), [*events, legacy]) is None


def test_the_timeline_leaves_out_what_the_user_may_not_see(people, payments):
    from django.contrib.auth.models import Permission

    viewer = UserFactory(is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_scheduledpayment"))
    response = admin_client_for(viewer).get(change_url(payments["small"]))
    assert response.status_code == 200
    assert response.context["timeline"] == []
    assert "Not shown: events and attempts" in response.content.decode()


def test_the_status_decides_the_buttons_each_leading_to_its_confirmation_page(superuser, settings, people):
    scheduled = future_payment(source=people["alice_main"], target=people["bob"])
    parked = parked_payment(settings, source=people["carol"], target=people["bob"])
    client = admin_client_for(superuser)
    page = client.get(change_url(scheduled)).content.decode()
    cancel = reverse("admin:payments_scheduledpayment_cancel", args=[scheduled.pk])
    assert f'href="{cancel}"' in page and 'id="dp-redrive"' not in page
    parked_page = client.get(change_url(parked)).content.decode()
    for act in ("redrive", "resolve", "cancel"):
        assert f'href="{reverse(f"admin:payments_scheduledpayment_{act}", args=[parked.pk])}"' in parked_page
    assert "attempts_exhausted" in parked_page  # the review reason, at the top
    confirm = client.get(reverse("admin:payments_scheduledpayment_redrive", args=[parked.pk]))
    assert confirm.status_code == 200 and 'name="reason"' in confirm.content.decode()


# --- item 2: the list ---------------------------------------------------------------------


def test_from_and_to_name_the_account_and_its_owner(superuser, payments):
    html = admin_client_for(superuser).get(CHANGELIST).content.decode()
    assert re.search(r">Savings</a> <span class=\"dp-quiet\">· alice</span>", html)
    assert re.search(r">Household</a> <span class=\"dp-quiet\">· bob</span>", html)
    assert "1,234,567" in html


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ("ali", ("small", "large", "to_alice")),  # a username prefix, either side
        ("Sav", ("large",)),  # an account name prefix
        ("sav", ("large",)),  # account names: any case
        ("car", ("carols", "to_alice")),
        ("zzz", ()),
    ],
)
def test_search_by_partial_username_or_account_name(superuser, payments, term, expected):
    assert listed(admin_client_for(superuser).get(CHANGELIST, {"q": term})) == names(payments, *expected)


def test_search_takes_pasted_ids_separated_by_spaces_or_commas(superuser, payments):
    client = admin_client_for(superuser)
    pasted = f"{payments['small'].pk}, {payments['carols'].pk},{payments['large'].pk}"
    response = client.get(CHANGELIST, {"q": pasted})
    assert listed(response) == names(payments, "small", "carols", "large")
    assert messages_of(response) == []


def test_search_says_how_many_of_the_pasted_ids_it_took(superuser, payments, monkeypatch):
    monkeypatch.setattr(display, "MAX_SEARCH_TERMS", 2)
    pasted = " ".join([payments["small"].pk, payments["carols"].pk, payments["large"].pk, "pay_x"])
    response = admin_client_for(superuser).get(CHANGELIST, {"q": pasted})
    assert listed(response) == names(payments, "small", "carols")
    assert messages_of(response) == ["4 ids or names pasted, the first 2 searched."]


def test_a_name_prefix_matching_too_many_accounts_says_so(superuser, payments, monkeypatch):
    monkeypatch.setattr(display, "MAX_PREFIX_ACCOUNTS", 1)
    response = admin_client_for(superuser).get(CHANGELIST, {"q": "a"})  # alice's two accounts
    assert response.status_code == 200
    assert any("more than 1 accounts" in m for m in messages_of(response))


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"account": "alice_main", "direction": "out"}, ("small",)),
        ({"account": "alice_main", "direction": "in"}, ("to_alice",)),
        ({"account": "alice_main"}, ("small", "to_alice")),
        ({"account": "bob", "direction": "in"}, ("small", "large", "carols")),
        ({"account": "bob", "direction": "in", "amount_min": "100"}, ("large", "carols")),
        ({"account": "bob", "direction": "in", "amount_min": "100", "amount_max": "700"}, ("carols",)),
        ({"account": "bob", "amount_max": "1,000"}, ("small", "carols")),
        ({"q": "bob", "amount_min": "1000000"}, ("large",)),
    ],
)
def test_direction_relative_to_an_account_and_the_amount_range(superuser, people, payments, query, expected):
    query = {k: people[v].pk if k == "account" else v for k, v in query.items()}
    assert listed(admin_client_for(superuser).get(CHANGELIST, query)) == names(payments, *expected)


def test_an_amount_range_alone_is_not_applied_and_says_why(superuser, payments):
    response = admin_client_for(superuser).get(CHANGELIST, {"amount_min": "100"})
    assert listed(response) == names(payments, *payments)
    assert any("on its own it would read every payment" in m for m in messages_of(response))


def test_a_bad_amount_is_a_message_not_an_error(superuser, people, payments):
    response = admin_client_for(superuser).get(
        CHANGELIST, {"account": people["bob"].pk, "amount_min": "lots"}
    )
    assert listed(response) == names(payments, "small", "large", "carols")
    assert any("amount_min='lots' is not an amount" in m for m in messages_of(response))


def test_the_due_date_range_takes_dates_and_times_in_utc(superuser, payments):
    client = admin_client_for(superuser)
    now = timezone.now().astimezone(UTC)
    in_5_days = (now + timedelta(days=5)).date().isoformat()
    in_15_days = (now + timedelta(days=15)).date().isoformat()
    assert listed(client.get(CHANGELIST, {"due_to": in_5_days})) == names(payments, "small", "large")
    assert listed(client.get(CHANGELIST, {"due_from": in_5_days, "due_to": in_15_days})) == names(
        payments, "carols"
    )
    assert listed(client.get(CHANGELIST, {"due_from": in_15_days})) == names(payments, "to_alice")
    bad = client.get(CHANGELIST, {"due_from": "yesterday"})
    assert listed(bad) == names(payments, *payments)
    assert any("due_from='yesterday' is not a date" in m for m in messages_of(bad))


def test_the_due_date_range_combines_with_status(superuser, payments):
    ScheduledPayment.objects.filter(pk=payments["small"].pk).update(
        status=PaymentStatus.CANCELLED, cancelled_at=timezone.now()
    )
    tomorrow = (timezone.now() + timedelta(days=1)).astimezone(UTC).date().isoformat()
    client = admin_client_for(superuser)
    assert listed(client.get(CHANGELIST, {"due_to": tomorrow, "status__exact": "CANCELLED"})) == names(
        payments, "small"
    )
    assert listed(client.get(CHANGELIST, {"due_to": tomorrow, "status__exact": "SCHEDULED"})) == set()


def test_parse_due_reads_a_day_as_the_whole_day():
    assert parse_due("2026-12-01", end=False) == datetime(2026, 12, 1, tzinfo=UTC)
    assert parse_due("2026-12-01", end=True) == datetime(2026, 12, 2, tzinfo=UTC)
    assert parse_due("2026-12-01 14:00", end=True) == datetime(2026, 12, 1, 14, tzinfo=UTC)
    assert parse_due("2026-13-01", end=False) is None
    assert parse_due("soon", end=False) is None


def test_a_nul_in_a_parameter_is_a_message_not_an_error(superuser, payments):
    client = admin_client_for(superuser)
    for url in (CHANGELIST, EXPORT):
        response = client.get(url, {"q": "a\x00b"}, follow=True)
        assert response.status_code == 200
        assert any("NUL" in m for m in messages_of(response))


def test_the_last_day_there_is_has_no_day_after():
    assert parse_due("9999-12-31", end=True) is None


def test_one_off_or_recurring(superuser, people, payments):
    rec = recurring_create(
        payer=people["carol"].owner, from_account_id=people["carol"].id, to_account_id=people["bob"].id, amount=3,
        start_at=timezone.now() + timedelta(minutes=5), interval="P1D",
    )
    occurrences = set(ScheduledPayment.objects.filter(recurring=rec).values_list("pk", flat=True))
    assert occurrences  # the series schedules its first occurrence
    client = admin_client_for(superuser)
    assert listed(client.get(CHANGELIST, {"recurrence": "recurring"})) == occurrences
    assert listed(client.get(CHANGELIST, {"recurrence": "one_off"})) == names(payments, *payments)


def test_the_list_shows_as_of_saved_views_and_an_opt_in_refresh(superuser, payments):
    client = admin_client_for(superuser)
    html = client.get(CHANGELIST).content.decode()
    assert re.search(r"as of \d\d:\d\d:\d\d UTC", html)
    assert 'http-equiv="refresh"' not in html
    assert f'href="{CHANGELIST}?status__exact=FAILED&amp;due=today"' in html
    assert f'href="{CHANGELIST}?status__exact=NEEDS_REVIEW"' in html
    assert f'href="{CHANGELIST}?due=overdue"' in html
    assert f'href="{CHANGELIST}?refresh=10"' in html
    refreshing = client.get(CHANGELIST, {"refresh": "10", "status__exact": "SCHEDULED"})
    assert listed(refreshing) == names(payments, *payments)
    page = refreshing.content.decode()
    assert '<meta http-equiv="refresh" content="10">' in page
    assert f'href="{EXPORT}?status__exact=SCHEDULED"' in page  # the export leaves the refresh out
    silly = client.get(CHANGELIST, {"refresh": "1"})
    assert 'http-equiv="refresh"' not in silly.content.decode()
    assert any("refresh='1'" in m for m in messages_of(silly))


def test_every_page_of_the_console_renders_with_the_new_filters_together(superuser, people, payments):
    query = {
        "status__exact": "SCHEDULED", "account": people["bob"].pk, "direction": "in", "amount_min": "1",
        "amount_max": "100000000", "due_from": "2000-01-01", "due_to": "2100-01-01", "recurrence": "one_off",
        "q": "ali", "refresh": "30",
    }
    response = admin_client_for(superuser).get(CHANGELIST, query)
    assert listed(response) == names(payments, "small", "large")


# --- the CSV export -----------------------------------------------------------------------


def test_the_export_streams_the_filtered_list_with_ids_as_the_api_shows_them(superuser, people, payments):
    response = admin_client_for(superuser).get(EXPORT, {"status__exact": "SCHEDULED", "q": "carol"})
    rows = exported(response)
    assert rows[0][:4] == ["payment_id", "status", "amount", "from_account"]
    body = {row[0]: row for row in rows[1:]}
    assert set(body) == names(payments, "carols", "to_alice")
    carols = body[payments["carols"].pk]
    assert carols[1:4] == ["SCHEDULED", "700", people["carol"].pk]
    assert carols[4:9] == ["Carol's purse", "carol", people["bob"].pk, "Household", "bob"]
    assert carols[11].endswith("Z")  # execute_at as the API renders it
    today = timezone.now().astimezone(UTC).date().isoformat()
    assert response["Content-Disposition"] == (
        f'attachment; filename="payments_q-carol_status-SCHEDULED_{today}.csv"'
    )
    assert response["X-Row-Cap"] == "100000"


def test_the_export_says_where_it_was_cut(superuser, payments, monkeypatch):
    monkeypatch.setattr(admin_payments, "MAX_EXPORT_ROWS", 2)
    rows = exported(admin_client_for(superuser).get(EXPORT))
    assert len(rows) == 1 + 2 + 1
    assert rows[-1] == ["# cut at 2 rows: narrow the filter to export the rest"]


def test_the_export_keeps_spreadsheet_formulas_out(superuser):
    mallory = UserFactory(username="mallory")
    source = funded_account(owner=mallory, balance=100, name="=HYPERLINK(1)")
    future_payment(source=source, target=funded_account())
    rows = exported(admin_client_for(superuser).get(EXPORT))
    assert rows[1][4] == "'=HYPERLINK(1)"


def test_the_export_file_name_carries_the_filter():
    params = {"status__exact": "FAILED", "p": "3", "refresh": "10", "q": "a b/c"}
    assert export_filename(params, today=datetime(2026, 12, 1).date()) == (
        "payments_q-a-b-c_status-FAILED_2026-12-01.csv"
    )
    assert export_filename({}, today=datetime(2026, 12, 1).date()) == "payments_2026-12-01.csv"


def test_the_export_needs_the_view_permission(staff_groups, payments):
    nobody = UserFactory(is_staff=True)
    assert admin_client_for(nobody).get(EXPORT).status_code == 403
    assert admin_client_for(UserFactory()).get(EXPORT).status_code == 302  # not staff: the login page


def test_the_export_with_a_bad_filter_says_so(superuser, payments):
    response = admin_client_for(superuser).get(EXPORT, {"no_such_field": "1"}, follow=True)
    assert response.status_code == 200
    assert any("nothing was exported" in m for m in messages_of(response))


# --- item 3: ids in URLs as the API shows them --------------------------------------------


def test_payment_urls_carry_the_id_as_is_and_the_quoted_form_still_works(superuser, payments):
    payment = payments["small"]
    client = admin_client_for(superuser)
    plain = f"/admin/payments/scheduledpayment/{payment.pk}/change/"
    assert change_url(payment) == plain
    assert client.get(plain).status_code == 200
    assert client.get(reverse("admin:payments_scheduledpayment_change", args=[quote(payment.pk)])).status_code == 200
    html = client.get(CHANGELIST).content.decode()
    assert f'href="{plain}"' in html
    assert "_5F" not in html
    assert id_in_url("pay_01ABC") == "pay_01ABC" and id_in_url("a/b") == quote("a/b")


def test_recurring_urls_carry_the_id_as_is(superuser, people):
    rec = recurring_create(
        payer=people["carol"].owner, from_account_id=people["carol"].id, to_account_id=people["bob"].id, amount=3,
        start_at=timezone.now() + timedelta(hours=1), interval="P1D",
    )
    client = admin_client_for(superuser)
    plain = reverse("admin:payments_recurringpayment_change", args=[rec.pk])
    assert f'href="{plain}"' in client.get(reverse("admin:payments_recurringpayment_changelist")).content.decode()
    page = client.get(plain).content.decode()
    assert reverse("admin:payments_recurringpayment_pause", args=[rec.pk]) in page


def test_a_deep_page_is_read_as_a_deferred_join_with_the_same_rows_in_the_same_order(superuser, monkeypatch):
    """From DEFERRED_JOIN_FROM_ROW on, a page reads its ids first, then those rows: the
    same rows, in the list's order, as OFFSET would give (and the changelist renders them)."""
    from common import admin_tools
    from payments.models import ScheduledPayment

    source, target = funded_account(balance=100), funded_account()
    for minutes in range(1, 26):
        future_payment(source=source, target=target, minutes=minutes)
    monkeypatch.setattr(admin_tools, "DEFERRED_JOIN_FROM_ROW", 5)
    ordered = ScheduledPayment.objects.select_related("from_account__owner").order_by("-execute_at", "-id")
    paginator = admin_tools.EstimatedCountPaginator(ordered, 10)
    for number in (1, 2, 3):
        page = paginator.page(number)
        assert [p.pk for p in page.object_list] == [p.pk for p in ordered[(number - 1) * 10:number * 10]]
    assert paginator.page(3).has_next() is False and len(paginator.page(3).object_list) == 5
    from django.contrib import admin

    monkeypatch.setattr(admin.site._registry[ScheduledPayment], "list_per_page", 10)
    response = admin_client_for(superuser).get(CHANGELIST, {"p": 2})  # Django's pages count from 1 here
    assert response.status_code == 200
    listed = [p.pk for p in response.context["cl"].result_list]
    assert listed == [p.pk for p in ScheduledPayment.objects.order_by("-id")[10:20]]
