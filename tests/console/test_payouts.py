"""The payouts console: payees (read-only), a payout's page with its rail section, the
kind and rail filters, the Rails page's breaker acts (confirmation page, reason,
payments.force_breaker) and the dashboard's rail tiles; a payout whose funds are reserved
is refused a cancel, and its resolve answers with the rail's word, never a 500."""

from datetime import timedelta

import pytest
from django.contrib.admin import helpers
from django.contrib.admin.utils import quote
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from common.admin_tools import id_in_url
from ledger.models import PendingTransfer
from ledger.services import Reservation, ledger_reserve_batch
from payments.models import (
    BreakerState,
    PaymentEvent,
    PaymentStatus,
    Payout,
    PayoutState,
    RailState,
    RecurringPayment,
    ReviewReason,
    ScheduledPayment,
)
from rails.base import NotFound, Paid, Unknown
from recurring.services import recurring_create
from tests.conftest import admin_client_for, staff_in
from tests.factories import UserFactory, funded_account, future_payment, payee_for

pytestmark = pytest.mark.django_db

PAYMENTS = reverse("admin:payments_scheduledpayment_changelist")
PAYEES = reverse("admin:payments_payee_changelist")
PAYOUTS = reverse("admin:payments_payout_changelist")
RAILS = reverse("admin:payments_railstate_changelist")
PENDING_TRANSFERS = reverse("admin:ledger_pendingtransfer_changelist")
DASHBOARD = reverse("admin-dashboard")


def reserved_payout(*, source, payee, amount: int) -> ScheduledPayment:
    """A payout parked in NEEDS_REVIEW with its funds reserved and its outcome at the rail
    unknown, written directly (no gateway): the payment row, its reserve (the ledger's
    pending transfer into the rail's clearing account) and its payout record."""
    with transaction.atomic():
        payment = ScheduledPayment.objects.create(
            payer=source.owner, from_account=source, to_payee=payee, rail=payee.rail, amount=amount,
            execute_at=timezone.now() - timedelta(hours=1), status=PaymentStatus.NEEDS_REVIEW,
            review_reason=ReviewReason.OUTCOME_UNKNOWN, attempt=3, tries=3,
        )
        PaymentEvent.objects.create(payment=payment, kind="created", to_status="SCHEDULED", actor="test")
        ledger_reserve_batch(reservations=[Reservation(
            key=payment.pk, debit_account_id=source.id, clearing_account_id=f"acc_{payee.rail}_clearing",
            credit_account_id=f"acc_{payee.rail}_settlement", amount=amount,
        )])
        Payout.objects.create(
            payment=payment, rail=payee.rail, destination=payee.destination, amount=amount,
            state=PayoutState.PENDING, submissions=1, lookups=2, last_error="read timeout",
        )
    return payment


def change_url(obj) -> str:
    return reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[id_in_url(obj.pk)])


def act_url(obj, act: str) -> str:
    return reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_{act}", args=[quote(obj.pk)])


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def listed_ids(response) -> list[str]:
    return [str(obj.pk) for obj in response.context["cl"].result_list]


@pytest.fixture
def owner():
    return UserFactory(username="olivia")


@pytest.fixture
def source(owner):
    return funded_account(owner=owner, balance=500)


@pytest.fixture
def payee(owner):
    return payee_for(owner, destination="acct_bob_42", name="Bob at the bank")


@pytest.fixture
def payout(source, payee):
    return reserved_payout(source=source, payee=payee, amount=120)


@pytest.fixture
def internal(source):
    return future_payment(source=source, target=funded_account(), amount=7)


@pytest.fixture
def rail() -> RailState:
    return RailState.objects.get(rail="sandbox")


@pytest.fixture
def treasury_user(staff_groups):
    return staff_in("treasury")


# --- payees -----------------------------------------------------------------------------------


def test_payees_are_listed_searched_and_read_only(superuser, payee, owner):
    client = admin_client_for(superuser)
    other = payee_for(UserFactory(), destination="acct_carol", name="Carol")
    response = client.get(PAYEES)
    assert response.status_code == 200
    html = response.content.decode()
    assert payee.pk in html and "Bob at the bank" in html and "acct_bob_42" in html and "olivia" in html
    for term, expected in [
        ("olivia", [payee.pk]), ("acct_carol", [other.pk]), (payee.pk, [payee.pk]), ("at the ba", [payee.pk]),
    ]:
        assert listed_ids(client.get(PAYEES, {"q": term})) == expected, term
    assert listed_ids(client.get(PAYEES, {"deleted": "yes"})) == []
    page = client.get(change_url(payee))
    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()  # nothing to edit
    assert client.get(reverse("admin:payments_payee_add")).status_code == 403
    assert client.post(reverse("admin:payments_payee_delete", args=[payee.pk])).status_code == 403


