"""Recurring payments in the operations console: list, inspect; pause, resume and end, each
through a confirmation page with a reason."""

from datetime import timedelta

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils import timezone

from common.admin_tools import CONFIRMED, LatestRowsInlineFormSet
from payments.models import PaymentStatus, RecurringEvent, RecurringPayment, RecurringStatus, ScheduledPayment
from payments.services import payment_cancel, payment_schedule
from recurring.services import recurring_create, recurring_end, recurring_generate_due
from tests.conftest import admin_client_for
from tests.factories import UserFactory, funded_account

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:payments_recurringpayment_changelist")


def change_url(rec) -> str:
    return reverse("admin:payments_recurringpayment_change", args=[quote(rec.pk)])


def button_url(rec, action: str) -> str:
    return reverse(f"admin:payments_recurringpayment_{action}", args=[quote(rec.pk)])


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def make(source, target, **kwargs):
    kwargs.setdefault("start_at", timezone.now() + timedelta(hours=1))
    kwargs.setdefault("interval", "P1D")
    return recurring_create(
        payer=source.owner, from_account_id=source.id, to_account_id=target.id, amount=kwargs.pop("amount", 10),
        **kwargs,
    )


@pytest.fixture
def series():
    a, b = funded_account(balance=100), funded_account()
    rows = {
        "daily": make(a, b),
        "weekly_cron": make(a, b, interval="", cron="0 12 * * FRI", timezone="Europe/Berlin"),
        "ended": make(a, b),
    }
    recurring_end(recurring_id=rows["ended"].pk, actor=a.owner)
    return {k: RecurringPayment.objects.get(pk=v.pk) for k, v in rows.items()}


def action(client, name, *recs):
    return client.post(CHANGELIST, {"action": name, "_selected_action": [r.pk for r in recs]}, follow=True)


def test_changelist_lists_rule_status_and_next_occurrence(superuser, series):
    response = admin_client_for(superuser).get(CHANGELIST)
    assert response.status_code == 200
    assert {str(r.pk) for r in response.context["cl"].result_list} == {r.pk for r in series.values()}
    html = response.content.decode()
    assert "cron 0 12 * * FRI (Europe/Berlin)" in html and ">every 1 day<" in html  # P1D in words
    assert 'dp-badge dp-green">ACTIVE' in html and 'dp-badge dp-grey">ENDED' in html
    ended = admin_client_for(superuser).get(CHANGELIST, {"status__exact": "ENDED"})
    assert [r.pk for r in ended.context["cl"].result_list] == [series["ended"].pk]


def test_search_by_recurring_id_account_or_owner(superuser, series):
    client = admin_client_for(superuser)
    found = client.get(CHANGELIST, {"q": series["daily"].pk}).context["cl"].result_list
    assert [r.pk for r in found] == [series["daily"].pk]
    by_owner = client.get(CHANGELIST, {"q": series["daily"].payer.username}).context["cl"].result_list
    assert len(by_owner) == 3
    assert not client.get(CHANGELIST, {"q": "rec_nothing"}).context["cl"].result_list


def test_detail_page_is_read_only_with_occurrences_and_events_inline(superuser, series):
    rec = series["daily"]
    response = admin_client_for(superuser).get(change_url(rec))
    assert response.status_code == 200
    html = response.content.decode()
    assert response.context["adminform"].form.fields == {}
    assert 'name="_save"' not in html
    formsets = {f.opts.model.__name__: f for f in response.context["inline_admin_formsets"]}
    assert set(formsets) == {"ScheduledPayment", "RecurringEvent"}
    (occurrence,) = ScheduledPayment.objects.filter(recurring=rec)
    assert occurrence.pk in html and "generated" in html and "created" in html
    assert f"?q={rec.pk}" in html  # every payment of the series, in the payments list
    payments = admin_client_for(superuser).get(reverse("admin:payments_scheduledpayment_changelist"), {"q": rec.pk})
    assert [p.pk for p in payments.context["cl"].result_list] == [occurrence.pk]


def test_the_inlines_show_only_the_latest_rows(superuser, monkeypatch):
    monkeypatch.setattr(LatestRowsInlineFormSet, "max_rows", 2)
    a, b = funded_account(), funded_account()
    rec = make(a, b, start_at=timezone.now() + timedelta(minutes=5))
    for _ in range(3):  # three more occurrences, as if each previous one had fallen due
        RecurringPayment.objects.filter(pk=rec.pk).update(last_occurrence_at=timezone.now() - timedelta(hours=1))
        recurring_generate_due()
    response = admin_client_for(superuser).get(change_url(rec))
    occurrences = next(f for f in response.context["inline_admin_formsets"] if f.opts.model is ScheduledPayment)
    shown = [form.instance.occurrence_at for form in occurrences.formset.forms]
    newest = list(ScheduledPayment.objects.filter(recurring=rec).order_by("-occurrence_at")[:2])
    assert shown == [p.occurrence_at for p in newest]


