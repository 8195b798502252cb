"""The ledger console: accounts (freeze, unfreeze, deposit) and transfers."""

import re
from datetime import timedelta

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.core import signing
from django.urls import reverse
from django.utils import timezone

from ledger.forms import DEPOSIT_TOKEN_SALT, deposit_token
from ledger.models import ISSUANCE_ACCOUNT_ID, Account, Transfer
from ledger.services import account_set_status, ledger_deposit
from payments.execution import execute_batch
from payments.models import PaymentStatus
from payments.promoter import claim_due
from tests.conftest import admin_client_for
from tests.factories import UserFactory, due_payment, funded_account

pytestmark = pytest.mark.django_db

ACCOUNTS = reverse("admin:ledger_account_changelist")
TRANSFERS = reverse("admin:ledger_transfer_changelist")


def account_url(account) -> str:
    return reverse("admin:ledger_account_change", args=[quote(account.pk)])


def deposit_url(account) -> str:
    return reverse("admin:ledger_account_deposit", args=[quote(account.pk)])


def staff_with(*codenames: str):
    user = UserFactory(is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


@pytest.fixture
def treasurer(db):
    return staff_with("view_account", "view_transfer", "freeze_account", "deposit_account")


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
    assert f'href="{TRANSFERS}?account={quote(rich.pk)}"' in html


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
    assert client.get(reverse("admin:ledger_account_delete", args=[quote(account.pk)])).status_code == 403


def test_freeze_makes_scheduled_payments_fail_as_account_frozen_and_unfreeze_restores(treasurer):
    source, target = funded_account(balance=100), funded_account()
    client = admin_client_for(treasurer)
    response = client.post(ACCOUNTS, {"action": "freeze_selected", "_selected_action": [source.pk]}, follow=True)
    assert messages_of(response)[0] == f"Frozen: {source.pk}."
    source.refresh_from_db()
    assert source.status == Account.Status.FROZEN

    payment = due_payment(source=source, target=target, amount=10, seconds_ago=120)
    claim = claim_due(batch=100, lease_seconds=60)
    execute_batch(pairs=claim.fresh, worker="w1")
    payment.refresh_from_db()
    assert (payment.status, payment.failure_reason) == (PaymentStatus.FAILED, "account_frozen")
    source.refresh_from_db()
    assert source.balance == 100  # nothing moved
    assert not Transfer.objects.filter(key=payment.pk).exists()

    response = client.post(ACCOUNTS, {"action": "unfreeze_selected", "_selected_action": [source.pk]}, follow=True)
    assert messages_of(response) == [f"Unfrozen: {source.pk}."]
    source.refresh_from_db()
    assert source.status == Account.Status.ACTIVE


def test_freeze_reports_unchanged_and_refuses_system_and_closed_accounts(treasurer):
    frozen, closed = funded_account(), funded_account()
    account_set_status(account_id=frozen.pk, status=Account.Status.FROZEN)
    account_set_status(account_id=closed.pk, status=Account.Status.CLOSED)
    response = admin_client_for(treasurer).post(
        ACCOUNTS,
        {"action": "freeze_selected", "_selected_action": [frozen.pk, closed.pk, ISSUANCE_ACCOUNT_ID]},
        follow=True,
    )
    text = messages_of(response)
    assert text[0] == f"Already frozen: {frozen.pk}."
    assert text[1].startswith("Refused: ")
    assert f"{ISSUANCE_ACCOUNT_ID} is a system account" in text[1]
    assert f"{closed.pk}: a closed account cannot be reopened" in text[1]
    assert Account.objects.get(pk=ISSUANCE_ACCOUNT_ID).status == Account.Status.ACTIVE
    assert Account.objects.get(pk=closed.pk).status == Account.Status.CLOSED


def test_freeze_needs_the_freeze_permission(support_user):
    account = funded_account()
    client = admin_client_for(support_user)
    assert "freeze_selected" not in client.get(ACCOUNTS).content.decode()
    client.post(ACCOUNTS, {"action": "freeze_selected", "_selected_action": [account.pk]})
    account.refresh_from_db()
    assert account.status == Account.Status.ACTIVE


# --- deposits ---------------------------------------------------------------------------


def deposit_form(client, account) -> dict:
    page = client.get(deposit_url(account)).content.decode()
    token = re.search(r'name="token" value="([^"]+)"', page).group(1)
    return {"amount": "250", "token": token}


def test_deposit_form_credits_the_account_once_however_often_it_is_submitted(treasurer):
    account = funded_account(balance=0)
    client = admin_client_for(treasurer)
    assert f'href="{deposit_url(account)}"' in client.get(account_url(account)).content.decode()
    form = deposit_form(client, account)

    first = client.post(deposit_url(account), form, follow=True)
    assert first.redirect_chain[-1][0] == account_url(account)
    assert messages_of(first)[0].startswith(f"Deposited 250 into {account.pk}")
    second = client.post(deposit_url(account), form, follow=True)  # the double submit
    assert messages_of(second)[0].startswith("This deposit form was already submitted: 250 was deposited")

    account.refresh_from_db()
    assert account.balance == 250
    assert Transfer.objects.filter(credit_account=account).count() == 1
    assert Account.objects.get(pk=ISSUANCE_ACCOUNT_ID).balance == -250

    another = client.post(deposit_url(account), deposit_form(client, account), follow=True)  # a new form: a new key
    assert messages_of(another)[0].startswith("Deposited 250")
    account.refresh_from_db()
    assert account.balance == 500


def test_deposit_refuses_a_forged_or_foreign_token(treasurer):
    account, other = funded_account(balance=0), funded_account(balance=0)
    client = admin_client_for(treasurer)
    payment_key = due_payment(source=funded_account(balance=5), target=other, amount=5).pk
    forged = signing.dumps({"account": account.pk, "key": payment_key}, salt="not-the-salt")
    for token in (payment_key, forged, deposit_token(account_id=other.pk)):
        response = client.post(deposit_url(account), {"amount": "10", "token": token})
        assert response.status_code == 200  # the form again, with its error
        assert response.context["form"].errors["token"]
    assert signing.loads(deposit_token(account_id=account.pk), salt=DEPOSIT_TOKEN_SALT)["account"] == account.pk
    account.refresh_from_db()
    assert account.balance == 0
    assert not Transfer.objects.filter(key=payment_key).exists()


def test_deposit_rejects_a_bad_amount_and_keeps_the_key(treasurer):
    account = funded_account(balance=0)
    client = admin_client_for(treasurer)
    form = deposit_form(client, account)
    for amount in ("0", "-5", "1.5", "abc", str(10**13)):
        response = client.post(deposit_url(account), {**form, "amount": amount})
        assert response.status_code == 200 and response.context["form"].errors["amount"], amount
    assert f'value="{form["token"]}"' in response.content.decode()
    assert not Transfer.objects.filter(credit_account=account).exists()


def test_deposit_into_a_closed_account_moves_nothing(treasurer):
    account = funded_account(balance=0)
    client = admin_client_for(treasurer)
    form = deposit_form(client, account)
    account_set_status(account_id=account.pk, status=Account.Status.CLOSED)
    response = client.post(deposit_url(account), form, follow=True)
    assert messages_of(response) == ["Deposit refused: account_closed. Nothing moved."]
    assert not Transfer.objects.filter(credit_account=account).exists()


def test_deposit_needs_the_deposit_permission(support_user):
    account = funded_account(balance=0)
    client = admin_client_for(support_user)
    assert f'href="{deposit_url(account)}"' not in client.get(account_url(account)).content.decode()
    assert client.get(deposit_url(account)).status_code == 403
    token = deposit_token(account_id=account.pk)
    assert client.post(deposit_url(account), {"amount": "10", "token": token}).status_code == 403
    account.refresh_from_db()
    assert account.balance == 0


def test_deposit_goes_to_user_accounts_only(superuser):
    issuance = Account.objects.get(pk=ISSUANCE_ACCOUNT_ID)
    response = admin_client_for(superuser).get(deposit_url(issuance), follow=True)
    assert messages_of(response) == ["Deposits go to user accounts only."]


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