def test_the_payee_page_links_to_its_payouts(superuser, payee, payout, internal):
    client = admin_client_for(superuser)
    assert f"{PAYMENTS}?payee={payee.pk}" in client.get(change_url(payee)).content.decode()
    assert listed_ids(client.get(PAYMENTS, {"payee": payee.pk})) == [payout.pk]


def test_a_staff_member_without_the_view_permission_cannot_read_payees(payee):
    client = admin_client_for(UserFactory(is_staff=True))
    assert client.get(PAYEES).status_code == 403
    assert client.get(change_url(payee)).status_code == 403


# --- payouts on the payments pages --------------------------------------------------------------


def test_the_payment_list_shows_the_payee_and_filters_by_kind_and_rail(superuser, payout, internal):
    client = admin_client_for(superuser)
    response = client.get(PAYMENTS)
    html = response.content.decode()
    assert "Bob at the bank" in html and "sandbox · acct_bob_42" in html
    assert set(listed_ids(response)) == {payout.pk, internal.pk}
    assert listed_ids(client.get(PAYMENTS, {"kind": "payout"})) == [payout.pk]
    assert listed_ids(client.get(PAYMENTS, {"kind": "internal"})) == [internal.pk]
    assert listed_ids(client.get(PAYMENTS, {"rail": "sandbox"})) == [payout.pk]


def test_a_payout_page_shows_it_at_the_rail_and_its_reserve(superuser, payout):
    response = admin_client_for(superuser).get(change_url(payout))
    assert response.status_code == 200
    html = response.content.decode()
    assert "At the rail" in html
    assert '<span class="dp-badge dp-purple">pending</span> · 120 to acct_bob_42 on sandbox' in html
    assert "read timeout" in html  # last_error
    assert "acc_sandbox_clearing" in html  # the reserve: pending in the rail's clearing account
    assert reverse("admin:ledger_pendingtransfer_change", args=[id_in_url(payout.pk)]) in html
    assert f"pend:{payout.pk}" in html  # the reserve's ledger transfer
    assert 'id="dp-cancel"' not in html  # its funds are reserved: no cancel
    assert 'id="dp-resolve"' in html


def test_an_internal_payment_page_has_no_rail_section(superuser, internal):
    html = admin_client_for(superuser).get(change_url(internal)).content.decode()
    assert "At the rail" not in html
    assert 'id="dp-cancel"' in html


def test_a_payout_not_yet_reserved_says_so_and_can_be_cancelled(superuser, source, payee):
    payment = ScheduledPayment.objects.create(
        payer=source.owner, from_account=source, to_payee=payee, rail="sandbox", amount=5,
        execute_at=timezone.now() + timedelta(hours=1),
    )
    html = admin_client_for(superuser).get(change_url(payment)).content.decode()
    assert "not at the rail yet" in html and "none: no funds reserved" in html
    assert 'id="dp-cancel"' in html


def test_a_recurring_payout_series_is_listed_with_its_payee(superuser, source, payee):
    rec = recurring_create(
        payer=source.owner, from_account_id=source.id, to_payee_id=payee.pk, amount=3,
        start_at=timezone.now() + timedelta(days=1), interval="P1D",
    )
    client = admin_client_for(superuser)
    assert "Bob at the bank" in client.get(reverse("admin:payments_recurringpayment_changelist")).content.decode()
    assert "acct_bob_42" in client.get(change_url(RecurringPayment.objects.get(pk=rec.pk))).content.decode()


def test_cancelling_a_reserved_payout_is_refused_with_a_message(superuser, payout):
    client = admin_client_for(superuser)
    page = client.get(act_url(payout, "cancel"))
    assert page.status_code == 200
    assert "funds reserved at the rail, outcome unknown: resolve it instead: left alone" in page.content.decode()
    response = client.post(act_url(payout, "cancel"), {"confirmed": "1", "reason": "customer asked"}, follow=True)
    assert response.status_code == 200
    # The page said so and its button was disabled: the submit is refused before any service.
    assert messages_of(response) == [
        "Cancel: none of the 1 scheduled payment listed would change (funds reserved at the rail, outcome unknown: "
        "resolve it instead); nothing was done and your reason was not recorded."
    ]
    assert ScheduledPayment.objects.get(pk=payout.pk).status == PaymentStatus.NEEDS_REVIEW
    assert PendingTransfer.objects.get(pk=payout.pk).state == PendingTransfer.State.PENDING