def confirmed(client, name, *recs, reason="customer asked"):
    """A list action's confirmation page, submitted with ``reason``."""
    return client.post(CHANGELIST, {
        "action": name, "_selected_action": [r.pk for r in recs], CONFIRMED: "1", "reason": reason,
    }, follow=True)


def test_pause_and_resume_actions_ask_first_and_record_the_reason_on_the_event(support_user, series):
    """Pausing cancels a scheduled payment: like every act that ends one, it shows what
    will change and asks for a reason first, and the reason is on the series' event."""
    client = admin_client_for(support_user)
    rec = series["daily"]
    page = action(client, "pause_selected", rec, series["ended"])
    assert page.templates[0].name == "admin/confirm_act.html"
    assert (page.context["count"], page.context["affected"]) == (2, 1)
    assert "ENDED: cannot be paused" in page.content.decode()
    assert RecurringPayment.objects.get(pk=rec.pk).status == RecurringStatus.ACTIVE  # nothing yet
    no_reason = confirmed(client, "pause_selected", rec, reason="")
    assert no_reason.context["form"].errors["reason"]
    assert RecurringPayment.objects.get(pk=rec.pk).status == RecurringStatus.ACTIVE

    response = confirmed(client, "pause_selected", rec, reason="payer disputes the amount")
    assert messages_of(response) == [f"Paused: {rec.pk}."]
    rec.refresh_from_db()
    assert rec.status == RecurringStatus.PAUSED
    assert not ScheduledPayment.objects.filter(recurring=rec, status=PaymentStatus.SCHEDULED).exists()
    event = RecurringEvent.objects.get(recurring=rec, kind="paused")
    assert (event.actor, event.actor_user) == (f"user:{support_user.pk}", support_user)
    assert event.data["reason"] == "payer disputes the amount"

    page = action(client, "resume_selected", rec, series["ended"])
    assert page.templates[0].name == "admin/confirm_act.html" and page.context["affected"] == 1
    response = confirmed(client, "resume_selected", rec, series["ended"], reason="dispute settled")
    assert messages_of(response) == [f"Resumed: {rec.pk}.", f"Refused: {series['ended'].pk} is ENDED."]
    rec.refresh_from_db()
    assert rec.status == RecurringStatus.ACTIVE
    assert ScheduledPayment.objects.filter(recurring=rec, status=PaymentStatus.SCHEDULED).count() == 1
    assert RecurringEvent.objects.get(recurring=rec, kind="resumed").data["reason"] == "dispute settled"
    # Nothing listed would change: refused before any service runs (the confirmation pages'
    # rule), the reason not recorded.
    assert messages_of(confirmed(client, "resume_selected", rec)) == [
        "Resume: none of the 1 recurring payment listed would change (already ACTIVE); nothing was done "
        "and your reason was not recorded."
    ]


def test_an_occurrence_cancelled_on_its_own_stays_cancelled_across_an_admin_pause_and_resume(support_user, series):
    rec = series["daily"]
    (cancelled,) = ScheduledPayment.objects.filter(recurring=rec)
    payment_cancel(payment_id=cancelled.id, actor=rec.payer)  # the payer skips this one
    client = admin_client_for(support_user)
    assert messages_of(confirmed(client, "pause_selected", rec)) == [f"Paused: {rec.pk}."]
    assert messages_of(client.post(button_url(rec, "resume"), {CONFIRMED: "1", "reason": "r"}, follow=True))
    rec.refresh_from_db()
    assert rec.status == RecurringStatus.ACTIVE
    assert list(ScheduledPayment.objects.filter(recurring=rec).values_list("id", "status")) == [
        (cancelled.id, PaymentStatus.CANCELLED)
    ]
    assert rec.next_occurrence_at == cancelled.occurrence_at + timedelta(days=1)
    resumed = RecurringEvent.objects.get(recurring=rec, kind="resumed")
    assert resumed.data["kept_cancelled"] == [
        {"payment_id": cancelled.id, "occurrence_at": cancelled.occurrence_at.isoformat()}
    ]


