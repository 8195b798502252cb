"""The admin's review queue: NEEDS_REVIEW payments listed and shown, re-driven or resolved
as failed one at a time (buttons) or in bulk (actions), each through a confirmation page
that asks for a reason, with payments.redrive_scheduledpayment."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone

from common.admin_tools import id_in_url
from console.admin.payments import ScheduledPaymentAdmin
from payments.models import BreakerState, PaymentEvent, PaymentStatus, RailState, ScheduledPayment
from tests.conftest import admin_client_for
from tests.console.test_payouts import reserved_payout
from tests.factories import UserFactory, funded_account, future_payment, parked_payment, payee_for

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:payments_scheduledpayment_changelist")
REVIEW_QUEUE = f"{CHANGELIST}?status__exact=NEEDS_REVIEW"


def change_url(payment) -> str:
    return reverse("admin:payments_scheduledpayment_change", args=[id_in_url(payment.pk)])


def act_url(payment, act: str) -> str:
    return reverse(f"admin:payments_scheduledpayment_{act}", args=[payment.pk])  # as the page links it


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def listed_ids(response) -> list[str]:
    return [str(obj.pk) for obj in response.context["cl"].result_list]


@pytest.fixture
def accounts():
    return funded_account(balance=100), funded_account()


@pytest.fixture
def parked(settings, accounts):
    """Two parked payments, the first parked ten minutes earlier, and one SCHEDULED."""
    a, b = accounts
    first, second = (parked_payment(settings, source=a, target=b) for _ in range(2))
    ScheduledPayment.objects.filter(pk=first.pk).update(updated_at=timezone.now() - timedelta(minutes=10))
    return first, second


@pytest.fixture
def scheduled(accounts):
    return future_payment(source=accounts[0], target=accounts[1])


def redriven_events(payment):
    return list(PaymentEvent.objects.filter(payment_id=payment.pk, kind=PaymentEvent.Kind.REDRIVEN))


def status_of(payment) -> str:
    return ScheduledPayment.objects.get(pk=payment.pk).status


# --- the queue is visible -------------------------------------------------------------


def test_the_review_queue_is_a_filter_ordered_longest_waiting_first(auditor_user, parked, scheduled):
    client = admin_client_for(auditor_user)
    response = client.get(REVIEW_QUEUE)
    assert response.status_code == 200
    assert listed_ids(response) == [parked[0].pk, parked[1].pk]
    assert "Needs Review" in client.get(CHANGELIST).content.decode()  # the status filter's choice
    index = client.get(reverse("admin:index")).content.decode()
    assert f'href="{REVIEW_QUEUE}"' in index


@pytest.fixture
def parked_payout(accounts):
    """A payout parked with its outcome at the rail unknown, its rail's breaker open."""
    payout = reserved_payout(source=accounts[0], payee=payee_for(accounts[0].owner), amount=40)
    RailState.objects.filter(rail="sandbox").update(breaker=BreakerState.OPEN, opened_at=timezone.now())
    return payout


def test_the_review_queue_has_triage_columns_why_since_when_and_the_rail(auditor_user, parked, parked_payout):
    """The queue shows why each payment waits (in a sentence), since when, and for a payout
    its rail's breaker and its state there; not the due, executed and failure columns,
    which a parked payment does not fill."""
    client = admin_client_for(auditor_user)
    response = client.get(REVIEW_QUEUE)
    assert [name for name in response.context["cl"].list_display if name != "action_checkbox"] == [
        "id", "from_col", "to_col", "amount_col", "review_reason_col", "parked_since_col",
        "tries", "at_rail_col",
    ]
    html = response.content.decode()
    for header in ("why it waits", "parked since (utc)", "at the rail"):
        assert header in html.lower(), header
    assert "column-failure_reason" not in html and "executed at (UTC)" not in html
    assert "none recorded an outcome" in html and "attempts_exhausted" in html
    assert "The rail never said whether it paid this payout" in html and "outcome_unknown" in html
    admin_obj = response.context["cl"].model_admin
    rows = {obj.pk: obj for obj in response.context["cl"].result_list}
    assert "10 min" in admin_obj.parked_since_col(rows[parked[0].pk])  # parked ten minutes ago
    at_rail = admin_obj.at_rail_col(rows[parked_payout.pk])
    assert "sandbox" in at_rail and 'dp-red">open<' in at_rail and "a re-driven one waits" in at_rail
    assert 'payout <span class="dp-badge dp-purple">pending<' in at_rail
    assert admin_obj.at_rail_col(rows[parked[1].pk]) == "-"  # an internal transfer has no rail
    # Every other list keeps the general columns.
    assert "column-failure_reason" in client.get(CHANGELIST).content.decode()