def test_the_bulk_cancel_reports_a_reserved_payout_and_cancels_the_rest(superuser, payout, internal):
    data = {"action": "cancel_selected", helpers.ACTION_CHECKBOX_NAME: [payout.pk, internal.pk], "index": "0"}
    response = admin_client_for(superuser).post(PAYMENTS, {**data, "confirmed": "1", "reason": "tidy"}, follow=True)
    assert response.status_code == 200
    assert f"Cancelled: {internal.pk}." in messages_of(response)
    assert any(m.startswith(f"Not cancelled, because of the payout at its rail: {payout.pk}") for m in
               messages_of(response))
    assert ScheduledPayment.objects.get(pk=payout.pk).status == PaymentStatus.NEEDS_REVIEW


class FakeRail:
    def __init__(self, answer):
        self.answer = answer

    def lookup(self, *, key: str):
        return self.answer


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (Unknown(error="connect timeout", sent=True), "Not resolved as failed: the rail did not answer, try again "
         "later: {id}."),
        (Paid(reference="po_77", paid_at=timezone.now(), amount=120, destination="acct_bob_42"),
         "Not resolved as failed, because of the payout at its rail: {id} (The rail paid this payout (po_77): "
         "re-drive it, and it will be recorded as executed)."),
    ],
    ids=["no answer", "paid at the rail"],
)
def test_resolving_a_reserved_payout_shows_the_rails_refusal(superuser, payout, monkeypatch, answer, expected):
    monkeypatch.setattr("payouts.payees.get_rail", lambda name: FakeRail(answer))
    response = admin_client_for(superuser).post(
        act_url(payout, "resolve"), {"confirmed": "1", "reason": "the bank says no"}, follow=True
    )
    assert response.status_code == 200
    assert messages_of(response) == [expected.format(id=payout.pk)]
    assert ScheduledPayment.objects.get(pk=payout.pk).status == PaymentStatus.NEEDS_REVIEW


def test_resolving_a_reserved_payout_the_rail_never_saw_voids_its_reserve(superuser, payout, monkeypatch):
    monkeypatch.setattr("payouts.payees.get_rail", lambda name: FakeRail(NotFound()))
    response = admin_client_for(superuser).post(
        act_url(payout, "resolve"), {"confirmed": "1", "reason": "never reached the bank"}, follow=True
    )
    assert messages_of(response) == [f"Resolved as failed: {payout.pk}."]
    assert ScheduledPayment.objects.get(pk=payout.pk).status == PaymentStatus.FAILED
    assert PendingTransfer.objects.get(pk=payout.pk).state == PendingTransfer.State.VOIDED
    assert Payout.objects.get(pk=payout.pk).state == PayoutState.VOIDED


def test_payouts_and_pending_transfers_have_read_only_lists(superuser, payout):
    client = admin_client_for(superuser)
    assert listed_ids(client.get(PAYOUTS, {"state__exact": "pending", "rail__exact": "sandbox"})) == [payout.pk]
    assert client.get(change_url(Payout.objects.get(pk=payout.pk))).status_code == 200
    assert listed_ids(client.get(PENDING_TRANSFERS, {"q": payout.pk})) == [payout.pk]
    assert client.get(change_url(PendingTransfer.objects.get(pk=payout.pk))).status_code == 200


# --- the Rails page ---------------------------------------------------------------------------


def test_the_rails_page_shows_each_breaker_and_its_pending_payouts(superuser, payout, rail):
    RailState.objects.filter(pk=rail.pk).update(consecutive_failures=4, window_calls=9, window_failures=5)
    response = admin_client_for(superuser).get(RAILS)
    assert response.status_code == 200
    html = response.content.decode()
    assert "Rails: circuit breakers and pending payouts" in html
    assert '<span class="dp-badge dp-green">closed</span>' in html
    assert f'<a href="{PAYOUTS}?rail__exact=sandbox&amp;state__exact=pending">1</a>' in html
    (row,) = response.context["cl"].result_list
    assert (row.consecutive_failures, row.window_calls, row.window_failures) == (4, 9, 5)
    page = admin_client_for(superuser).get(change_url(rail)).content.decode()
    assert 'id="dp-force-open"' in page and 'id="dp-force-closed"' in page
    assert 'id="dp-clear-hold"' not in page  # no hold to clear