def test_pause_and_resume_buttons_open_the_confirmation_page(support_user, series):
    rec = series["daily"]
    client = admin_client_for(support_user)
    page = client.get(change_url(rec)).content.decode()
    assert 'id="dp-pause-series"' in page and 'id="dp-resume-series"' not in page
    asked = client.get(button_url(rec, "pause"))  # a GET shows the page, changes nothing
    assert asked.status_code == 200 and asked.templates[0].name == "admin/confirm_act.html"
    assert asked.context["rows"][0].cells[-1] == 1  # the scheduled occurrence the pause cancels
    bare = client.post(button_url(rec, "pause"))  # the old one-click POST: the page again
    assert bare.status_code == 200 and bare.templates[0].name == "admin/confirm_act.html"
    assert RecurringPayment.objects.get(pk=rec.pk).status == RecurringStatus.ACTIVE
    response = client.post(button_url(rec, "pause"), {CONFIRMED: "1", "reason": "fraud report"}, follow=True)
    assert response.redirect_chain[-1][0] == reverse("admin:payments_recurringpayment_change", args=[rec.pk])
    assert messages_of(response) == [f"Paused: {rec.pk}."]
    html = response.content.decode()
    assert 'id="dp-resume-series"' in html and 'id="dp-pause-series"' not in html
    asked = client.get(button_url(rec, "resume"))
    assert asked.context["rows"][0].cells[-1] != "-"  # paused since
    response = client.post(button_url(rec, "resume"), {CONFIRMED: "1", "reason": "cleared"}, follow=True)
    assert messages_of(response) == [f"Resumed: {rec.pk}."]
    ended = client.get(change_url(series["ended"])).content.decode()
    assert "dp-pause-series" not in ended and "dp-resume-series" not in ended


def test_staff_without_the_pause_permission_can_read_but_not_pause(auditor_user, series):
    rec = series["daily"]
    client = admin_client_for(auditor_user)
    listing = client.get(CHANGELIST)
    assert listing.status_code == 200 and "pause_selected" not in listing.content.decode()
    assert "dp-pause-series" not in client.get(change_url(rec)).content.decode()
    assert action(client, "pause_selected", rec).status_code == 403
    assert client.get(button_url(rec, "pause")).status_code == 403
    assert client.post(button_url(rec, "pause"), {CONFIRMED: "1", "reason": "x"}).status_code == 403
    rec.refresh_from_db()
    assert rec.status == RecurringStatus.ACTIVE
    assert not RecurringEvent.objects.filter(recurring=rec, kind="paused").exists()


def test_no_add_change_or_delete(superuser, series):
    client = admin_client_for(superuser)
    assert client.get(reverse("admin:payments_recurringpayment_add")).status_code == 403
    delete = reverse("admin:payments_recurringpayment_delete", args=[quote(series["daily"].pk)])
    assert client.get(delete).status_code == 403
    before = RecurringPayment.objects.filter(pk=series["daily"].pk).values().get()
    response = client.post(change_url(series["daily"]), {"amount": 999, "status": "ENDED", "_save": "Save"})
    assert response.status_code == 403
    assert RecurringPayment.objects.filter(pk=series["daily"].pk).values().get() == before
    choices = client.get(CHANGELIST).context["action_form"].fields["action"].choices
    assert [name for name, _ in choices if name] == ["pause_selected", "resume_selected", "end_selected"]


