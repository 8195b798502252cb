"""Four eyes and authorship (issue 14): deposits above DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD
are requested by one staff member and approved by another, exactly once; every deposit,
decision, freeze and staff cancel records its author and a reason in the act's own
transaction; the admin's deposit form works once per opened form."""

from datetime import timedelta

import pytest
from django.db import IntegrityError, InternalError, transaction
from django.utils import timezone

from ledger.models import ISSUANCE_ACCOUNT_ID, Account, DepositFormToken, DepositRequest, StaffAction, Transfer
from ledger.services import (
    AccountStateError,
    DepositFormInvalid,
    DepositNeedsApproval,
    DepositRefused,
    DepositRequestNotFound,
    DepositRequestNotPending,
    ReasonRequired,
    SelfApprovalForbidden,
    account_deposit,
    account_freeze,
    account_set_status,
    deposit_form_open,
    deposit_form_submit,
    deposit_request_approve,
    deposit_request_create,
    deposit_request_reject,
    deposit_submit,
)
from payments.services import payment_cancel_by_staff
from tests.concurrency import run_concurrently
from tests.factories import UserFactory, funded_account, future_payment

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _threshold(settings):
    settings.DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD = 1_000


@pytest.fixture
def alice(db):
    return UserFactory(is_staff=True)


@pytest.fixture
def bob(db):
    return UserFactory(is_staff=True)


def balance(account) -> int:
    return Account.objects.get(pk=account.pk).balance


def actions(**filters) -> list[tuple]:
    rows = StaffAction.objects.filter(**filters).order_by("id")
    return [(a.action, a.actor_id, a.reason, a.account_id, a.amount) for a in rows]


# --- the threshold ---------------------------------------------------------------------------


def test_a_deposit_at_the_threshold_posts_at_once_with_its_author_and_reason(alice):
    account = funded_account(balance=0)
    submission = deposit_submit(account_id=account.pk, amount=1_000, actor=alice, reason="  welcome bonus ")
    assert submission.request is None and submission.deposit.amount == 1_000
    assert balance(account) == 1_000
    (action,) = StaffAction.objects.all()
    assert (action.action, action.actor, action.reason, action.account_id, action.amount, action.transfer_key) == (
        "deposit", alice, "welcome bonus", account.pk, 1_000, submission.deposit.key
    )


def test_a_deposit_above_the_threshold_is_a_request_and_moves_nothing(alice):
    account = funded_account(balance=0)
    submission = deposit_submit(account_id=account.pk, amount=1_001, actor=alice, reason="funding")
    request = submission.request
    assert submission.deposit is None
    assert (request.status, request.amount, request.requested_by) == ("pending", 1_001, alice)
    assert request.reason == "funding"
    assert balance(account) == 0 and not Transfer.objects.filter(credit_account=account).exists()
    assert actions() == [("deposit_requested", alice.pk, "funding", account.pk, 1_001)]
    with pytest.raises(DepositNeedsApproval):  # the direct service cannot be used to skip the second person
        account_deposit(account_id=account.pk, amount=1_001, actor=alice, reason="funding")
    assert balance(account) == 0


def test_a_threshold_of_zero_sends_every_deposit_for_approval(settings, alice):
    settings.DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD = 0
    account = funded_account(balance=0)
    assert deposit_submit(account_id=account.pk, amount=1, actor=alice, reason="r").request is not None


@pytest.mark.parametrize("reason", ["", "   ", None, "x" * 501])
def test_every_staff_act_needs_a_reason(alice, bob, reason):
    account = funded_account(balance=0)
    request = deposit_request_create(account_id=account.pk, amount=5_000, actor=alice, reason="r")
    payment = future_payment(source=funded_account(balance=10), target=account)
    for act in (
        lambda: deposit_submit(account_id=account.pk, amount=10, actor=alice, reason=reason),
        lambda: deposit_submit(account_id=account.pk, amount=5_000, actor=alice, reason=reason),
        lambda: deposit_request_approve(request_id=request.pk, actor=bob, reason=reason),
        lambda: deposit_request_reject(request_id=request.pk, actor=bob, reason=reason),
        lambda: account_freeze(account_id=account.pk, frozen=True, actor=bob, reason=reason),
        lambda: payment_cancel_by_staff(payment_id=payment.pk, actor=bob, reason=reason),
    ):
        with pytest.raises(ReasonRequired):
            act()
    assert balance(account) == 0
    assert DepositRequest.objects.get().status == "pending"
    assert Account.objects.get(pk=account.pk).status == "active"
    payment.refresh_from_db()
    assert payment.status == "SCHEDULED"
    assert StaffAction.objects.count() == 1  # the request's own


