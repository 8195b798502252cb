"""The payments operations console, through Django's test client."""

import io
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.db import connection
from django.db.models import Max, Min
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from common.admin_tools import ActionPermissionAdminMixin, EstimatedCountPaginator, id_in_url
from console.admin.payments import ScheduledPaymentAdmin
from console.templatetags.payments_admin import datetime_span
from ledger.models import StaffAction, Transfer
from payments.execution import execute_batch
from payments.models import PaymentEvent, PaymentStatus, ScheduledPayment
from payments.promoter import claim_due
from payments.selectors import payment_execute_at_bounds
from payments.services import payment_cancel
from tests.conftest import admin_client_for
from tests.factories import AccountFactory, UserFactory, due_payment, expire_lease, funded_account, future_payment

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:payments_scheduledpayment_changelist")


def change_url(payment) -> str:
    return reverse("admin:payments_scheduledpayment_change", args=[id_in_url(payment.pk)])


def cancel_url(payment) -> str:
    """As the payment page links it: the id as the API shows it (the quoted form works too)."""
    return reverse("admin:payments_scheduledpayment_cancel", args=[payment.pk])


def run_due(*payments):
    """Claim and execute these (already due) payments, as promoter and worker would."""
    wanted = {p.pk for p in payments}
    claim = claim_due(batch=1000, lease_seconds=60)
    execute_batch(pairs=[pair for pair in claim.fresh + claim.reclaimed if pair[0] in wanted], worker="w1")
    for p in payments:
        p.refresh_from_db()


def listed_ids(response) -> set[str]:
    return {str(obj.pk) for obj in response.context["cl"].result_list}


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


@pytest.fixture
def accounts():
    return funded_account(balance=1_000), funded_account()


@pytest.fixture
def zoo(accounts):
    """One payment in every interesting state."""
    a, b = accounts
    broke = funded_account(balance=0)
    rows = {
        "future": future_payment(source=a, target=b, minutes=30),
        "far_future": future_payment(source=a, target=b, minutes=60 * 24 * 3),
        "executed": due_payment(source=a, target=b, amount=100, seconds_ago=120),
        "failed": due_payment(source=broke, target=b, amount=5, seconds_ago=120),
    }
    run_due(rows["executed"], rows["failed"])
    rows["stuck"] = due_payment(source=a, target=b, amount=7, seconds_ago=120)
    rows["in_flight"] = due_payment(source=a, target=b, amount=8, seconds_ago=120)
    claim_due(batch=1000, lease_seconds=600)
    expire_lease(rows["stuck"])  # its worker died: the lease ran out
    rows["overdue"] = due_payment(source=a, target=b, amount=9, seconds_ago=120)
    rows["cancelled"] = future_payment(source=a, target=b, minutes=45)
    payment_cancel(payment_id=rows["cancelled"].pk, actor=a.owner)
    for p in rows.values():
        p.refresh_from_db()
    assert rows["stuck"].status == rows["in_flight"].status == PaymentStatus.EXECUTING
    assert (rows["executed"].status, rows["failed"].status) == (PaymentStatus.EXECUTED, PaymentStatus.FAILED)
    return rows


def ids(zoo, *names) -> set[str]:
    return {zoo[n].pk for n in names}


# --- changelist -----------------------------------------------------------------------


def test_changelist_shows_every_column_with_a_status_badge(superuser, zoo):
    response = admin_client_for(superuser).get(CHANGELIST)
    assert response.status_code == 200
    assert listed_ids(response) == ids(zoo, *zoo)
    html = response.content.decode()
    assert '<span class="dp-badge dp-green">EXECUTED</span>' in html
    assert '<span class="dp-badge dp-red">FAILED</span>' in html
    assert "insufficient_funds" in html
    assert zoo["executed"].from_account.owner.username in html


