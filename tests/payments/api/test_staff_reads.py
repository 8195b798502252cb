"""Staff reads through the API need the model's view permission, as in the admin
(common/authz.py). Each embedded read too: a payment's attempts, a series' occurrences, an
account's transfers. Every role and route: tests/test_permission_matrix.py."""

import pytest
from django.contrib.auth.models import Permission

from ledger.services import ledger_transfer
from tests.api import future, patch, post
from tests.conftest import client_for
from tests.factories import AccountFactory, UserFactory, funded_account, parked_payment

pytestmark = pytest.mark.django_db


def staff_with(*codenames: str, is_staff: bool = True):
    user = UserFactory(is_staff=is_staff)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return client_for(user)


@pytest.fixture
def source():
    return funded_account(balance=100)


@pytest.fixture
def parked(settings, source):
    """Someone else's payment in review, with its two attempts."""
    return parked_payment(settings, source=source, target=funded_account())


def test_staff_without_the_view_permission_are_strangers_to_others_payments(parked):
    url = f"/api/v1/payments/{parked.id}"
    for client in (client_for(UserFactory(is_staff=True)), staff_with("view_account", "view_executionattempt")):
        assert client.get(url).status_code == 404
        assert parked.id not in {p["payment_id"] for p in client.get("/api/v1/payments").json()["items"]}


def test_a_view_permission_without_is_staff_grants_nothing(parked):
    """As the admin, which lets no one in without is_staff."""
    assert staff_with("view_scheduledpayment", is_staff=False).get(f"/api/v1/payments/{parked.id}").status_code == 404


def test_the_attempts_of_someone_elses_payment_need_the_attempt_view_permission(parked):
    url = f"/api/v1/payments/{parked.id}"
    assert client_for(parked.payer).get(url).json()["attempts"] != []  # the payer's own
    assert staff_with("view_scheduledpayment").get(url).json()["attempts"] == []
    listed = staff_with("view_scheduledpayment").get("/api/v1/payments").json()["items"]
    assert [p["attempts"] for p in listed if p["payment_id"] == parked.id] == [[]]
    both = staff_with("view_scheduledpayment", "view_executionattempt").get(url).json()["attempts"]
    assert [a["attempt"] for a in both] == [a["attempt"] for a in client_for(parked.payer).get(url).json()["attempts"]]


def test_the_change_permission_lets_staff_read_as_in_the_admin(source):
    """The admin counts view or change as reading; so does the API."""
    payment = post(
        client_for(source.owner), "/api/v1/payments",
        {"from_account": source.id, "to_account": funded_account().id, "amount": 5, "execute_at": future()}, key="p",
    ).json()
    client = staff_with("change_scheduledpayment")
    url = f"/api/v1/payments/{payment['payment_id']}"
    assert client.get(url).status_code == 200
    assert patch(client, url, {"amount": 6}).json()["amount"] == 6


def test_the_occurrences_of_someone_elses_series_need_the_payment_view_permission(source):
    body = {"from_account": source.id, "to_account": funded_account().id, "amount": 2, "start_at": future(),
            "interval": "P1D"}
    series = post(client_for(source.owner), "/api/v1/recurring-payments", body, key="r").json()
    url = f"/api/v1/recurring-payments/{series['recurring_id']}"
    assert len(series["occurrences"]["items"]) == 1
    assert staff_with("view_recurringpayment").get(url).json()["occurrences"]["items"] == []
    both = staff_with("view_recurringpayment", "view_scheduledpayment").get(url).json()["occurrences"]["items"]
    assert both == series["occurrences"]["items"]


def test_the_transfers_of_someone_elses_account_need_the_transfer_view_permission(source):
    url = f"/api/v1/accounts/{source.id}/transfers"
    reader = UserFactory(is_staff=True)
    reader.user_permissions.add(Permission.objects.get(codename="view_account"))
    client = client_for(reader)
    assert client.get(url).json()["items"] == []  # the account, but not its history
    # A transfer with one of the reader's own accounts is theirs to see.
    own = AccountFactory(owner=reader)
    ledger_transfer(key="t-own", debit_account_id=source.id, credit_account_id=own.id, amount=3)
    assert [t["key"] for t in client.get(url).json()["items"]] == ["t-own"]
    both = staff_with("view_account", "view_transfer").get(url).json()["items"]
    assert len(both) == 2 and both[0]["key"] == "t-own"  # and the deposit that funded it
