"""Layout and formatting (issue 36, point 9): human formats from one helper
(common/formats.py) on every console page, and a dashboard whose table and tiles agree."""

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils import timezone

from ledger.models import StaffAction
from ledger.services import account_freeze
from payments.models import PaymentStatus
from payments.promoter import claim_due
from payments.worker import run_batch
from recurring.services import recurring_create
from tests.conftest import admin_client_for
from tests.factories import UserFactory, due_payment, funded_account, parked_payment

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = reverse("admin-dashboard")


# --- the helper ------------------------------------------------------------------------------


# What staff read for insufficient_funds (payments/reasons.py), written out: the tests below
# import nothing of the helper, so they run, and fail, against code without it.
INSUFFICIENT_FUNDS = "Insufficient funds: the sender's balance was below the amount (insufficient_funds)"


def test_human_formats_numbers_times_durations_users_and_codes():
    from common.formats import Coded, human

    assert human(1_000_000_000_000_000) == "1,000,000,000,000,000"
    assert human(datetime(2026, 12, 5, 1, 2, 3, 456789, tzinfo=UTC)) == "2026-12-05 01:02:03 UTC"
    assert human("PT1M", "every") == "every 1 minute"
    assert human("PT1M", "duration") == "1 minute"
    assert human("P1Y2M3W4DT5H6M7S", "duration") == "1 year 2 months 3 weeks 4 days 5 hours 6 minutes 7 seconds"
    assert human("not a duration", "every") == "every not a duration"
    assert human(timedelta(minutes=90)) == "1 hour 30 minutes"
    assert human(UserFactory.build(username="alice")) == "alice"
    assert human(Coded("insufficient_funds", "Insufficient funds")) == "Insufficient funds (insufficient_funds)"
    assert human(None) == human("") == "-"


def test_console_templates_format_through_the_one_filter():
    """No console template formats a number or a time its own way: |human, not |date or
    the old |money (the dashboard's chart labels say "HH:MM" on purpose, from Python)."""
    templates = [*ROOT.glob("console/templates/**/*.html"), *ROOT.glob("templates/admin/**/*.html"),
                 *ROOT.glob("ledger/templates/**/*.html"), *ROOT.glob("webhooks/templates/**/*.html")]
    assert templates
    offenders = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in templates
        for match in re.finditer(r"\|(money|floatformat|intcomma)\b|\|date:\"[^\"]*[sHi][^\"]*\"", path.read_text())
        if "bar.minute" not in path.read_text()[max(match.start() - 40, 0):match.start()]
    ]
    assert offenders == []


# --- the places the issue found -----------------------------------------------------------------


def test_limits_page_shows_its_caps_with_thousands_separators(superuser, settings):
    settings.DELAYPAY_MAX_DAILY_OUTFLOW_PER_USER = 1_000_000_000_000_000
    html = admin_client_for(superuser).get(reverse("admin-limits")).content.decode()
    assert "1,000,000,000,000,000" in html and "1000000000000000" not in html


def test_recurring_rule_reads_as_words(superuser):
    source, target = funded_account(balance=100), funded_account()
    rec = recurring_create(payer=source.owner, from_account_id=source.id, to_account_id=target.id, amount=1,
                           start_at=timezone.now() + timedelta(hours=1), interval="PT1M")
    client = admin_client_for(superuser)
    listed = client.get(reverse("admin:payments_recurringpayment_changelist")).content.decode()
    page = client.get(reverse("admin:payments_recurringpayment_change", args=[rec.pk])).content.decode()
    for html in (listed, page):
        assert "every 1 minute" in html and ">PT1M<" not in html


def test_staff_actions_name_their_actor_not_their_id(superuser):
    alice = UserFactory(username="alice", is_staff=True, is_superuser=True)
    account = funded_account(balance=1)
    account_freeze(account_id=account.pk, frozen=True, actor=alice, reason="fraud report")
    action = StaffAction.objects.get(account=account)
    assert str(action) == "freeze by alice: fraud report"
    html = admin_client_for(superuser).get(
        reverse("admin:ledger_account_change", args=[quote(account.pk)])
    ).content.decode()
    assert "freeze by alice" in html and f"freeze by {alice.pk}" not in html


MICROSECONDS = re.compile(r"\d{2}:\d{2}:\d{2}\.\d+|\d{2}:\d{2}:\d{2}[+-]\d{2}:\d{2}")


def failed_payment():
    poor, target = funded_account(balance=5), funded_account()
    payment = due_payment(source=poor, target=target, amount=1_500)
    run_batch(claim_due(batch=10, lease_seconds=60).fresh, worker="test")
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.FAILED
    return payment


def test_payment_page_times_have_no_microseconds_and_reasons_read_as_sentences(superuser):
    payment = failed_payment()
    client = admin_client_for(superuser)
    html = client.get(reverse("admin:payments_scheduledpayment_change", args=[quote(payment.pk)])).content.decode()
    body = html[html.index('id="content"'):]
    assert MICROSECONDS.findall(body) == []
    assert body.count(INSUFFICIENT_FUNDS.replace("'", "&#x27;")) >= 2  # the field and the timeline's failed event
    assert "1,500" in body