def test_changelist_is_ordered_newest_first(superuser, zoo):
    response = admin_client_for(superuser).get(CHANGELIST)
    ids = [p.id for p in response.context["cl"].result_list]
    assert ids == sorted(ids, reverse=True)  # ULIDs: creation order


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("status__exact=SCHEDULED", ("future", "far_future", "overdue")),
        ("status__exact=EXECUTING", ("stuck", "in_flight")),
        ("status__exact=CANCELLED", ("cancelled",)),
        ("due=overdue", ("overdue", "stuck")),
        ("due=next_hour", ("future", "cancelled")),
        ("failure_reason=insufficient_funds", ("failed",)),
        ("failure_reason=account_frozen", ()),
        ("due=overdue&status__exact=EXECUTING", ("stuck",)),
    ],
)
def test_changelist_filters(superuser, zoo, query, expected):
    response = admin_client_for(superuser).get(f"{CHANGELIST}?{query}")
    assert response.status_code == 200
    assert listed_ids(response) == ids(zoo, *expected)


def test_due_today_filter_takes_the_utc_calendar_day(superuser, accounts):
    a, b = accounts
    now = timezone.now()
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)

    def due(at):
        return ScheduledPayment.objects.create(payer=a.owner, from_account=a, to_account=b, amount=1, execute_at=at)

    today = due(midnight + (now - midnight) / 2)
    due(midnight + timedelta(days=1, hours=1))  # tomorrow
    due(midnight - timedelta(hours=1))  # yesterday
    response = admin_client_for(superuser).get(f"{CHANGELIST}?due=today")
    assert listed_ids(response) == {today.pk}


def test_date_hierarchy_drills_into_year_and_month(superuser, zoo):
    client = admin_client_for(superuser)
    year = zoo["executed"].execute_at.year
    response = client.get(f"{CHANGELIST}?execute_at__year={year}")
    assert response.status_code == 200
    assert zoo["executed"].pk in listed_ids(response)
    month = zoo["executed"].execute_at.month
    response = client.get(f"{CHANGELIST}?execute_at__year={year}&execute_at__month={month}")
    assert zoo["executed"].pk in listed_ids(response)
    assert f"execute_at__day={zoo['executed'].execute_at.day}" in response.content.decode()


def test_due_filters_list_the_oldest_due_first_and_failures_the_latest_first(superuser, zoo):
    client = admin_client_for(superuser)
    for query, key in (("due=overdue", lambda p: (p.execute_at, p.id)), ("failure_reason=insufficient_funds", None)):
        rows = list(client.get(f"{CHANGELIST}?{query}").context["cl"].result_list)
        assert rows
        if key is not None:
            assert rows == sorted(rows, key=key)
    a, b = zoo["executed"].from_account, zoo["executed"].to_account
    later = due_payment(source=funded_account(balance=0), target=b, amount=5, seconds_ago=60)
    run_due(later)
    assert a is not None and later.status == PaymentStatus.FAILED
    rows = list(client.get(f"{CHANGELIST}?failure_reason=insufficient_funds").context["cl"].result_list)
    assert [p.pk for p in rows] == [later.pk, zoo["failed"].pk]


def test_date_hierarchy_day_lists_payments_of_every_status(superuser, zoo):
    # The drill-down's range goes through payment_execute_at_condition: one arm per
    # partial index. Every status must still be in it.
    day = zoo["executed"].execute_at
    response = admin_client_for(superuser).get(
        f"{CHANGELIST}?execute_at__year={day.year}&execute_at__month={day.month}&execute_at__day={day.day}"
    )
    assert response.status_code == 200
    expected = {p.pk for p in ScheduledPayment.objects.filter(execute_at__date=day.date())}
    assert {"EXECUTED", "FAILED", "EXECUTING", "SCHEDULED"} <= set(
        ScheduledPayment.objects.filter(pk__in=expected).values_list("status", flat=True)
    )
    assert listed_ids(response) == expected


