"""The confirmation pages of staff acts, third pass (issue 36, point 7): a list action's POST
is answered with a redirect to its confirmation page (a GET: Back never shows the browser's
"Confirm Form Resubmission"), the submit names the act and what it changes, it is disabled
and refused when nothing would change, and a second approver's reason is recorded."""

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from ledger.models import DepositRequest, StaffAction
from ledger.services import deposit_request_approve, deposit_request_create
from payments.models import PaymentStatus, ScheduledPayment
from payments.services import payment_cancel
from tests.conftest import admin_client_for, staff_in
from tests.factories import funded_account, future_payment

pytestmark = pytest.mark.django_db

PAYMENTS = reverse("admin:payments_scheduledpayment_changelist")
REQUESTS = reverse("admin:ledger_depositrequest_changelist")


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def test_a_list_action_redirects_to_a_confirmation_page_and_back_to_the_list(support_user):
    payment = future_payment(source=funded_account(balance=10), target=funded_account())
    client = admin_client_for(support_user)
    listing = f"{PAYMENTS}?status__exact=SCHEDULED"
    chosen = client.post(listing, {"action": "cancel_selected", "_selected_action": [payment.pk]})
    assert chosen.status_code == 303
    page_url = chosen["Location"]
    assert page_url.startswith(reverse("admin:payments_scheduledpayment_cancel_selected") + "?selection=")
    page = client.get(page_url)
    assert page.status_code == 200 and page.context["affected"] == 1
    assert ScheduledPayment.objects.get(pk=payment.pk).status == PaymentStatus.SCHEDULED  # nothing yet

    done = client.post(page_url, {"confirmed": "1", "reason": "customer asked"})
    assert (done.status_code, done["Location"]) == (303, listing)  # back to the list it was chosen from
    assert messages_of(client.get(listing)) == [f"Cancelled: {payment.pk}."]
    assert ScheduledPayment.objects.get(pk=payment.pk).status == PaymentStatus.CANCELLED

    # Back from the list: the confirmation page again, by GET, saying nothing is left to do.
    back = client.get(page_url)
    assert back.status_code == 200 and back.context["affected"] == 0


def test_an_unknown_selection_goes_back_to_the_list_with_a_message(support_user):
    response = admin_client_for(support_user).get(
        reverse("admin:payments_scheduledpayment_cancel_selected") + "?selection=nope", follow=True
    )
    assert response.redirect_chain[-1] == (PAYMENTS, 303)
    assert messages_of(response) == ["That cancel selection is no longer known; select the rows again."]


def test_the_submit_button_names_the_act_and_what_it_changes(support_user):
    source, target = funded_account(balance=10), funded_account()
    payments = [future_payment(source=source, target=target) for _ in range(3)]
    payment_cancel(payment_id=payments[2].pk, actor=support_user)
    client = admin_client_for(support_user)
    page = client.post(PAYMENTS, {"action": "cancel_selected", "_selected_action": [p.pk for p in payments]},
                       follow=True)
    html = page.content.decode()
    assert 'value="Cancel 2 scheduled payments"' in html  # 2 of the 3 will change
    assert "No, take me back" in html


def test_the_submit_is_disabled_and_refused_when_nothing_would_change(support_user):
    payment = future_payment(source=funded_account(balance=10), target=funded_account())
    payment_cancel(payment_id=payment.pk, actor=support_user)
    client = admin_client_for(support_user)
    url = reverse("admin:payments_scheduledpayment_cancel", args=[payment.pk])
    page = client.get(url)
    assert page.context["affected"] == 0
    assert 'value="Cancel 0 scheduled payments" class="default" name="_cancel" disabled' in page.content.decode()

    refused = client.post(url, {"confirmed": "1", "reason": "again"}, follow=True)
    assert messages_of(refused) == [
        "Cancel: none of the 1 scheduled payment listed would change (already claimed, finished or cancelled); "
        "nothing was done and your reason was not recorded."
    ]
    assert not StaffAction.objects.filter(reason="again").exists()
    assert not LogEntry.objects.filter(change_message__contains="again").exists()


def test_a_second_approvers_reason_is_recorded(staff_groups):
    requester, first, second = staff_in("treasury"), staff_in("treasury"), staff_in("treasury")
    big = 10**6
    decided = deposit_request_create(account_id=funded_account().pk, amount=big, actor=requester, reason="r1")
    waiting = deposit_request_create(account_id=funded_account().pk, amount=big, actor=requester, reason="r2")
    client = admin_client_for(second)
    page = client.post(REQUESTS, {"action": "approve_selected", "_selected_action": [decided.pk, waiting.pk]},
                       follow=True)
    assert page.context["affected"] == 2
    # Both had the page open: the first approves one of the two while the second is typing.
    deposit_request_approve(request_id=decided.pk, actor=first, reason="checked the contract")
    done = client.post(page.redirect_chain[-1][0], {"confirmed": "1", "reason": "second look: fine"}, follow=True)

    assert messages_of(done) == [
        f"Approved: {waiting.pk}.",
        f"Already approved: {decided.pk} (by {first.username}; your reason is in its history).",
    ]
    request = DepositRequest.objects.get(pk=decided.pk)
    assert (request.decided_by, request.decision_reason) == (first, "checked the contract")  # the first decided
    entry = LogEntry.objects.get(object_id=decided.pk, user=second)
    assert entry.get_change_message() == (
        f"Approve submitted again after {first.username} had decided it: second look: fine"
    )