def test_the_bulk_redrive_confirmation_shows_the_rails_breaker(support_user, parked, parked_payout):
    client = admin_client_for(support_user)
    page = act_on(client, "redrive_selected", parked[0], parked_payout)
    assert page.context["headers"][-1] == "rail now"
    cells = {str(row.cells[0]): row.cells[-1] for row in page.context["rows"]}
    payout_cell = next(cell for link, cell in cells.items() if parked_payout.pk in link)
    assert 'dp-red">open<' in payout_cell and "a re-driven one waits" in payout_cell
    assert next(cell for link, cell in cells.items() if parked[0].pk in link) == "-"
    RailState.objects.filter(rail="sandbox").update(forced=BreakerState.CLOSED)
    page = act_on(client, "redrive_selected", parked_payout)
    assert "forced closed" in str(page.context["rows"][0].cells[-1])


def test_the_dashboard_counts_the_queue(auditor_user, parked):
    response = admin_client_for(auditor_user).get(reverse("admin-dashboard"))
    review = response.context["review"]
    assert review.count == 2 and 540 <= review.oldest_age_seconds < 700
    assert 'id="dp-needs-review"' in response.content.decode()


def test_the_payment_page_shows_tries_next_attempt_and_review_reason(support_user, parked):
    response = admin_client_for(support_user).get(change_url(parked[0]))
    html = response.content.decode()
    for label in ("Tries", "Next attempt (UTC)", "Review reason"):
        assert f">{label}:<" in html, label
    assert "attempts_exhausted" in html
    assert f'href="{act_url(parked[0], "redrive")}"' in html
    assert f'href="{act_url(parked[0], "resolve")}"' in html
    assert 'id="dp-cancel"' in html  # its creator, or support, may still cancel it


def test_no_review_buttons_for_a_payment_not_in_review_or_without_the_permission(support_user, auditor_user,
                                                                                 parked, scheduled):
    html = admin_client_for(support_user).get(change_url(scheduled)).content.decode()
    assert 'id="dp-redrive"' not in html and 'id="dp-resolve"' not in html
    html = admin_client_for(auditor_user).get(change_url(parked[0])).content.decode()
    assert 'id="dp-redrive"' not in html and 'id="dp-resolve"' not in html
    listing = admin_client_for(auditor_user).get(CHANGELIST).content.decode()
    assert "redrive_selected" not in listing and "resolve_selected" not in listing


# --- one payment: the buttons ------------------------------------------------------------


def test_redrive_button_asks_for_a_reason_then_redrives_once(support_user, parked):
    payment = parked[0]
    client = admin_client_for(support_user)
    page = client.get(act_url(payment, "redrive"))
    assert page.status_code == 200
    assert page.templates[0].name == "admin/confirm_act.html"
    assert payment.pk in page.content.decode() and 'name="reason"' in page.content.decode()
    assert status_of(payment) == PaymentStatus.NEEDS_REVIEW  # a GET changes nothing

    missing = client.post(act_url(payment, "redrive"), {"confirmed": "1", "reason": " "})
    assert missing.status_code == 200 and missing.context["form"].errors["reason"]
    assert status_of(payment) == PaymentStatus.NEEDS_REVIEW

    done = client.post(act_url(payment, "redrive"), {"confirmed": "1", "reason": "bug fixed"}, follow=True)
    assert done.redirect_chain[-1][0] == change_url(payment)
    assert messages_of(done) == [f"Re-driven: {payment.pk}."]
    payment.refresh_from_db()
    assert (payment.status, payment.tries, payment.review_reason) == (PaymentStatus.SCHEDULED, 0, "")
    (event,) = redriven_events(payment)
    assert (event.actor_user, event.data) == (support_user, {"reason": "bug fixed"})

    again = client.post(act_url(payment, "redrive"), {"confirmed": "1", "reason": "bug fixed"}, follow=True)
    assert messages_of(again) == [
        "Re-drive: none of the 1 scheduled payment listed would change (not in review); nothing was done and your"
        " reason was not recorded."
    ]
    assert len(redriven_events(payment)) == 1