@pytest.mark.parametrize(
    "narrow",
    [
        lambda qs: qs,
        lambda qs: qs.filter(status=PaymentStatus.SCHEDULED),
        lambda qs: qs.filter(status=PaymentStatus.EXECUTED),
        lambda qs: qs.filter(status__in=[PaymentStatus.FAILED, PaymentStatus.SCHEDULED]),
        lambda qs: qs.filter(amount__gte=8),
        lambda qs: qs.filter(status=PaymentStatus.CANCELLED, amount=0),
    ],
)
def test_date_hierarchy_bounds_equal_min_and_max_over_the_queryset(zoo, narrow):
    queryset = narrow(ScheduledPayment.objects.all())
    assert payment_execute_at_bounds(queryset) == queryset.aggregate(first=Min("execute_at"), last=Max("execute_at"))


def test_date_hierarchy_span_lists_every_unit_between_first_and_last(accounts):
    a, b = accounts
    for when in (datetime(2031, 11, 30, 23, tzinfo=UTC), datetime(2032, 2, 1, 1, tzinfo=UTC)):
        ScheduledPayment.objects.create(payer=a.owner, from_account=a, to_account=b, amount=1, execute_at=when)
    qs = ScheduledPayment.objects.all()
    assert [d.year for d in datetime_span(qs, "execute_at", "year")] == [2031, 2032]
    assert [(d.year, d.month) for d in datetime_span(qs, "execute_at", "month")] == [
        (2031, 11), (2031, 12), (2032, 1), (2032, 2)
    ]
    assert len(datetime_span(qs, "execute_at", "day")) == 1 + 31 + 31 + 1
    assert datetime_span(qs.none(), "execute_at", "day") == []


def test_search_by_payment_id_account_id_and_owner_username(superuser, accounts):
    a, b = accounts
    other_source, other_target = funded_account(balance=10), funded_account()
    mine = future_payment(source=a, target=b)
    theirs = future_payment(source=other_source, target=other_target)
    client = admin_client_for(superuser)

    def search(term):
        response = client.get(CHANGELIST, {"q": term})
        assert response.status_code == 200
        return listed_ids(response)

    assert search(mine.pk) == {mine.pk}
    assert search(a.pk) == {mine.pk}
    assert search(b.pk) == {mine.pk}  # the receiving side too
    assert search(other_source.owner.username) == {theirs.pk}
    assert search(other_target.owner.username) == {theirs.pk}
    assert search(f"{mine.pk} {theirs.pk}") == {mine.pk, theirs.pk}
    assert search("nobody-has-this-name") == set()


def test_changelist_query_count_does_not_grow_with_rows(superuser, django_assert_max_num_queries):
    """Every row shows two accounts and two owners: list_select_related, not a query per row."""
    client = admin_client_for(superuser)

    def page_with(rows: int) -> int:
        for _ in range(rows - ScheduledPayment.objects.count()):
            future_payment(source=AccountFactory(), target=AccountFactory())
        client.get(CHANGELIST)  # warm caches (content types, session)
        with CaptureQueriesContext(connection) as ctx, django_assert_max_num_queries(10):
            response = client.get(CHANGELIST)
        assert len(response.context["cl"].result_list) == rows
        return len(ctx.captured_queries)

    assert page_with(5) == page_with(50)


def test_large_results_show_an_estimate_instead_of_counting_every_row(accounts, monkeypatch):
    a, b = accounts
    for _ in range(6):
        future_payment(source=a, target=b)
    monkeypatch.setattr("common.admin_tools.EXACT_COUNT_LIMIT", 3)
    paginator = EstimatedCountPaginator(ScheduledPayment.objects.order_by("id"), 2)
    assert paginator.count >= 4
    assert paginator.estimated
    monkeypatch.setattr("common.admin_tools.EXACT_COUNT_LIMIT", 100)
    exact = EstimatedCountPaginator(ScheduledPayment.objects.order_by("id"), 2)
    assert (exact.count, exact.estimated) == (6, False)