# --- approval: another person, once ---------------------------------------------------------


def test_another_staff_member_approves_and_the_money_moves_once(alice, bob):
    account = funded_account(balance=0)
    request = deposit_request_create(account_id=account.pk, amount=5_000, actor=alice, reason="seed funding")
    decision = deposit_request_approve(request_id=request.pk, actor=bob, reason="checked the contract")
    assert decision.changed_now and decision.deposit.amount == 5_000 and decision.deposit.key == request.pk
    request.refresh_from_db()
    assert (request.status, request.decided_by, request.decision_reason) == ("approved", bob, "checked the contract")
    assert request.decided_at is not None
    assert balance(account) == 5_000
    assert Account.objects.get(pk=ISSUANCE_ACCOUNT_ID).balance == -5_000
    transfer = Transfer.objects.get(key=request.pk)
    assert (transfer.credit_account_id, transfer.amount) == (account.pk, 5_000)

    again = deposit_request_approve(request_id=request.pk, actor=bob, reason="double click")
    assert not again.changed_now and again.request.status == "approved"
    assert balance(account) == 5_000
    assert actions() == [
        ("deposit_requested", alice.pk, "seed funding", account.pk, 5_000),
        ("deposit_approved", bob.pk, "checked the contract", account.pk, 5_000),
    ]
    assert StaffAction.objects.get(action="deposit_approved").transfer_key == request.pk


def test_the_requester_can_neither_approve_nor_reject(alice):
    account = funded_account(balance=0)
    request = deposit_request_create(account_id=account.pk, amount=5_000, actor=alice, reason="r")
    with pytest.raises(SelfApprovalForbidden):
        deposit_request_approve(request_id=request.pk, actor=alice, reason="it's fine")
    with pytest.raises(SelfApprovalForbidden):
        deposit_request_reject(request_id=request.pk, actor=alice, reason="never mind")
    assert DepositRequest.objects.get(pk=request.pk).status == "pending"
    assert balance(account) == 0


def test_the_database_refuses_a_decision_by_the_requester(alice):
    """Four eyes hold even for code that skips the services (a bug, a shell)."""
    request = deposit_request_create(account_id=funded_account().pk, amount=5_000, actor=alice, reason="r")
    with pytest.raises(IntegrityError), transaction.atomic():
        DepositRequest.objects.filter(pk=request.pk).update(
            status="approved", decided_by=alice, decided_at=timezone.now()
        )


def test_a_decided_request_never_changes_again(alice, bob):
    request = deposit_request_create(account_id=funded_account().pk, amount=5_000, actor=alice, reason="r")
    deposit_request_reject(request_id=request.pk, actor=bob, reason="no contract")
    with pytest.raises(DepositRequestNotPending) as not_pending:
        deposit_request_approve(request_id=request.pk, actor=bob, reason="oops")
    assert not_pending.value.status == "rejected"
    assert not deposit_request_reject(request_id=request.pk, actor=bob, reason="again").changed_now
    for write in (
        lambda: DepositRequest.objects.filter(pk=request.pk).update(status="pending", decided_by=None, decided_at=None),
        lambda: DepositRequest.objects.filter(pk=request.pk).update(amount=1),
        lambda: DepositRequest.objects.filter(pk=request.pk).delete(),
    ):
        with pytest.raises((InternalError, IntegrityError)), transaction.atomic():
            write()
    approved = deposit_request_create(account_id=funded_account().pk, amount=5_000, actor=alice, reason="r")
    deposit_request_approve(request_id=approved.pk, actor=bob, reason="ok")
    with pytest.raises(DepositRequestNotPending):
        deposit_request_reject(request_id=approved.pk, actor=bob, reason="too late")
    with pytest.raises(DepositRequestNotFound):
        deposit_request_approve(request_id="dreq_nope", actor=bob, reason="r")