def test_redrive_at_a_time_sets_next_attempt_at_and_refuses_the_past(support_user, parked):
    payment = parked[0]
    client = admin_client_for(support_user)
    past = client.post(act_url(payment, "redrive"),
                       {"confirmed": "1", "reason": "later", "execute_at": "2020-01-01 00:00:00"})
    assert past.status_code == 200 and past.context["form"].errors["execute_at"] == ["Must be in the future."]
    assert status_of(payment) == PaymentStatus.NEEDS_REVIEW
    later = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    client.post(act_url(payment, "redrive"),
                {"confirmed": "1", "reason": "later", "execute_at": later.strftime("%Y-%m-%d %H:%M:%S")})
    payment.refresh_from_db()
    assert (payment.status, payment.next_attempt_at) == (PaymentStatus.SCHEDULED, later)


def test_resolve_button_ends_the_payment_failed_and_reports_a_repeat(support_user, parked, accounts):
    payment = parked[0]
    client = admin_client_for(support_user)
    done = client.post(act_url(payment, "resolve"), {"confirmed": "1", "reason": "payee gone"}, follow=True)
    assert messages_of(done) == [f"Resolved as failed: {payment.pk}."]
    payment.refresh_from_db()
    assert (payment.status, payment.failure_reason) == (PaymentStatus.FAILED, "resolved_by_staff")
    event = PaymentEvent.objects.filter(payment=payment).last()
    assert (event.kind, event.actor_user, event.data["reason"]) == ("failed", support_user, "payee gone")
    again = client.post(act_url(payment, "resolve"), {"confirmed": "1", "reason": "payee gone"}, follow=True)
    assert messages_of(again) == [
        "Resolve as failed: none of the 1 scheduled payment listed would change (not in review); nothing was done"
        " and your reason was not recorded."
    ]


def test_a_button_on_a_payment_not_in_review_reports_it(support_user, scheduled):
    response = admin_client_for(support_user).post(
        act_url(scheduled, "resolve"), {"confirmed": "1", "reason": "no"}, follow=True
    )
    assert messages_of(response)[0].startswith(
        "Resolve as failed: none of the 1 scheduled payment listed would change (not in review)"
    )
    assert status_of(scheduled) == PaymentStatus.SCHEDULED


# --- a selection: the changelist actions ---------------------------------------------------


def act_on(client, action, *payments, url=REVIEW_QUEUE, **confirm):
    data = {"action": action, "_selected_action": [p.pk for p in payments], **confirm}
    return client.post(url, data, follow=True)


