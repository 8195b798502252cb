"""Four eyes that cannot be gone around (issue 33): nobody deposits into an account they
own alone, nobody approves a deposit into an account they own, and splitting a deposit
into pieces under the threshold buys nothing (the approver-less deposits of an actor,
and into one beneficiary's accounts, are summed over DELAYPAY_DEPOSIT_APPROVAL_WINDOW_HOURS).
The same rule for the API, the admin and the services; the database refuses what it can
on its own."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction
from django.db.models.functions import Now
from django.urls import reverse

from common.admin_tools import id_in_url
from common.authz import ConflictOfInterest
from ledger.models import Account, DepositRequest, StaffAction
from ledger.services import (
    DepositNeedsApproval,
    account_deposit,
    account_freeze,
    deposit_approval_why,
    deposit_request_approve,
    deposit_request_create,
    deposit_request_reject,
    deposit_submit,
)
from tests.api import assert_error, post
from tests.concurrency import Racers
from tests.conftest import admin_client_for, client_for
from tests.factories import AccountFactory, UserFactory, funded_account

pytestmark = pytest.mark.django_db

THRESHOLD = 10_000
Why = DepositRequest.Why


@pytest.fixture(autouse=True)
def _threshold(settings):
    settings.DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD = THRESHOLD
    settings.DELAYPAY_DEPOSIT_APPROVAL_WINDOW_HOURS = 24


def treasurer():
    """A staff member of the shipped treasury group (deposits, approvals, the breaker)."""
    user = UserFactory(is_staff=True)
    user.groups.add(Group.objects.get(name="treasury"))
    return type(user).objects.get(pk=user.pk)


@pytest.fixture
def treasurers(staff_groups):
    return treasurer(), treasurer(), treasurer()


def balance(account) -> int:
    return Account.objects.get(pk=account.pk).balance


def api_deposit(user, account, amount, key):
    return post(client_for(user), f"/api/v1/accounts/{account.id}/deposits",
                {"amount": amount, "reason": "top-up"}, key=key)


# --- Into one's own account ---------------------------------------------------------------


def test_five_deposits_into_ones_own_account_each_wait_for_someone_else(treasurers):
    """The finding: five deposits of 10,000 into the treasurer's own account all posted
    (201), then a payout of 50,000 left. Now each is a request nobody moves alone."""
    me, other, _ = treasurers
    mine = AccountFactory(owner=me)
    for i in range(5):
        response = api_deposit(me, mine, THRESHOLD, key=f"own-{i}")
        assert response.status_code == 202, response.content
        body = response.json()
        assert (body["why"], body["beneficiary"], body["status"]) == ("own_account", me.username, "pending")
    assert balance(mine) == 0
    assert not StaffAction.objects.filter(action="deposit").exists()
    # Nor can the owner approve them (the beneficiary's refusal comes first).
    request_id = DepositRequest.objects.filter(account=mine).values_list("id", flat=True).first()
    assert_error(post(client_for(me), f"/api/v1/deposit-requests/{request_id}/approve", {"reason": "mine"}),
                 403, "conflict_of_interest")
    ok = post(client_for(other), f"/api/v1/deposit-requests/{request_id}/approve", {"reason": "checked"})
    assert ok.status_code == 200, ok.content
    assert balance(mine) == THRESHOLD


def test_a_deposit_of_one_unit_into_ones_own_account_is_a_request(treasurers):
    me = treasurers[0]
    mine = AccountFactory(owner=me)
    submission = deposit_submit(account_id=mine.pk, amount=1, actor=me, reason="tiny")
    assert submission.deposit is None and submission.request.why == Why.OWN_ACCOUNT
    with pytest.raises(DepositNeedsApproval):
        account_deposit(account_id=mine.pk, amount=1, actor=me, reason="tiny")
    assert balance(mine) == 0


def test_the_beneficiary_may_not_approve_a_deposit_into_their_account(treasurers):
    """The finding: treasurer 1 requests 50,000 into treasurer 2's account, treasurer 2
    approves it. Now 403 conflict_of_interest; treasurer 3 may."""
    first, second, third = treasurers
    theirs = AccountFactory(owner=second)
    created = api_deposit(first, theirs, 5 * THRESHOLD, key="big")
    assert created.status_code == 202
    request_id = created.json()["request_id"]
    refused = post(client_for(second), f"/api/v1/deposit-requests/{request_id}/approve", {"reason": "fine by me"})
    assert_error(refused, 403, "conflict_of_interest")
    assert balance(theirs) == 0 and DepositRequest.objects.get(pk=request_id).status == "pending"
    # Rejecting a deposit into one's own account benefits nobody: allowed.
    assert deposit_request_reject(request_id=request_id, actor=second, reason="not needed").changed_now
    again = deposit_request_create(account_id=theirs.pk, amount=5 * THRESHOLD, actor=first, reason="again")
    with pytest.raises(ConflictOfInterest):
        deposit_request_approve(request_id=again.pk, actor=second, reason="x")
    assert deposit_request_approve(request_id=again.pk, actor=third, reason="checked").changed_now
    assert balance(theirs) == 5 * THRESHOLD


def test_the_database_sets_the_beneficiary_and_refuses_its_approval(treasurers):
    first, second, third = treasurers
    theirs = AccountFactory(owner=second)
    # Whatever a writer says, the beneficiary is the account's owner.
    request = DepositRequest.objects.create(
        account=theirs, amount=20_000, reason="r", requested_by=first, beneficiary=third
    )
    request.refresh_from_db()
    assert request.beneficiary_id == second.pk
    with pytest.raises(IntegrityError, match="not_approved_by_beneficiary"), transaction.atomic():
        DepositRequest.objects.filter(pk=request.pk).update(status="approved", decided_by=second, decided_at=Now())
    with pytest.raises(IntegrityError), transaction.atomic():
        DepositRequest.objects.filter(pk=request.pk).update(beneficiary=third)


@pytest.mark.parametrize("action", ["deposit", "deposit_approved", "freeze", "unfreeze"])
def test_the_database_refuses_a_staff_act_on_money_recorded_by_the_accounts_owner(treasurers, action):
    me = treasurers[0]
    mine = AccountFactory(owner=me)
    with pytest.raises(IntegrityError, match="owns the account"), transaction.atomic():
        StaffAction.objects.create(actor=me, action=action, reason="r", account=mine, amount=1)
    StaffAction.objects.create(actor=treasurers[1], action=action, reason="r", account=mine, amount=1)


# --- Splits add up over the window ----------------------------------------------------------


def test_three_deposits_of_the_threshold_into_someone_elses_account_post_once(treasurers):
    """The finding: 3 x 10,000 into another user's account, all 201. Now the first posts,
    the next two wait for a second person (the actor's sum, then the beneficiary's)."""
    me = treasurers[0]
    theirs = funded_account(owner=UserFactory())
    codes = [api_deposit(me, theirs, THRESHOLD, key=f"split-{i}") for i in range(3)]
    assert [r.status_code for r in codes] == [201, 202, 202]
    assert [r.json()["why"] for r in codes[1:]] == ["actor_window", "actor_window"]
    assert balance(theirs) == THRESHOLD


def test_small_pieces_add_up_per_actor_across_accounts(treasurers):
    me = treasurers[0]
    accounts = [funded_account(owner=UserFactory()) for _ in range(3)]
    results = [deposit_submit(account_id=a.pk, amount=4_000, actor=me, reason="r") for a in accounts]
    assert [r.deposit is not None for r in results] == [True, True, False]
    assert results[2].request.why == Why.ACTOR_WINDOW


def test_small_pieces_add_up_per_beneficiary_across_actors_and_accounts(treasurers):
    first, second, _ = treasurers
    owner = UserFactory()
    one, two = AccountFactory(owner=owner), AccountFactory(owner=owner)
    assert deposit_submit(account_id=one.pk, amount=6_000, actor=first, reason="r").deposit is not None
    late = deposit_submit(account_id=two.pk, amount=6_000, actor=second, reason="r")
    assert late.deposit is None and late.request.why == Why.BENEFICIARY_WINDOW
    assert balance(one) + balance(two) == 6_000


def test_deposits_older_than_the_window_no_longer_count(treasurers, settings):
    me = treasurers[0]
    theirs = AccountFactory(owner=UserFactory())
    # A deposit recorded 25 hours ago (its staff action; the ledger is not read here).
    StaffAction.objects.create(actor=me, action="deposit", reason="old", account=theirs, amount=THRESHOLD,
                               created_at=Now() - timedelta(hours=25))
    assert deposit_approval_why(account=theirs, amount=THRESHOLD, actor=me) is None
    settings.DELAYPAY_DEPOSIT_APPROVAL_WINDOW_HOURS = 48
    assert deposit_approval_why(account=theirs, amount=THRESHOLD, actor=me) == Why.ACTOR_WINDOW


def test_approved_deposits_do_not_count_against_the_window(treasurers):
    """A deposit a second person approved had its four eyes: only approver-less ones add up."""
    first, second, _ = treasurers
    theirs = AccountFactory(owner=UserFactory())
    request = deposit_request_create(account_id=theirs.pk, amount=5 * THRESHOLD, actor=first, reason="big")
    deposit_request_approve(request_id=request.pk, actor=second, reason="ok")
    assert deposit_submit(account_id=theirs.pk, amount=THRESHOLD, actor=first, reason="r").deposit is not None


def test_a_replayed_key_replays_even_when_the_window_is_full(treasurers):
    me = treasurers[0]
    theirs = AccountFactory(owner=UserFactory())
    first = account_deposit(account_id=theirs.pk, amount=THRESHOLD, actor=me, reason="r", key="dep_same")
    again = account_deposit(account_id=theirs.pk, amount=THRESHOLD, actor=me, reason="r", key="dep_same")
    assert again.replayed and again.key == first.key and balance(theirs) == THRESHOLD


@pytest.mark.django_db(transaction=True)
def test_racing_pieces_under_the_threshold_never_both_post(staff_groups):
    """Two deposits of 6,000 by one treasurer into two accounts, started at the same
    instant, 20 times (a new treasurer each round, whose window starts empty): the sums
    are read under the actor's lock, so exactly one posts each round and the other waits
    for a second person."""
    with Racers(2) as racers:
        for _ in range(20):
            me = treasurer()
            one, two = AccountFactory(owner=UserFactory()), AccountFactory(owner=UserFactory())
            results = racers.run(
                lambda a=one, m=me: deposit_submit(account_id=a.pk, amount=6_000, actor=m, reason="r"),
                lambda a=two, m=me: deposit_submit(account_id=a.pk, amount=6_000, actor=m, reason="r"),
            )
            assert not [r for r in results if isinstance(r, Exception)], results
            assert sorted(r.deposit is not None for r in results) == [False, True]
            assert balance(one) + balance(two) == 6_000


# --- The admin follows the same rule ---------------------------------------------------------


def test_the_admins_deposit_form_into_ones_own_account_makes_a_request(treasurers):
    me = treasurers[0]
    mine = AccountFactory(owner=me)
    client = admin_client_for(me)
    opened = client.get(reverse("admin:ledger_account_deposit", args=[id_in_url(mine.pk)]))
    assert opened.status_code == 302
    client.post(opened["Location"], {"amount": "5", "reason": "mine"}, follow=True)
    assert balance(mine) == 0
    assert DepositRequest.objects.get(account=mine).why == Why.OWN_ACCOUNT


def test_the_admin_refuses_the_beneficiarys_approval_and_freeze_of_ones_own_account(treasurers, settings):
    first, second, _ = treasurers
    theirs = AccountFactory(owner=second)
    request = deposit_request_create(account_id=theirs.pk, amount=5 * THRESHOLD, actor=first, reason="big")
    client = admin_client_for(second)
    url = reverse("admin:ledger_depositrequest_approve", args=[id_in_url(request.pk)])
    page = client.get(url)
    assert "into an account you own" in page.content.decode()
    done = client.post(url, {"reason": "fine by me", "confirmed": "1"}, follow=True)
    # Refused before the service (the page said 0 of 1 would change), naming why.
    assert any("into an account you own" in str(m) for m in done.context["messages"])
    assert DepositRequest.objects.get(pk=request.pk).status == "pending" and balance(theirs) == 0

    superuser = UserFactory(is_staff=True, is_superuser=True)
    own = AccountFactory(owner=superuser)
    with pytest.raises(ConflictOfInterest):
        account_freeze(account_id=own.pk, frozen=True, actor=superuser, reason="r")
    client = admin_client_for(superuser)
    url = reverse("admin:ledger_account_freeze", args=[id_in_url(own.pk)])
    assert "your own account" in client.get(url).content.decode()
    done = client.post(url, {"reason": "r", "confirmed": "1"}, follow=True)
    assert any("your own account" in str(m) for m in done.context["messages"])
    assert Account.objects.get(pk=own.pk).status == "active"
    assert account_freeze(account_id=own.pk, frozen=True, actor=second, reason="fraud report").changed_now
