import pytest
from django.db import IntegrityError, connection, transaction

from common.ids import new_id
from ledger.models import ISSUANCE_ACCOUNT_ID, Account, Transfer
from ledger.services import (
    DepositRefused,
    Outcome,
    Posting,
    UnknownAccount,
    account_deposit,
    account_deposit_check,
    account_set_status,
    ledger_deposit,
    ledger_post_batch,
    ledger_transfer,
)
from tests.factories import UserFactory, funded_account

pytestmark = pytest.mark.django_db


def teller():
    """A staff member who deposits (the services take the actor; permissions are the callers')."""
    return UserFactory(is_staff=True)


def balances_sum() -> int:
    return sum(Account.objects.values_list("balance", flat=True))


def test_deposit_credits_account_from_issuance_and_keeps_sum_zero():
    account = funded_account(balance=0)
    result = ledger_deposit(key="dep_1", account_id=account.id, amount=700)
    assert result.outcome == Outcome.APPLIED
    account.refresh_from_db()
    assert account.balance == 700
    assert Account.objects.get(pk=ISSUANCE_ACCOUNT_ID).balance == -700
    assert balances_sum() == 0


# --- account_deposit: the one deposit service of the API and the admin ----------------------


def test_account_deposit_mints_a_key_and_returns_the_balance_right_after():
    account = funded_account(balance=5)
    deposit = account_deposit(account_id=account.id, amount=20, actor=teller(), reason="test")
    assert deposit.key.startswith("dep_") and not deposit.replayed
    assert (deposit.account_id, deposit.amount, deposit.balance) == (account.id, 20, 25)
    transfer = Transfer.objects.get(key=deposit.key)
    assert (transfer.debit_account_id, transfer.credit_account_id) == (ISSUANCE_ACCOUNT_ID, account.id)
    assert deposit.posted_at == transfer.created_at
    again = account_deposit(account_id=account.id, amount=20, actor=teller(), reason="test")
    assert again.key != deposit.key  # a new key each time
    assert balances_sum() == 0


def test_account_deposit_with_a_given_key_moves_money_once_and_replays_the_first_deposit():
    account = funded_account()
    first = account_deposit(account_id=account.id, amount=30, key="adep_1", actor=teller(), reason="test")
    # A resubmit, amount edited:
    again = account_deposit(account_id=account.id, amount=99, key="adep_1", actor=teller(), reason="test")
    assert first.key == again.key == "adep_1"
    assert not first.replayed and again.replayed
    assert (again.account_id, again.amount, again.balance, again.posted_at) == (
        account.id, 30, 30, first.posted_at
    )
    assert Transfer.objects.filter(key="adep_1").count() == 1
    account.refresh_from_db()
    assert account.balance == 30


def test_account_deposit_refuses_a_closed_account_and_moves_nothing():
    account = funded_account(balance=10)
    account_set_status(account_id=account.id, status=Account.Status.CLOSED)
    with pytest.raises(DepositRefused) as refused:
        account_deposit(account_id=account.id, amount=5, key="dep_closed", actor=teller(), reason="test")
    assert refused.value.reason == "account_closed"
    assert refused.value.detail == str(refused.value) == "The deposit was rejected: account_closed."
    assert not Transfer.objects.filter(key="dep_closed").exists()
    assert Account.objects.get(pk=account.id).balance == 10


def test_account_deposit_refuses_a_system_account():
    issuance = Account.objects.get(pk=ISSUANCE_ACCOUNT_ID)
    with pytest.raises(DepositRefused) as refused:
        account_deposit_check(account=issuance)
    assert (refused.value.reason, refused.value.detail) == ("not_a_user_account", "Deposits go to user accounts only.")
    with pytest.raises(DepositRefused, match="user accounts only"):
        account_deposit(account_id=ISSUANCE_ACCOUNT_ID, amount=5, actor=teller(), reason="test")
    assert Account.objects.get(pk=ISSUANCE_ACCOUNT_ID).balance == 0
    assert not Transfer.objects.exists()


def test_account_deposit_into_an_unknown_account_raises():
    with pytest.raises(UnknownAccount):
        account_deposit(account_id="acc_nope", amount=5, actor=teller(), reason="test")


def test_transfer_is_idempotent_on_its_key():
    a, b = funded_account(balance=100), funded_account()
    first = ledger_transfer(key="k1", debit_account_id=a.id, credit_account_id=b.id, amount=60)
    again = ledger_transfer(key="k1", debit_account_id=a.id, credit_account_id=b.id, amount=60)
    assert first.outcome == Outcome.APPLIED
    assert again.outcome == Outcome.ALREADY_APPLIED
    assert again.posted_at == first.posted_at
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.balance, b.balance) == (40, 60)
    assert Transfer.objects.filter(key="k1").count() == 1