# --- detail page ----------------------------------------------------------------------


def test_detail_page_is_read_only_with_attempts_events_and_the_transfer(superuser, zoo):
    payment = zoo["executed"]
    response = admin_client_for(superuser).get(change_url(payment))
    assert response.status_code == 200
    html = response.content.decode()
    transfer = Transfer.objects.get(key=payment.pk)
    assert reverse("admin:ledger_transfer_change", args=[transfer.pk]) in html
    assert f"transfer #{transfer.pk}" in html
    assert response.context["adminform"].form.fields == {}  # nothing editable
    assert 'name="_save"' not in html
    assert 'name="amount"' not in html
    # Attempts and events: one read-only timeline, not inlines (nothing there to add or delete).
    assert response.context["inline_admin_formsets"] == []
    kinds = [str(entry.what) for entry in response.context["timeline"]]
    assert kinds[0].startswith("created") and any(k.startswith("attempt 1:") for k in kinds)
    assert "worker:w1" in html  # the executed event's actor
    assert 'id="dp-cancel"' not in html  # executed: no Cancel button


def test_detail_page_of_an_unexecuted_payment_says_no_money_moved(superuser, zoo):
    response = admin_client_for(superuser).get(change_url(zoo["failed"]))
    assert "none: no money moved for this payment" in response.content.decode()


def test_posting_the_change_form_changes_nothing(superuser, zoo):
    payment = zoo["future"]
    before = ScheduledPayment.objects.filter(pk=payment.pk).values().get()
    response = admin_client_for(superuser).post(
        change_url(payment),
        {"amount": 999_999, "status": "EXECUTED", "execute_at_0": "2030-01-01", "execute_at_1": "00:00:00",
         "from_account": zoo["failed"].from_account_id, "_save": "Save"},
    )
    assert response.status_code == 403
    assert ScheduledPayment.objects.filter(pk=payment.pk).values().get() == before


def test_no_add_or_delete_for_payments_attempts_and_events(superuser, zoo):
    client = admin_client_for(superuser)
    for model in ("scheduledpayment", "executionattempt", "paymentevent"):
        assert client.get(reverse(f"admin:payments_{model}_add")).status_code == 403
    delete = reverse("admin:payments_scheduledpayment_delete", args=[quote(zoo["future"].pk)])
    assert client.get(delete).status_code == 403
    event = PaymentEvent.objects.first()
    assert client.get(reverse("admin:payments_paymentevent_delete", args=[event.pk])).status_code == 403
    actions = admin_client_for(superuser).get(CHANGELIST).context["action_form"].fields["action"].choices
    assert [name for name, _ in actions if name] == ["cancel_selected", "redrive_selected", "resolve_selected"]


def test_event_and_attempt_lists_search_by_payment(superuser, zoo):
    client = admin_client_for(superuser)
    response = client.get(reverse("admin:payments_paymentevent_changelist"), {"q": zoo["executed"].pk})
    assert {e.kind for e in response.context["cl"].result_list} == {"created", "executed"}
    response = client.get(reverse("admin:payments_executionattempt_changelist"), {"q": zoo["failed"].pk})
    assert [a.outcome for a in response.context["cl"].result_list] == ["failed"]


# --- cancel -----------------------------------------------------------------------------


def cancel_action(client, *payments, reason="customer asked"):
    """The bulk action: its confirmation page (the POST redirected to it), then the page's
    submit with a reason (redirected back to the list)."""
    selection = {"action": "cancel_selected", "_selected_action": [p.pk for p in payments]}
    page = client.post(CHANGELIST, selection, follow=True)
    if page.status_code != 200 or "act" not in (page.context or {}):
        return page
    return client.post(page.redirect_chain[-1][0], {"confirmed": "1", "reason": reason}, follow=True)