def test_bulk_redrive_confirms_then_reports_each_payment(support_user, parked, scheduled):
    client = admin_client_for(support_user)
    page = act_on(client, "redrive_selected", *parked, scheduled, url=CHANGELIST)
    assert page.status_code == 200
    assert page.context["object_ids"] == sorted([parked[0].pk, parked[1].pk, scheduled.pk])
    assert (page.context["count"], page.context["affected"]) == (3, 2)
    assert "not in review: left alone" in page.content.decode()
    assert status_of(parked[0]) == PaymentStatus.NEEDS_REVIEW  # nothing yet

    missing = act_on(client, "redrive_selected", *parked, confirmed="1", reason="")
    assert missing.context["form"].errors["reason"]
    assert status_of(parked[0]) == PaymentStatus.NEEDS_REVIEW

    # Posted back to the queue's filtered list: the scheduled payment, not in it, is still
    # reported, not silently skipped.
    done = act_on(client, "redrive_selected", *parked, scheduled, confirmed="1", reason="fixed")
    assert done.redirect_chain[-1][0] == REVIEW_QUEUE
    text = messages_of(done)
    assert text[0] == f"Re-driven: {', '.join(sorted(p.pk for p in parked))}."
    assert text[1] == f"Not in review: {scheduled.pk} is SCHEDULED."
    assert [status_of(p) for p in parked] == [PaymentStatus.SCHEDULED] * 2
    assert listed_ids(done) == []  # the queue is empty now

    # The same confirmation posted again (a double click): refused, nothing changes.
    again = act_on(client, "redrive_selected", *parked, confirmed="1", reason="fixed")
    assert messages_of(again)[0].startswith("Re-drive: none of the 2 scheduled payments listed would change")
    assert all(len(redriven_events(p)) == 1 for p in parked)


def test_bulk_resolve_ends_each_payment_failed(support_user, parked):
    client = admin_client_for(support_user)
    assert act_on(client, "resolve_selected", *parked).context["act"].name == "resolve"
    done = act_on(client, "resolve_selected", *parked, confirmed="1", reason="payee gone")
    assert messages_of(done) == [f"Resolved as failed: {', '.join(sorted(p.pk for p in parked))}."]
    for payment in parked:
        payment.refresh_from_db()
        assert (payment.status, payment.failure_reason) == (PaymentStatus.FAILED, "resolved_by_staff")


def test_bulk_review_refuses_an_oversized_selection(support_user, parked, monkeypatch):
    monkeypatch.setattr(ScheduledPaymentAdmin, "max_rows_per_act", 1)
    response = act_on(admin_client_for(support_user), "redrive_selected", *parked)
    assert messages_of(response) == ["Select at most 1 scheduled payments per re-drive; nothing changed."]
    assert [status_of(p) for p in parked] == [PaymentStatus.NEEDS_REVIEW] * 2


# --- permissions --------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["auditor", "cancel_only"])
def test_staff_without_the_redrive_permission_get_403(who, auditor_user, parked):
    if who == "auditor":
        user = auditor_user
    else:
        user = UserFactory(is_staff=True)
        user.user_permissions.add(*Permission.objects.filter(
            codename__in=["view_scheduledpayment", "cancel_scheduledpayment"]))
    client = admin_client_for(user)
    payment = parked[0]
    for act in ("redrive", "resolve"):
        assert client.get(act_url(payment, act)).status_code == 403
        assert client.post(act_url(payment, act), {"confirmed": "1", "reason": "r"}).status_code == 403
        for confirm in ({}, {"confirmed": "1", "reason": "r"}):
            data = {"action": f"{act}_selected", "_selected_action": [payment.pk], **confirm}
            assert client.post(REVIEW_QUEUE, data).status_code == 403
    assert status_of(payment) == PaymentStatus.NEEDS_REVIEW
    assert not redriven_events(payment)
    assert not PaymentEvent.objects.filter(payment=payment, kind=PaymentEvent.Kind.FAILED).exists()


def test_a_superuser_may_redrive(superuser, parked):
    response = admin_client_for(superuser).post(
        act_url(parked[0], "redrive"), {"confirmed": "1", "reason": "r"}, follow=True
    )
    assert messages_of(response) == [f"Re-driven: {parked[0].pk}."]


def test_non_staff_are_sent_to_the_login_page(parked):
    client = admin_client_for(parked[0].payer)
    response = client.post(act_url(parked[0], "redrive"), {"confirmed": "1", "reason": "r"})
    assert response.status_code == 302 and response["Location"].startswith(reverse("admin:login"))
    assert status_of(parked[0]) == PaymentStatus.NEEDS_REVIEW