def test_non_staff_cannot_pause(series):
    rec = series["daily"]
    response = admin_client_for(rec.payer).post(button_url(rec, "pause"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("admin:login"))
    rec.refresh_from_db()
    assert rec.status == RecurringStatus.ACTIVE


def test_recurring_events_list_searches_by_recurring_id(superuser, series):
    response = admin_client_for(superuser).get(
        reverse("admin:payments_recurringevent_changelist"), {"q": series["ended"].pk}
    )
    assert {e.kind for e in response.context["cl"].result_list} == {"created", "generated", "ended"}


def test_payment_detail_shows_jitter_expiry_and_its_series(superuser, series):
    a, b = funded_account(), funded_account()
    jittered = payment_schedule(
        payer=a.owner, from_account_id=a.id, to_account_id=b.id, amount=5,
        execute_at=timezone.now() + timedelta(hours=1), jitter_seconds=120, expires_after=timedelta(minutes=30),
    )
    client = admin_client_for(superuser)
    html = client.get(reverse("admin:payments_scheduledpayment_change", args=[quote(jittered.pk)])).content.decode()
    for label in ("requested execute at", "jitter seconds", "expires after", "occurrence at"):
        assert label in html.lower(), label
    assert ">120<" in html and "30 minutes" in html  # expires_after in words, not 0:30:00
    occurrence = ScheduledPayment.objects.get(recurring=series["daily"])
    html = client.get(reverse("admin:payments_scheduledpayment_change", args=[quote(occurrence.pk)])).content.decode()
    # linked to its recurring payment, the id as the API shows it
    assert reverse("admin:payments_recurringpayment_change", args=[series["daily"].pk]) in html


def test_staff_without_any_permission_sees_no_recurring_payments(series):
    client = admin_client_for(UserFactory(is_staff=True))
    assert client.get(CHANGELIST).status_code == 403


def test_an_oversized_selection_changes_nothing(support_user, series, monkeypatch):
    monkeypatch.setattr("console.admin.recurring.RecurringPaymentAdmin.max_rows_per_act", 1)
    response = confirmed(admin_client_for(support_user), "pause_selected", series["daily"], series["weekly_cron"])
    assert messages_of(response) == ["Select at most 1 recurring payments per pause; nothing changed."]
    assert RecurringPayment.objects.filter(status=RecurringStatus.ACTIVE).count() == 2


# --- ending a series from the console: a confirmation page with a reason ------------------------


def occurrence_of(rec) -> ScheduledPayment:
    return ScheduledPayment.objects.get(recurring_id=rec.pk, status=PaymentStatus.SCHEDULED)


def test_end_button_asks_for_a_reason_then_ends_the_series_and_cancels_its_occurrence(support_user, series):
    rec = series["daily"]
    occurrence = occurrence_of(rec)
    client = admin_client_for(support_user)
    end_url = button_url(rec, "end")
    assert f'href="{reverse("admin:payments_recurringpayment_end", args=[rec.pk])}"' in client.get(
        change_url(rec)
    ).content.decode()
    page = client.get(end_url)  # a GET shows the confirmation page, changes nothing
    assert page.status_code == 200 and page.templates[0].name == "admin/confirm_act.html"
    assert page.context["affected"] == 1
    missing = client.post(end_url, {CONFIRMED: "1", "reason": ""})
    assert missing.status_code == 200 and missing.context["form"].errors["reason"]
    assert RecurringPayment.objects.get(pk=rec.pk).status == RecurringStatus.ACTIVE

    done = client.post(end_url, {CONFIRMED: "1", "reason": "card holder deceased"}, follow=True)
    assert done.redirect_chain[-1][0] == reverse("admin:payments_recurringpayment_change", args=[rec.pk])
    assert messages_of(done) == [f"Ended: {rec.pk}."]
    assert RecurringPayment.objects.get(pk=rec.pk).status == RecurringStatus.ENDED
    occurrence.refresh_from_db()
    assert occurrence.status == PaymentStatus.CANCELLED
    event = RecurringEvent.objects.get(recurring=rec, kind=RecurringEvent.Kind.ENDED)
    assert event.data["reason"] == "card holder deceased" and event.actor_user == support_user
    assert 'id="dp-end-series"' not in done.content.decode()  # an ended series has no End button


def test_end_selected_ends_several_and_reports_the_already_ended(support_user, series):
    client = admin_client_for(support_user)
    picked = [series["daily"], series["weekly_cron"], series["ended"]]
    page = action(client, "end_selected", *picked)
    assert page.context["count"] == 3 and page.context["affected"] == 2
    done = client.post(CHANGELIST, {
        "action": "end_selected", "_selected_action": [r.pk for r in picked], CONFIRMED: "1", "reason": "fraud",
    }, follow=True)
    texts = messages_of(done)
    assert any(t.startswith("Ended: ") and series["daily"].pk in t and series["weekly_cron"].pk in t for t in texts)
    assert f"Already ENDED: {series['ended'].pk}." in texts
    statuses = set(RecurringPayment.objects.filter(pk__in=[r.pk for r in picked]).values_list("status", flat=True))
    assert statuses == {RecurringStatus.ENDED}


def test_staff_without_the_pause_permission_may_not_end(auditor_user, series):
    rec = series["daily"]
    client = admin_client_for(auditor_user)
    assert 'id="dp-end-series"' not in client.get(change_url(rec)).content.decode()
    assert client.get(button_url(rec, "end")).status_code == 403
    assert client.post(button_url(rec, "end"), {CONFIRMED: "1", "reason": "x"}).status_code == 403
    assert RecurringPayment.objects.get(pk=rec.pk).status == RecurringStatus.ACTIVE


def test_next_payment_due_is_the_scheduled_occurrence_not_the_one_after_it(superuser, series):
    """The series' first occurrence is scheduled an hour ahead; next_occurrence_at is the
    day after (generated once that one falls due): the console says the former."""
    from common.formats import human

    rec = series["daily"]
    occurrence = occurrence_of(rec)
    assert rec.next_occurrence_at > occurrence.execute_at
    response = admin_client_for(superuser).get(CHANGELIST)
    admin_obj = response.context["cl"].model_admin
    assert admin_obj.next_due_col(rec) == human(occurrence.execute_at)
    assert human(occurrence.execute_at) in response.content.decode()
    assert admin_obj.next_due_col(series["ended"]) == "-"
    page = admin_client_for(superuser).get(change_url(rec)).content.decode().lower()
    assert "next payment due (utc)" in page and "generated when the next payment falls due" in page