def test_cancel_action_asks_for_a_reason_then_cancels_as_the_staff_user(support_user, zoo):
    payment = zoo["future"]
    client = admin_client_for(support_user)
    page = client.post(CHANGELIST, {"action": "cancel_selected", "_selected_action": [payment.pk]}, follow=True)
    assert page.templates[0].name == "admin/confirm_act.html"
    assert (page.context["count"], page.context["affected"]) == (1, 1)
    assert ScheduledPayment.objects.get(pk=payment.pk).status == PaymentStatus.SCHEDULED  # one click: nothing yet
    blank = cancel_action(client, payment, reason=" ")
    assert blank.context["form"].errors["reason"]
    assert ScheduledPayment.objects.get(pk=payment.pk).status == PaymentStatus.SCHEDULED

    response = cancel_action(client, payment, reason="customer asked")
    assert response.status_code == 200
    assert messages_of(response) == [f"Cancelled: {payment.pk}."]
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.CANCELLED
    event = PaymentEvent.objects.get(payment=payment, kind=PaymentEvent.Kind.CANCELLED)
    assert (event.actor, event.actor_user) == (f"user:{support_user.pk}", support_user)
    action = StaffAction.objects.get(payment_id=payment.pk)
    assert (action.action, action.actor, action.reason, action.account_id, action.amount) == (
        "payment_cancel", support_user, "customer asked", payment.from_account_id, payment.amount
    )


NOTHING_TO_CANCEL = (
    "Cancel: none of the 1 scheduled payment listed would change (already claimed, finished or cancelled); "
    "nothing was done and your reason was not recorded."
)


def test_cancel_action_of_an_already_cancelled_payment_is_refused(support_user, zoo):
    payment = zoo["cancelled"]
    response = cancel_action(admin_client_for(support_user), payment)
    assert messages_of(response) == [NOTHING_TO_CANCEL]
    assert PaymentEvent.objects.filter(payment=payment, kind=PaymentEvent.Kind.CANCELLED).count() == 1
    assert not StaffAction.objects.exists()


def test_cancel_action_of_an_executed_payment_is_refused(support_user, zoo):
    payment = zoo["executed"]
    response = cancel_action(admin_client_for(support_user), payment)
    assert messages_of(response) == [NOTHING_TO_CANCEL]
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.EXECUTED


def test_cancel_action_counts_and_reports_each_payment_of_a_mixed_selection(support_user, zoo):
    client = admin_client_for(support_user)
    chosen = [zoo["future"], zoo["cancelled"], zoo["stuck"], zoo["failed"]]
    page = client.post(CHANGELIST, {"action": "cancel_selected", "_selected_action": [p.pk for p in chosen]},
                       follow=True)
    assert (page.context["count"], page.context["affected"]) == (4, 1)
    assert "already claimed, finished or cancelled: left alone" in page.content.decode()
    response = cancel_action(client, *chosen)
    text = messages_of(response)
    assert text[0] == f"Cancelled: {zoo['future'].pk}."
    assert text[1] == f"Already cancelled: {zoo['cancelled'].pk}."
    assert text[2].startswith("Too late to cancel: ")
    assert f"{zoo['stuck'].pk} is EXECUTING" in text[2] and f"{zoo['failed'].pk} is FAILED" in text[2]


def test_cancel_action_refuses_an_oversized_selection(support_user, zoo, monkeypatch):
    monkeypatch.setattr(ScheduledPaymentAdmin, "max_rows_per_act", 1)
    response = admin_client_for(support_user).post(
        CHANGELIST, {"action": "cancel_selected", "_selected_action": [zoo["future"].pk, zoo["overdue"].pk]},
        follow=True,
    )
    assert messages_of(response) == ["Select at most 1 scheduled payments per cancel; nothing changed."]
    assert ScheduledPayment.objects.filter(status=PaymentStatus.SCHEDULED).count() == 3


