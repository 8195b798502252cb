"""The ledger console: accounts (freeze, unfreeze, deposit) and transfers."""

from datetime import timedelta

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone

from common.admin_tools import id_in_url
from ledger.models import ISSUANCE_ACCOUNT_ID, Account, DepositFormToken, DepositRequest, StaffAction, Transfer
from ledger.services import account_set_status, deposit_form_open, deposit_request_create, ledger_deposit
from payments.execution import execute_batch
from payments.models import PaymentStatus
from payments.promoter import claim_due
from tests.conftest import admin_client_for
from tests.factories import UserFactory, due_payment, funded_account

pytestmark = pytest.mark.django_db

ACCOUNTS = reverse("admin:ledger_account_changelist")
TRANSFERS = reverse("admin:ledger_transfer_changelist")
REQUESTS = reverse("admin:ledger_depositrequest_changelist")


def account_url(account) -> str:
    return reverse("admin:ledger_account_change", args=[id_in_url(account.pk)])


def deposit_url(account) -> str:
    return reverse("admin:ledger_account_deposit", args=[id_in_url(account.pk)])


def staff_with(*codenames: str):
    user = UserFactory(is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


@pytest.fixture
def treasurer(db):
    return staff_with(
        "view_account", "view_transfer", "view_depositrequest", "view_staffaction", "freeze_account", "deposit_account"
    )


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def listed(response) -> list:
    return list(response.context["cl"].result_list)


# --- accounts ---------------------------------------------------------------------------


def test_account_list_shows_balance_and_searches_by_id_and_owner(auditor_user):
    rich, poor = funded_account(balance=700), funded_account(balance=0)
    client = admin_client_for(auditor_user)
    response = client.get(ACCOUNTS)
    assert response.status_code == 200
    assert {a.pk for a in listed(response)} >= {rich.pk, poor.pk, ISSUANCE_ACCOUNT_ID}
    assert [a.pk for a in listed(client.get(ACCOUNTS, {"q": rich.pk}))] == [rich.pk]
    assert [a.pk for a in listed(client.get(ACCOUNTS, {"q": poor.owner.username}))] == [poor.pk]
    html = client.get(account_url(rich)).content.decode()
    assert "700" in html
    assert f'href="{TRANSFERS}?account={rich.pk}"' in html


def test_account_detail_is_read_only(treasurer):
    account = funded_account(balance=50)
    client = admin_client_for(treasurer)
    response = client.get(account_url(account))
    assert response.context["adminform"].form.fields == {}
    posted = client.post(account_url(account), {"balance": 10**9, "status": "closed", "name": "x", "_save": "Save"})
    assert posted.status_code == 403
    account.refresh_from_db()
    assert (account.balance, account.status) == (50, Account.Status.ACTIVE)
    assert client.get(reverse("admin:ledger_account_add")).status_code == 403
    assert client.get(reverse("admin:ledger_account_delete", args=[id_in_url(account.pk)])).status_code == 403


def confirm(client, url, data=None, *, reason="", **extra):
    """Post a confirmation page's submit (CONFIRMED and a reason), following redirects."""
    return client.post(url, {**(data or {}), "confirmed": "1", "reason": reason, **extra}, follow=True)


def freeze_url(account, act="freeze") -> str:
    return reverse(f"admin:ledger_account_{act}", args=[id_in_url(account.pk)])


def test_freeze_makes_scheduled_payments_fail_as_account_frozen_and_unfreeze_restores(treasurer):
    source, target = funded_account(balance=100), funded_account()
    client = admin_client_for(treasurer)
    selection = {"action": "freeze_selected", "_selected_action": [source.pk]}
    page = client.post(ACCOUNTS, selection, follow=True)  # one click: the confirmation page, nothing frozen yet
    assert page.status_code == 200 and page.templates[0].name == "admin/confirm_act.html"
    assert page.context["count"] == 1 and page.context["affected"] == 1
    assert Account.objects.get(pk=source.pk).status == Account.Status.ACTIVE
    response = confirm(client, ACCOUNTS, selection, reason="chargeback fraud")
    assert messages_of(response)[0] == f"Frozen: {source.pk}."
    source.refresh_from_db()
    assert source.status == Account.Status.FROZEN
    action = StaffAction.objects.get(account=source)
    assert (action.action, action.actor, action.reason) == ("freeze", treasurer, "chargeback fraud")

    payment = due_payment(source=source, target=target, amount=10, seconds_ago=120)
    claim = claim_due(batch=100, lease_seconds=60)
    execute_batch(pairs=claim.fresh, worker="w1")
    payment.refresh_from_db()
    assert (payment.status, payment.failure_reason) == (PaymentStatus.FAILED, "account_frozen")
    source.refresh_from_db()
    assert source.balance == 100  # nothing moved
    assert not Transfer.objects.filter(key=payment.pk).exists()

    unfreeze = {"action": "unfreeze_selected", "_selected_action": [source.pk]}
    response = confirm(client, ACCOUNTS, unfreeze, reason="cleared")
    assert messages_of(response) == [f"Unfrozen: {source.pk}."]
    source.refresh_from_db()
    assert source.status == Account.Status.ACTIVE


def test_freeze_needs_a_reason(treasurer):
    account = funded_account()
    client = admin_client_for(treasurer)
    for reason in ("", "   "):
        response = confirm(client, freeze_url(account), reason=reason)
        assert response.status_code == 200 and response.context["form"].errors["reason"]
    assert Account.objects.get(pk=account.pk).status == Account.Status.ACTIVE
    assert not StaffAction.objects.exists()


def test_freeze_button_on_the_account_page_confirms_first(treasurer):
    account = funded_account()
    client = admin_client_for(treasurer)
    page = client.get(account_url(account)).content.decode()
    assert f'href="{freeze_url(account)}"' in page and f'href="{freeze_url(account, "unfreeze")}"' not in page
    assert client.get(freeze_url(account)).status_code == 200  # a GET shows the page
    assert client.post(freeze_url(account)).status_code == 200  # a POST without the confirmation too
    assert Account.objects.get(pk=account.pk).status == Account.Status.ACTIVE
    done = confirm(client, freeze_url(account), reason="court order")
    assert done.redirect_chain[-1][0] == account_url(account)
    assert messages_of(done)[0] == f"Frozen: {account.pk}."
    html = done.content.decode()
    assert f'href="{freeze_url(account, "unfreeze")}"' in html
    assert "court order" in html  # the staff actions inline: who and why


def test_freeze_page_counts_what_will_change_and_what_is_left_alone(treasurer):
    active, frozen, closed = funded_account(), funded_account(), funded_account()
    account_set_status(account_id=frozen.pk, status=Account.Status.FROZEN)
    account_set_status(account_id=closed.pk, status=Account.Status.CLOSED)
    page = admin_client_for(treasurer).post(
        ACCOUNTS,
        {"action": "freeze_selected", "_selected_action": [active.pk, frozen.pk, closed.pk, ISSUANCE_ACCOUNT_ID]},
        follow=True,
    )
    assert (page.context["count"], page.context["affected"]) == (4, 1)
    html = page.content.decode()
    assert "<strong>1</strong> of the 4 accounts listed will change; 3 will be left alone" in html
    assert "already frozen: left alone" in html and "a system account: left alone" in html


def test_freeze_reports_unchanged_and_refuses_system_and_closed_accounts(treasurer):
    active, frozen, closed = funded_account(), funded_account(), funded_account()
    account_set_status(account_id=frozen.pk, status=Account.Status.FROZEN)
    account_set_status(account_id=closed.pk, status=Account.Status.CLOSED)
    response = confirm(
        admin_client_for(treasurer),
        ACCOUNTS,
        {"action": "freeze_selected", "_selected_action": [active.pk, frozen.pk, closed.pk, ISSUANCE_ACCOUNT_ID]},
        reason="r",
    )
    text = messages_of(response)
    assert text[0] == f"Frozen: {active.pk}."
    assert text[1] == f"Already frozen: {frozen.pk}."
    assert text[2].startswith("Refused: ")
    assert f"{ISSUANCE_ACCOUNT_ID}: a system account is never frozen" in text[2]
    assert f"{closed.pk}: a closed account cannot be reopened" in text[2]
    assert Account.objects.get(pk=ISSUANCE_ACCOUNT_ID).status == Account.Status.ACTIVE
    assert Account.objects.get(pk=closed.pk).status == Account.Status.CLOSED
    assert list(StaffAction.objects.values_list("account_id", flat=True)) == [active.pk]


def test_freeze_needs_the_freeze_permission(auditor_user):
    account = funded_account()
    client = admin_client_for(auditor_user)
    assert "freeze_selected" not in client.get(ACCOUNTS).content.decode()
    assert f'href="{freeze_url(account)}"' not in client.get(account_url(account)).content.decode()
    for data in ({}, {"confirmed": "1", "reason": "r"}):
        response = client.post(ACCOUNTS, {"action": "freeze_selected", "_selected_action": [account.pk], **data})
        assert response.status_code == 403
        assert client.post(freeze_url(account), data).status_code == 403
    assert client.get(freeze_url(account)).status_code == 403
    account.refresh_from_db()
    assert account.status == Account.Status.ACTIVE


# --- deposits: one deposit per opened form --------------------------------------------------


@pytest.fixture(autouse=True)
def _threshold(settings):
    settings.DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD = 1_000


def open_form(client, account) -> str:
    """Open the deposit form as the Deposit button does: the URL of the page it lands on."""
    response = client.get(deposit_url(account))
    assert response.status_code == 302 and "?form=adep_" in response["Location"]
    return response["Location"]


def test_deposit_form_credits_the_account_once_however_often_it_is_submitted(treasurer):
    account = funded_account(balance=0)
    client = admin_client_for(treasurer)
    assert f'href="{deposit_url(account)}"' in client.get(account_url(account)).content.decode()
    form_url = open_form(client, account)
    page = client.get(form_url)
    assert page.status_code == 200 and {"amount", "reason"} <= set(page.context["form"].fields)
    form = {"amount": "250", "reason": "opening balance"}

    first = client.post(form_url, form, follow=True)
    assert first.redirect_chain[-1][0] == account_url(account)
    assert messages_of(first)[0].startswith(f"Deposited 250 into {account.pk}")
    second = client.post(form_url, form, follow=True)  # the double submit, or Back and submit again
    assert messages_of(second)[0].startswith("This deposit form was already submitted: 250 was deposited")

    # Back (or a reload) lands on the same page, which no longer offers the form.
    back = client.get(form_url)
    assert back.context["form"] is None and 'id="dp-deposit-submitted"' in back.content.decode()
    assert 'name="amount"' not in back.content.decode()

    account.refresh_from_db()
    assert account.balance == 250
    assert Transfer.objects.filter(credit_account=account).count() == 1
    assert Account.objects.get(pk=ISSUANCE_ACCOUNT_ID).balance == -250
    action = StaffAction.objects.get(account=account)
    assert (action.action, action.actor, action.reason, action.amount) == ("deposit", treasurer, "opening balance", 250)

    # Opening the form again (the Deposit button: a new GET without a token) is a new intent.
    another = client.post(open_form(client, account), form, follow=True)
    assert messages_of(another)[0].startswith("Deposited 250")
    account.refresh_from_db()
    assert account.balance == 500


def test_deposit_needs_a_reason(treasurer):
    account = funded_account(balance=0)
    client = admin_client_for(treasurer)
    form_url = open_form(client, account)
    for reason in ("", "  "):
        response = client.post(form_url, {"amount": "10", "reason": reason})
        assert response.status_code == 200 and response.context["form"].errors["reason"]
    assert not Transfer.objects.filter(credit_account=account).exists()
    assert messages_of(client.post(form_url, {"amount": "10", "reason": "ok"}, follow=True))[0].startswith("Deposited")


def test_deposit_refuses_a_foreign_unknown_or_expired_form(treasurer):
    account, other = funded_account(balance=0), funded_account(balance=0)
    client = admin_client_for(treasurer)
    someone_else = admin_client_for(staff_with("view_account", "deposit_account"))
    foreign = open_form(someone_else, account)  # another staff member's form for the same account
    other_account = open_form(client, other).split("?")[1]  # this user's form for another account
    expired = open_form(client, account)
    DepositFormToken.objects.filter(pk=expired.split("=")[1]).update(issued_at=timezone.now() - timedelta(days=2))
    for url in (foreign, f"{deposit_url(account)}?{other_account}", f"{deposit_url(account)}?form=adep_x", expired):
        response = client.post(url, {"amount": "10", "reason": "r"})
        assert response.status_code == 302 and response["Location"] == deposit_url(account), url
        assert client.get(url).status_code == 302  # a GET opens a fresh form instead
    assert balance_of(account) == balance_of(other) == 0
    assert not Transfer.objects.filter(credit_account__in=[account, other]).exists()


def balance_of(account) -> int:
    return Account.objects.get(pk=account.pk).balance


def test_deposit_rejects_a_bad_amount_and_keeps_the_form(treasurer):
    account = funded_account(balance=0)
    client = admin_client_for(treasurer)
    form_url = open_form(client, account)
    for amount in ("0", "-5", "1.5", "abc", str(10**13)):
        response = client.post(form_url, {"amount": amount, "reason": "r"})
        assert response.status_code == 200 and response.context["form"].errors["amount"], amount
    assert not Transfer.objects.filter(credit_account=account).exists()
    assert messages_of(client.post(form_url, {"amount": "5", "reason": "r"}, follow=True))[0].startswith("Deposited 5")


def test_deposit_into_a_closed_account_moves_nothing(treasurer):
    account = funded_account(balance=0)
    client = admin_client_for(treasurer)
    form_url = open_form(client, account)
    account_set_status(account_id=account.pk, status=Account.Status.CLOSED)
    response = client.post(form_url, {"amount": "10", "reason": "r"}, follow=True)
    assert messages_of(response) == ["Deposit refused: account_closed. Nothing moved."]
    assert not Transfer.objects.filter(credit_account=account).exists()


def test_deposit_above_the_threshold_is_requested_and_the_account_links_it(treasurer):
    account = funded_account(balance=0)
    client = admin_client_for(treasurer)
    form_url = open_form(client, account)
    response = client.post(form_url, {"amount": "5000", "reason": "series A"}, follow=True)
    request = DepositRequest.objects.get(account=account)
    assert (request.status, request.amount, request.requested_by, request.reason) == (
        "pending", 5_000, treasurer, "series A"
    )
    assert messages_of(response)[0].startswith("5,000 is above the approval threshold (1,000): requested as")
    assert balance_of(account) == 0
    html = response.content.decode()  # back on the account page
    assert "Deposit requests (1 pending)" in html
    pending = client.get(f"{REQUESTS}?account__exact={account.pk}&status__exact=pending")
    assert [r.pk for r in listed(pending)] == [request.pk]
    again = client.post(form_url, {"amount": "5000", "reason": "series A"}, follow=True)
    assert messages_of(again)[0].startswith("This deposit form was already submitted: a deposit of 5,000")
    assert DepositRequest.objects.count() == 1


def test_deposit_needs_the_deposit_permission(support_user):
    account = funded_account(balance=0)
    client = admin_client_for(support_user)
    assert f'href="{deposit_url(account)}"' not in client.get(account_url(account)).content.decode()
    assert client.get(deposit_url(account)).status_code == 403
    token = deposit_form_open(account_id=account.pk, actor=support_user)
    assert client.post(f"{deposit_url(account)}?form={token}", {"amount": "10", "reason": "r"}).status_code == 403
    account.refresh_from_db()
    assert account.balance == 0


def test_deposit_goes_to_user_accounts_only(superuser):
    issuance = Account.objects.get(pk=ISSUANCE_ACCOUNT_ID)
    response = admin_client_for(superuser).get(deposit_url(issuance), follow=True)
    assert messages_of(response) == ["Deposits go to user accounts only."]


# --- deposit requests: four eyes ------------------------------------------------------------


def decide_url(request, act) -> str:
    return reverse(f"admin:ledger_depositrequest_{act}", args=[id_in_url(request.pk)])


@pytest.fixture
def approver(db):
    return staff_with("view_account", "view_depositrequest", "view_staffaction", "approve_deposit")


@pytest.fixture
def pending(treasurer):
    account = funded_account(balance=0)
    return deposit_request_create(account_id=account.pk, amount=5_000, actor=treasurer, reason="series A")


def test_another_staff_member_approves_through_a_confirmation_page(pending, approver):
    client = admin_client_for(approver)
    page = client.get(reverse("admin:ledger_depositrequest_change", args=[quote(pending.pk)])).content.decode()
    assert f'href="{decide_url(pending, "approve")}"' in page and f'href="{decide_url(pending, "reject")}"' in page
    confirmation = client.get(decide_url(pending, "approve"))
    assert confirmation.context["affected"] == 1 and "series A" in confirmation.content.decode()
    assert balance_of(pending.account) == 0  # a GET moves nothing
    missing = confirm(client, decide_url(pending, "approve"), reason=" ")
    assert missing.context["form"].errors["reason"] and balance_of(pending.account) == 0

    done = confirm(client, decide_url(pending, "approve"), reason="contract checked")
    assert messages_of(done) == [f"Approved: {pending.pk}."]
    assert balance_of(pending.account) == 5_000
    again = confirm(client, decide_url(pending, "approve"), reason="contract checked")
    assert messages_of(again) == [
        "Approve: none of the 1 deposit request listed would change (already approved); nothing was done and your"
        " reason was not recorded."
    ]
    assert balance_of(pending.account) == 5_000
    assert "transfer #" in again.content.decode()  # the request's page links its transfer

    history = client.get(account_url(pending.account)).content.decode()
    assert "contract checked" in history and "series A" in history


def test_the_requester_cannot_decide_their_own_request(pending, treasurer):
    treasurer.user_permissions.add(Permission.objects.get(codename="approve_deposit"))
    client = admin_client_for(UserFactory._meta.model.objects.get(pk=treasurer.pk))
    page = client.get(reverse("admin:ledger_depositrequest_change", args=[quote(pending.pk)])).content.decode()
    assert 'id="dp-approve"' not in page and 'id="dp-own-request"' in page
    confirmation = client.get(decide_url(pending, "approve"))
    assert confirmation.context["affected"] == 0 and "requested by you: left alone" in confirmation.content.decode()
    nothing = "none of the 1 deposit request listed would change (requested by you); nothing was done"
    response = confirm(client, decide_url(pending, "approve"), reason="trust me")
    assert nothing in messages_of(response)[0]
    bulk = confirm(client, REQUESTS, {"action": "reject_selected", "_selected_action": [pending.pk]}, reason="no")
    assert nothing in messages_of(bulk)[0]
    assert DepositRequest.objects.get(pk=pending.pk).status == "pending"
    assert balance_of(pending.account) == 0


def test_bulk_reject_and_approve_report_each_request(pending, treasurer, approver):
    other = deposit_request_create(account_id=funded_account().pk, amount=2_000, actor=treasurer, reason="r")
    client = admin_client_for(approver)
    rejected = confirm(client, REQUESTS, {"action": "reject_selected", "_selected_action": [pending.pk]}, reason="no")
    assert messages_of(rejected) == [f"Rejected: {pending.pk}."]
    selection = {"action": "approve_selected", "_selected_action": [pending.pk, other.pk]}
    page = client.post(REQUESTS, selection, follow=True)
    assert (page.context["count"], page.context["affected"]) == (2, 1)
    done = confirm(client, REQUESTS, selection, reason="ok")
    assert messages_of(done) == [f"Approved: {other.pk}.", f"Refused: {pending.pk} is rejected."]
    assert balance_of(pending.account) == 0 and balance_of(other.account) == 2_000


def test_deciding_needs_the_approve_permission(pending, treasurer):
    client = admin_client_for(treasurer)  # may deposit and request, may not approve
    listing = client.get(REQUESTS)
    assert listing.status_code == 200 and "approve_selected" not in listing.content.decode()
    for act in ("approve", "reject"):
        assert client.get(decide_url(pending, act)).status_code == 403
        assert client.post(decide_url(pending, act), {"confirmed": "1", "reason": "r"}).status_code == 403
        data = {"action": f"{act}_selected", "_selected_action": [pending.pk], "confirmed": "1", "reason": "r"}
        assert client.post(REQUESTS, data).status_code == 403
    assert DepositRequest.objects.get(pk=pending.pk).status == "pending"


def test_requests_and_staff_actions_are_read_only(pending, superuser):
    client = admin_client_for(superuser)
    url = reverse("admin:ledger_depositrequest_change", args=[quote(pending.pk)])
    assert client.post(url, {"amount": 10**9, "_save": "Save"}).status_code == 403
    action = StaffAction.objects.get()
    action_url = reverse("admin:ledger_staffaction_change", args=[action.pk])
    assert client.get(action_url).status_code == 200
    assert client.post(action_url, {"reason": "rewritten", "_save": "Save"}).status_code == 403
    for model in ("depositrequest", "staffaction"):
        assert client.get(reverse(f"admin:ledger_{model}_add")).status_code == 403
    assert client.get(reverse("admin:ledger_staffaction_delete", args=[action.pk])).status_code == 403
    found = client.get(reverse("admin:ledger_staffaction_changelist"), {"q": pending.account_id})
    assert [a.pk for a in listed(found)] == [action.pk]


def test_staff_actions_filter_by_the_account_given_in_the_url_and_offer_no_list_otherwise(treasurer):
    first, second = funded_account(balance=5), funded_account(balance=5)
    client = admin_client_for(treasurer)
    for account in (first, second):
        confirm(client, ACCOUNTS, {"action": "freeze_selected", "_selected_action": [account.pk]}, reason="fraud")
    changelist = reverse("admin:ledger_staffaction_changelist")
    page = client.get(changelist, {"account": first.pk})
    assert [a.account_id for a in listed(page)] == [first.pk]
    specs = {spec.parameter_name: spec for spec in page.context["cl"].filter_specs if hasattr(spec, "parameter_name")}
    assert specs["account"].has_output()  # the given account is offered as the choice
    unfiltered = client.get(changelist)
    assert {a.account_id for a in listed(unfiltered)} == {first.pk, second.pk}
    specs = {s.parameter_name: s for s in unfiltered.context["cl"].filter_specs if hasattr(s, "parameter_name")}
    assert "account" not in specs  # no list of every account: the filter shows only once given


# --- transfers ---------------------------------------------------------------------------


def test_transfer_list_filters_by_account_and_date_and_searches_by_key(auditor_user):
    a, b = funded_account(balance=100), funded_account(balance=30)
    ledger_deposit(key="dep_extra", account_id=b.pk, amount=5)
    client = admin_client_for(auditor_user)
    keys = {t.key for t in listed(client.get(TRANSFERS, {"account": b.pk}))}
    assert len(keys) == 2 and "dep_extra" in keys
    assert {t.key for t in listed(client.get(TRANSFERS, {"account": ISSUANCE_ACCOUNT_ID}))} >= keys
    midnight = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    today = {"created_at__gte": str(midnight), "created_at__lt": str(midnight + timedelta(days=1))}  # the "Today" link
    assert {t.key for t in listed(client.get(TRANSFERS, today))} >= keys
    before = {"created_at__lt": str(midnight - timedelta(days=400))}
    assert listed(client.get(TRANSFERS, before)) == []
    assert [t.key for t in listed(client.get(TRANSFERS, {"q": "dep_extra"}))] == ["dep_extra"]
    assert len(listed(client.get(TRANSFERS, {"q": a.pk}))) == 1


def test_transfers_are_read_only(superuser):
    account = funded_account(balance=10)
    transfer = Transfer.objects.get(credit_account=account)
    client = admin_client_for(superuser)
    url = reverse("admin:ledger_transfer_change", args=[transfer.pk])
    assert client.get(url).status_code == 200
    assert client.post(url, {"amount": 10**6, "_save": "Save"}).status_code == 403
    transfer.refresh_from_db()
    assert transfer.amount == 10
    assert client.get(reverse("admin:ledger_transfer_add")).status_code == 403
    assert client.get(reverse("admin:ledger_transfer_delete", args=[transfer.pk])).status_code == 403