def test_force_open_closed_and_clear_go_through_the_confirmation_page(treasury_user, rail):
    client = admin_client_for(treasury_user)
    page = client.get(act_url(rail, "force_open"))
    assert page.status_code == 200 and "Force open: 1 rail" in page.content.decode()
    again = client.post(act_url(rail, "force_open"), {"confirmed": "1", "reason": "  "})
    assert again.status_code == 200 and again.context["form"].errors  # a reason is required
    assert RailState.objects.get(pk=rail.pk).forced == ""

    response = client.post(act_url(rail, "force_open"), {"confirmed": "1", "reason": "bank incident"}, follow=True)
    assert messages_of(response) == ["Forced open: sandbox."]
    state = RailState.objects.get(pk=rail.pk)
    assert (state.forced, state.forced_by, state.forced_reason) == ("open", treasury_user.username, "bank incident")

    response = client.post(act_url(rail, "force_closed"), {"confirmed": "1", "reason": "bank says fixed"}, follow=True)
    assert messages_of(response) == ["Forced closed: sandbox."]
    assert RailState.objects.get(pk=rail.pk).forced == BreakerState.CLOSED

    RailState.objects.filter(pk=rail.pk).update(breaker=BreakerState.OPEN, opened_at=timezone.now())
    response = client.post(act_url(rail, "clear_hold"), {"confirmed": "1", "reason": "back to normal"}, follow=True)
    assert messages_of(response) == ["Hold cleared: sandbox."]
    state = RailState.objects.get(pk=rail.pk)
    assert (state.forced, state.breaker, state.opened_at) == ("", BreakerState.CLOSED, None)


def test_the_bulk_force_open_holds_the_selected_rails(superuser, rail):
    data = {"action": "force_open_selected", helpers.ACTION_CHECKBOX_NAME: [rail.pk], "index": "0"}
    client = admin_client_for(superuser)
    page = client.post(RAILS, data, follow=True)
    assert page.status_code == 200 and "Force open 1 rail" in page.content.decode()
    assert RailState.objects.get(pk=rail.pk).forced == ""
    response = client.post(RAILS, {**data, "confirmed": "1", "reason": "incident"}, follow=True)
    assert messages_of(response) == ["Forced open: sandbox."]
    assert RailState.objects.get(pk=rail.pk).forced == BreakerState.OPEN
    response = client.post(RAILS, {**data, "confirmed": "1", "reason": "incident"}, follow=True)
    assert messages_of(response)[0].startswith("Force open: none of the 1 rail listed would change")


def test_forcing_a_breaker_needs_the_permission(auditor_user, rail):
    client = admin_client_for(auditor_user)
    assert client.get(RAILS).status_code == 200  # the auditor reads the page
    assert 'id="dp-force-open"' not in client.get(change_url(rail)).content.decode()
    for act in ("force_open", "force_closed", "clear_hold"):
        assert client.get(act_url(rail, act)).status_code == 403
        assert client.post(act_url(rail, act), {"confirmed": "1", "reason": "x"}).status_code == 403
    data = {"action": "force_open_selected", helpers.ACTION_CHECKBOX_NAME: [rail.pk], "index": "0"}
    assert client.post(RAILS, {**data, "confirmed": "1", "reason": "x"}).status_code == 403
    assert RailState.objects.get(pk=rail.pk).forced == ""


# --- the dashboard ----------------------------------------------------------------------------


def test_the_dashboard_has_a_tile_per_rail(superuser, payout, rail):
    client = admin_client_for(superuser)
    html = client.get(DASHBOARD).content.decode()
    assert f'class="dp-tile dp-rail-green" href="{RAILS}" id="dp-rail-sandbox"' in html
    assert "sandbox: 1 pending payout (oldest" in html
    RailState.objects.filter(pk=rail.pk).update(breaker=BreakerState.HALF_OPEN, opened_at=timezone.now())
    assert 'dp-rail-amber" href' in client.get(DASHBOARD).content.decode()
    RailState.objects.filter(pk=rail.pk).update(breaker=BreakerState.CLOSED, forced=BreakerState.OPEN)
    html = client.get(DASHBOARD).content.decode()
    assert 'dp-rail-red" href' in html and '<span class="dp-number">forced open</span>' in html