def test_the_payments_list_and_the_dashboard_say_the_failure_reason_in_words(superuser):
    failed_payment()
    client = admin_client_for(superuser)
    sentence = INSUFFICIENT_FUNDS.removesuffix(" (insufficient_funds)").replace("'", "&#x27;")
    listing = client.get(reverse("admin:payments_scheduledpayment_changelist")).content.decode()
    # The list is narrow: the first words and the code, the whole sentence on hover.
    assert ">Insufficient funds (insufficient_funds)<" in listing and f'title="{sentence}' in listing
    dashboard = client.get(DASHBOARD).content.decode()
    assert sentence in dashboard


def test_review_queue_and_its_confirmation_page_keep_the_code_beside_the_sentence(superuser, settings):
    source, target = funded_account(balance=10), funded_account()
    parked = parked_payment(settings, source=source, target=target)
    client = admin_client_for(superuser)
    queue = client.get(reverse("admin:payments_scheduledpayment_changelist"), {"status__exact": "NEEDS_REVIEW"})
    confirm = client.get(reverse("admin:payments_scheduledpayment_redrive", args=[parked.pk]))
    for response in (queue, confirm):
        html = response.content.decode()
        assert "retry budget" in html and "(attempts_exhausted)" in html


# --- the dashboard's table and tiles agree ------------------------------------------------------


def test_dashboard_status_table_agrees_with_its_tiles_while_the_counts_are_cached(superuser, settings):
    """The status table is cached for a minute (a scan of every row); the tiles are live.
    The statuses a tile counts (EXECUTING, NEEDS_REVIEW) are read with the tiles, so a
    payment parked after the table was counted shows in both at once."""
    client = admin_client_for(superuser)
    source, target = funded_account(balance=10), funded_account()
    first = client.get(DASHBOARD)  # the counts are cached from here on
    assert first.context["review"].count == 0
    parked_payment(settings, source=source, target=target)
    response = client.get(DASHBOARD)
    counts = {status: n for status, n, _ in response.context["counts"]}
    assert response.context["review"].count == counts[PaymentStatus.NEEDS_REVIEW] == 1
    health = response.context["health"]
    assert counts[PaymentStatus.EXECUTING] == health.in_flight + health.leases_expired
    html = response.content.decode()
    assert re.search(r'id="dp-count-NEEDS_REVIEW">.*?>1</td>\s*<td class="dp-quiet">live', html, re.S)
    assert re.search(r'id="dp-needs-review">\s*<span class="dp-number">1</span>', html)


def test_audit_lists_and_the_timeline_name_a_user_actor_not_their_id(superuser):
    """An API client's cancel is recorded as actor "user:<id>": the event list, and the
    payment's timeline, say the username."""
    from payments.models import PaymentEvent
    from payments.services import payment_cancel
    from tests.factories import future_payment

    alice = UserFactory(username="alice")
    payment = future_payment(source=funded_account(owner=alice, balance=10), target=funded_account(), payer=alice)
    payment_cancel(payment_id=payment.pk, actor=alice)
    assert PaymentEvent.objects.get(payment=payment, kind="cancelled").actor == f"user:{alice.pk}"
    client = admin_client_for(superuser)
    events = client.get(reverse("admin:payments_paymentevent_changelist")).content.decode()
    page = client.get(reverse("admin:payments_scheduledpayment_change", args=[quote(payment.pk)])).content.decode()
    for html in (events, page):
        assert ">alice<" in html and f"user:{alice.pk}" not in html


def test_the_event_list_names_actors_in_one_query(superuser):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from payments.services import payment_cancel
    from tests.factories import future_payment

    client = admin_client_for(superuser)

    def queries_with(users: int) -> int:
        for _ in range(users):
            owner = UserFactory()
            p = future_payment(source=funded_account(owner=owner, balance=10), target=funded_account(), payer=owner)
            payment_cancel(payment_id=p.pk, actor=owner)
        client.get(reverse("admin:payments_paymentevent_changelist"))
        with CaptureQueriesContext(connection) as ctx:
            client.get(reverse("admin:payments_paymentevent_changelist"))
        return len(ctx.captured_queries)

    assert queries_with(2) == queries_with(10)


def test_the_timeline_and_recurring_events_show_their_data_without_microseconds(superuser):
    """Events store times as ISO 8601 with microseconds (a schedule's execute_at, a
    reschedule's old and new terms, a resume's skipped occurrences): shown as times."""
    from payments.models import RecurringEvent
    from payments.services import payment_schedule, payment_update

    source, target = funded_account(balance=100), funded_account()
    at = timezone.now().replace(microsecond=123456) + timedelta(hours=1)
    payment = payment_schedule(payer=source.owner, from_account_id=source.id, to_account_id=target.id, amount=1_000,
                               execute_at=at)
    payment_update(payment_id=payment.pk, actor=source.owner, amount=2_000, execute_at=at + timedelta(hours=1))
    rec = recurring_create(payer=source.owner, from_account_id=source.id, to_account_id=target.id, amount=1,
                           start_at=at, interval="P1D")
    RecurringEvent.objects.create(recurring=rec, kind="resumed", actor="promoter",
                                  data={"skipped": [at.isoformat(), (at + timedelta(days=1)).isoformat()]})
    client = admin_client_for(superuser)
    page = client.get(reverse("admin:payments_scheduledpayment_change", args=[quote(payment.pk)])).content.decode()
    series = client.get(reverse("admin:payments_recurringpayment_change", args=[rec.pk])).content.decode()
    for html in (page, series):
        body = html[html.index('id="content"'):]
        assert MICROSECONDS.findall(body) == [], MICROSECONDS.findall(body)
    assert human_time(at) in page and "2,000" in page
    assert human_time(at) in series


def human_time(at) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