def test_an_approval_the_ledger_refuses_keeps_the_request_pending(alice, bob):
    account = funded_account(balance=0)
    request = deposit_request_create(account_id=account.pk, amount=5_000, actor=alice, reason="r")
    account_set_status(account_id=account.pk, status=Account.Status.CLOSED)
    with pytest.raises(DepositRefused) as refused:
        deposit_request_approve(request_id=request.pk, actor=bob, reason="ok")
    assert refused.value.reason == "account_closed"
    assert DepositRequest.objects.get(pk=request.pk).status == "pending"
    assert not StaffAction.objects.filter(action="deposit_approved").exists()
    assert deposit_request_reject(request_id=request.pk, actor=bob, reason="account closed").changed_now


def test_a_request_into_a_system_or_closed_account_is_refused_at_once(alice):
    closed = funded_account()
    account_set_status(account_id=closed.pk, status=Account.Status.CLOSED)
    for account_id in (ISSUANCE_ACCOUNT_ID, closed.pk):
        with pytest.raises(DepositRefused):
            deposit_request_create(account_id=account_id, amount=5_000, actor=alice, reason="r")
    assert not DepositRequest.objects.exists() and not StaffAction.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_two_approvers_racing_post_once():
    alice, bob, carol = (UserFactory(is_staff=True) for _ in range(3))
    for _ in range(5):
        account = funded_account(balance=0)
        request_id = deposit_request_create(account_id=account.pk, amount=5_000, actor=alice, reason="r").pk
        results = run_concurrently(
            *(
                lambda who=who, request_id=request_id: deposit_request_approve(
                    request_id=request_id, actor=who, reason=f"{who.username} says yes"
                )
                for who in (bob, carol)
            )
        )
        assert not [r for r in results if isinstance(r, Exception)], results
        assert sorted(r.changed_now for r in results) == [False, True]
        assert balance(account) == 5_000
        assert Transfer.objects.filter(key=request_id).count() == 1
        assert StaffAction.objects.filter(deposit_request_id=request_id, action="deposit_approved").count() == 1


@pytest.mark.django_db(transaction=True)
def test_an_approval_racing_a_rejection_decides_once():
    alice, bob, carol = (UserFactory(is_staff=True) for _ in range(3))
    account = funded_account(balance=0)
    request = deposit_request_create(account_id=account.pk, amount=5_000, actor=alice, reason="r")
    results = run_concurrently(
        lambda: deposit_request_approve(request_id=request.pk, actor=bob, reason="yes"),
        lambda: deposit_request_reject(request_id=request.pk, actor=carol, reason="no"),
    )
    winners = [r for r in results if not isinstance(r, Exception)]
    assert len(winners) == 1 and isinstance(next(r for r in results if r not in winners), DepositRequestNotPending)
    final = DepositRequest.objects.get(pk=request.pk).status
    assert balance(account) == (5_000 if final == "approved" else 0)


# --- freeze, cancel -----------------------------------------------------------------------------


def test_freeze_and_unfreeze_record_who_and_why_only_when_they_change_something(bob):
    account = funded_account()
    assert account_freeze(account_id=account.pk, frozen=True, actor=bob, reason="fraud report").changed_now
    assert not account_freeze(account_id=account.pk, frozen=True, actor=bob, reason="again").changed_now
    assert account_freeze(account_id=account.pk, frozen=False, actor=bob, reason="cleared").changed_now
    assert actions() == [
        ("freeze", bob.pk, "fraud report", account.pk, None),
        ("unfreeze", bob.pk, "cleared", account.pk, None),
    ]
    with pytest.raises(AccountStateError):
        account_freeze(account_id=ISSUANCE_ACCOUNT_ID, frozen=True, actor=bob, reason="no")