def test_already_applied_is_reported_before_the_funds_check():
    a, b = funded_account(balance=100), funded_account()
    ledger_transfer(key="k1", debit_account_id=a.id, credit_account_id=b.id, amount=100)
    # a is now empty: a retry of k1 must still say "applied", never "insufficient".
    again = ledger_transfer(key="k1", debit_account_id=a.id, credit_account_id=b.id, amount=100)
    assert again.outcome == Outcome.ALREADY_APPLIED


def test_insufficient_funds_moves_nothing():
    a, b = funded_account(balance=10), funded_account()
    result = ledger_transfer(key="k", debit_account_id=a.id, credit_account_id=b.id, amount=11)
    assert result.outcome == Outcome.INSUFFICIENT_FUNDS
    assert not Transfer.objects.filter(key="k").exists()
    a.refresh_from_db()
    assert a.balance == 10


def test_batch_applies_in_order_against_running_balances():
    a, b = funded_account(balance=100), funded_account()
    with transaction.atomic():
        results = ledger_post_batch(
            postings=[
                Posting("p1", a.id, b.id, 70),
                Posting("p2", a.id, b.id, 40),  # only 30 left
                Posting("p3", a.id, b.id, 30),
            ]
        )
    assert [results[k].outcome for k in ("p1", "p2", "p3")] == [
        Outcome.APPLIED,
        Outcome.INSUFFICIENT_FUNDS,
        Outcome.APPLIED,
    ]
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.balance, b.balance) == (0, 100)


def test_frozen_account_cannot_send_but_can_receive():
    a, b = funded_account(balance=100), funded_account(balance=100)
    account_set_status(account_id=a.id, status=Account.Status.FROZEN)
    out = ledger_transfer(key="out", debit_account_id=a.id, credit_account_id=b.id, amount=5)
    into = ledger_transfer(key="in", debit_account_id=b.id, credit_account_id=a.id, amount=5)
    assert out.outcome == Outcome.ACCOUNT_FROZEN
    assert into.outcome == Outcome.APPLIED


def test_closed_account_neither_sends_nor_receives():
    a, b = funded_account(balance=100), funded_account(balance=100)
    account_set_status(account_id=b.id, status=Account.Status.CLOSED)
    assert ledger_transfer(key="x", debit_account_id=a.id, credit_account_id=b.id, amount=5).outcome == (
        Outcome.ACCOUNT_CLOSED
    )
    assert ledger_transfer(key="y", debit_account_id=b.id, credit_account_id=a.id, amount=5).outcome == (
        Outcome.ACCOUNT_CLOSED
    )


def test_database_refuses_negative_user_balance_even_bypassing_the_service():
    a = funded_account(balance=5)
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cur:
        cur.execute("UPDATE ledger_account SET balance = -1 WHERE id = %s", [a.id])


@pytest.mark.parametrize("emptied", [False, True])
def test_an_account_is_never_deleted(emptied):
    # Transfers carry no foreign key to their accounts (decision 0014): the trigger is what
    # keeps every transfer's accounts in existence, with or without transfers of its own.
    account = funded_account(balance=0 if emptied else 5)
    with pytest.raises(IntegrityError, match="never deleted"), transaction.atomic(), connection.cursor() as cur:
        cur.execute("DELETE FROM ledger_account WHERE id = %s", [account.id])
    assert Account.objects.filter(pk=account.pk).exists()


def test_a_transfer_names_only_accounts_that_exist():
    a = funded_account(balance=5)
    with pytest.raises(UnknownAccount), transaction.atomic():
        ledger_post_batch(postings=[Posting("k", a.id, "acc_nobody", 1)])
    assert not Transfer.objects.filter(key="k").exists()


def test_issuance_account_may_go_negative():
    a = funded_account()
    ledger_deposit(key=new_id("dep"), account_id=a.id, amount=10**12)
    assert Account.objects.get(pk=ISSUANCE_ACCOUNT_ID).balance == -(10**12)


@pytest.mark.parametrize("statement", ["UPDATE ledger_transfer SET amount = 1", "DELETE FROM ledger_transfer"])
def test_transfers_are_append_only(statement):
    a = funded_account(balance=5)
    assert Transfer.objects.filter(credit_account=a).exists()
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic(), connection.cursor() as cur:
        cur.execute(statement)


def test_transfer_amount_must_be_positive_in_the_database():
    a, b = funded_account(balance=5), funded_account()
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            "INSERT INTO ledger_transfer (key, debit_account_id, credit_account_id, amount, created_at)"
            " VALUES ('z', %s, %s, 0, now())",
            [a.id, b.id],
        )