def test_cancel_button_on_the_detail_page_confirms_first(support_user, zoo):
    payment = zoo["future"]
    client = admin_client_for(support_user)
    page = client.get(change_url(payment)).content.decode()
    assert f'href="{cancel_url(payment)}"' in page
    assert client.get(cancel_url(payment)).status_code == 200  # a GET shows the confirmation page
    assert client.post(cancel_url(payment)).status_code == 200  # so does a POST without its submit
    assert ScheduledPayment.objects.get(pk=payment.pk).status == PaymentStatus.SCHEDULED
    response = client.post(cancel_url(payment), {"confirmed": "1", "reason": "duplicate"}, follow=True)
    assert response.redirect_chain[-1][0] == change_url(payment)
    assert messages_of(response) == [f"Cancelled: {payment.pk}."]
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.CANCELLED
    html = response.content.decode()
    assert 'id="dp-cancel"' not in html  # gone once cancelled
    assert "duplicate" in html  # the payment page shows the staff action's reason
    again = client.post(cancel_url(payment), {"confirmed": "1", "reason": "duplicate"}, follow=True)
    assert messages_of(again) == [NOTHING_TO_CANCEL]


def test_cancel_button_of_a_payment_in_flight_is_refused(support_user, zoo):
    response = admin_client_for(support_user).post(
        cancel_url(zoo["in_flight"]), {"confirmed": "1", "reason": "r"}, follow=True
    )
    assert messages_of(response) == [NOTHING_TO_CANCEL]


# --- permissions --------------------------------------------------------------------------


def test_staff_without_the_cancel_permission_get_403(auditor_user, zoo):
    payment = zoo["future"]
    client = admin_client_for(auditor_user)
    listing = client.get(CHANGELIST)
    assert listing.status_code == 200  # the auditor reads
    assert "cancel_selected" not in listing.content.decode()
    assert 'id="dp-cancel"' not in client.get(change_url(payment)).content.decode()
    for confirm in ({}, {"confirmed": "1", "reason": "r"}):
        data = {"action": "cancel_selected", "_selected_action": [payment.pk], **confirm}
        assert client.post(CHANGELIST, data).status_code == 403
        assert client.post(cancel_url(payment), confirm).status_code == 403
    assert client.get(cancel_url(payment)).status_code == 403
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.SCHEDULED
    assert not PaymentEvent.objects.filter(payment=payment, kind=PaymentEvent.Kind.CANCELLED).exists()


def registered_actions():
    """Every (changelist URL, action name) of every ModelAdmin on the site."""
    for model, model_admin in admin.site._registry.items():
        url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        for name in model_admin._get_base_actions():
            yield url, name[1]


def test_every_model_admin_refuses_an_action_without_its_permission():
    assert all(isinstance(a, ActionPermissionAdminMixin) for a in admin.site._registry.values())


@pytest.mark.parametrize(("url", "action"), list(registered_actions()))
def test_an_unpermitted_bulk_action_is_403(url, action, auditor_user, zoo):
    """An auditor reads every changelist and may run none of its actions (Django would answer
    "No action selected." and a 200 or redirect, and do nothing)."""
    client = admin_client_for(auditor_user)
    data = {"action": action, "_selected_action": [zoo["future"].pk, zoo["future"].from_account_id], "index": "0"}
    response = client.post(url, data)
    assert response.status_code == 403, (url, action, response.status_code)


def test_an_unknown_bulk_action_is_403(superuser, zoo):
    client = admin_client_for(superuser)
    data = {"action": "drop_everything", "_selected_action": [zoo["future"].pk], "index": "0"}
    assert client.post(CHANGELIST, data).status_code == 403
    empty = client.post(CHANGELIST, {"action": "", "_selected_action": [zoo["future"].pk], "index": "0"})
    assert empty.status_code in (200, 302)  # "---------": Django's own "No action selected."