def test_a_staff_cancel_records_who_and_why_with_the_payment(bob):
    source, target = funded_account(balance=50), funded_account()
    payment = future_payment(source=source, target=target, amount=7)
    outcome = payment_cancel_by_staff(payment_id=payment.pk, actor=bob, reason="customer called")
    assert outcome.cancelled_now and outcome.payment.status == "CANCELLED"
    assert not payment_cancel_by_staff(payment_id=payment.pk, actor=bob, reason="again").cancelled_now
    action = StaffAction.objects.get()
    assert (action.action, action.actor, action.reason, action.account_id, action.payment_id, action.amount) == (
        "payment_cancel", bob, "customer called", source.pk, payment.pk, 7
    )


def test_staff_actions_are_append_only(bob):
    account_freeze(account_id=funded_account().pk, frozen=True, actor=bob, reason="r")
    for write in (
        lambda: StaffAction.objects.update(reason="rewritten"),
        lambda: StaffAction.objects.all().delete(),
    ):
        with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
            write()
    with pytest.raises(IntegrityError), transaction.atomic():
        StaffAction.objects.create(actor=bob, action="freeze", reason=" ")


# --- the admin's deposit form: a one-time token per opened form ---------------------------------


def test_a_form_token_deposits_once_however_often_it_is_submitted(alice):
    account = funded_account(balance=0)
    token = deposit_form_open(account_id=account.pk, actor=alice)
    first = deposit_form_submit(token=token, account_id=account.pk, actor=alice, amount=250, reason="r")
    again = deposit_form_submit(token=token, account_id=account.pk, actor=alice, amount=250, reason="r")
    assert not first.already and again.already
    assert first.submission.deposit.key == again.submission.deposit.key == token
    assert balance(account) == 250
    assert StaffAction.objects.filter(action="deposit").count() == 1
    assert DepositFormToken.objects.get(pk=token).consumed_at is not None


def test_a_form_token_above_the_threshold_files_one_request(alice):
    account = funded_account(balance=0)
    token = deposit_form_open(account_id=account.pk, actor=alice)
    first = deposit_form_submit(token=token, account_id=account.pk, actor=alice, amount=5_000, reason="r")
    again = deposit_form_submit(token=token, account_id=account.pk, actor=alice, amount=5_000, reason="r")
    assert again.already and again.submission.request.pk == first.submission.request.pk
    assert DepositRequest.objects.count() == 1 and balance(account) == 0


def test_a_form_token_is_bound_to_its_user_account_and_age(alice, bob):
    account, other = funded_account(balance=0), funded_account(balance=0)
    token = deposit_form_open(account_id=account.pk, actor=alice)
    for kwargs in (
        {"token": token, "account_id": account.pk, "actor": bob},  # someone else's form
        {"token": token, "account_id": other.pk, "actor": alice},  # another account's
        {"token": "adep_made_up", "account_id": account.pk, "actor": alice},
    ):
        with pytest.raises(DepositFormInvalid):
            deposit_form_submit(amount=10, reason="r", **kwargs)
    DepositFormToken.objects.filter(pk=token).update(issued_at=timezone.now() - timedelta(hours=25))
    with pytest.raises(DepositFormInvalid):
        deposit_form_submit(token=token, account_id=account.pk, actor=alice, amount=10, reason="r")
    assert balance(account) == balance(other) == 0


def test_a_refused_form_submit_keeps_its_token_for_a_corrected_resubmit(alice):
    account = funded_account(balance=0)
    token = deposit_form_open(account_id=account.pk, actor=alice)
    account_set_status(account_id=account.pk, status=Account.Status.CLOSED)
    with pytest.raises(DepositRefused):
        deposit_form_submit(token=token, account_id=account.pk, actor=alice, amount=10, reason="r")
    assert DepositFormToken.objects.get(pk=token).consumed_at is None


@pytest.mark.django_db(transaction=True)
def test_a_form_submitted_twice_at_once_deposits_once():
    alice = UserFactory(is_staff=True)
    account = funded_account(balance=0)
    token = deposit_form_open(account_id=account.pk, actor=alice)
    submit = lambda: deposit_form_submit(token=token, account_id=account.pk, actor=alice, amount=70, reason="r")  # noqa: E731
    results = run_concurrently(submit, submit, submit)
    assert not [r for r in results if isinstance(r, Exception)], results
    assert sorted(r.already for r in results) == [False, True, True]
    assert balance(account) == 70