def test_staff_without_any_permission_sees_nothing(zoo):
    client = admin_client_for(UserFactory(is_staff=True))
    assert client.get(CHANGELIST).status_code == 403
    assert client.get(reverse("admin-dashboard")).status_code == 403


def test_non_staff_cannot_enter(zoo):
    user = zoo["future"].payer
    client = admin_client_for(user)
    login = reverse("admin:login")
    for url in (CHANGELIST, change_url(zoo["future"]), reverse("admin-dashboard"), reverse("admin:index")):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith(login), url
    response = client.post(cancel_url(zoo["future"]), {"confirmed": "1", "reason": "r"})
    assert response.status_code == 302 and response["Location"].startswith(login)
    zoo["future"].refresh_from_db()
    assert zoo["future"].status == PaymentStatus.SCHEDULED


def test_staff_groups_command_creates_support_auditor_and_treasury(staff_groups):
    call_command("staff_groups", stdout=io.StringIO())  # idempotent
    support, auditor, treasury = (
        set(Group.objects.get(name=name).permissions.values_list("codename", flat=True))
        for name in ("support", "auditor", "treasury")
    )
    assert support == auditor | {
        "cancel_scheduledpayment", "redrive_scheduledpayment", "pause_recurringpayment", "resend_delivery",
        "freeze_account",  # a fraud freeze at 3 a.m. needs no superuser
    }
    assert auditor == {
        "view_scheduledpayment", "view_executionattempt", "view_paymentevent", "view_recurringpayment",
        "view_recurringevent", "view_account", "view_transfer", "view_depositrequest", "view_staffaction",
        "view_endpoint", "view_event", "view_delivery", "view_deliveryattempt",
        "view_payee", "view_payout", "view_railstate", "view_archivedpartition", "view_pendingtransfer",
    }
    # Money: deposits, requests above the threshold, deciding others' requests (four eyes),
    # and holding a rail's breaker open or closed.
    assert treasury == auditor | {"deposit_account", "approve_deposit", "force_breaker"}


# --- dashboard --------------------------------------------------------------------------


def test_dashboard_is_linked_from_the_index(auditor_user):
    html = admin_client_for(auditor_user).get(reverse("admin:index")).content.decode()
    assert f'href="{reverse("admin-dashboard")}"' in html
    assert f'href="{CHANGELIST}?due=overdue"' in html


def test_dashboard_shows_counts_lag_chart_outcomes_and_leases(auditor_user, zoo, accounts):
    a, b = accounts
    minute = timezone.now().replace(second=0, microsecond=0)
    for offset in (5, 5, 20):  # two in one minute, one in another; zoo["future"] is 30 minutes out
        ScheduledPayment.objects.create(
            payer=a.owner, from_account=a, to_account=b, amount=1,
            execute_at=minute + timedelta(minutes=offset, seconds=30),
        )
    response = admin_client_for(auditor_user).get(reverse("admin-dashboard"))
    assert response.status_code == 200
    ctx = response.context
    counts = {status: n for status, n, _ in ctx["counts"]}
    assert counts == {"SCHEDULED": 6, "EXECUTING": 2, "EXECUTED": 1, "FAILED": 1, "CANCELLED": 1, "NEEDS_REVIEW": 0}
    assert ctx["health"].overdue == 1 and ctx["health"].leases_expired == 1
    assert ctx["health"].oldest_due_age_seconds >= 100
    assert ctx["outcomes"].executed == 1 and ctx["outcomes"].failed == {"insufficient_funds": 1}
    chart = ctx["chart"]
    assert (chart.total, chart.peak) == (4, 2)
    html = response.content.decode()
    start = html.index('<svg class="dp-chart"')
    svg = html[start:html.index("</svg>", start)]
    assert len(re.findall(r'<rect class="dp-bar"', svg)) == 3
    assert "<script" not in svg
    assert 'id="dp-leases-expired"' in html
