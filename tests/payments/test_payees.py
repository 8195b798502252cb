"""Payees against what is paid to them: a payee deleted while a payout or a series to it is
being created (both at once, on real PostgreSQL, many rounds), and the defences behind
that: generation, the payout executor and reconciliation."""

from datetime import timedelta
from functools import partial

import pytest
from django.utils import timezone

from ledger.models import Account, PendingTransfer
from payments.exceptions import PayeeInUse, PaymentValidationError
from payments.models import Payee, Payout, RecurringEvent, RecurringPayment, ScheduledPayment
from payments.reconciliation import reconcile
from payments.services import payment_schedule
from payouts.payees import payee_delete
from recurring.services import recurring_create, recurring_generate_due
from tests.concurrency import Racers
from tests.factories import due_payout, funded_account, payee_for, work_payouts
from tests.scale import scaled

ROUNDS = scaled(100)


def schedule_payout(*, source, payee):
    return payment_schedule(
        payer=source.owner, from_account_id=source.id, to_payee_id=payee.id, amount=1,
        execute_at=timezone.now() + timedelta(hours=1),
    )


def create_series(*, source, payee):
    return recurring_create(
        payer=source.owner, from_account_id=source.id, to_payee_id=payee.id, amount=1,
        start_at=timezone.now() + timedelta(hours=1), interval="P1D",
    )


def delete(payee):
    return payee_delete(user=payee.owner, payee_id=payee.id)


def refused_for_the_payee(outcome) -> bool:
    return isinstance(outcome, PaymentValidationError) and "to_payee" in outcome.fields


def assert_one_winner(created, deleted, payee, made) -> str:
    """Either the delete won (the create was told the payee is not theirs any more, and
    nothing pays it) or the create won (the delete was refused: the payee is in use)."""
    payee.refresh_from_db()
    if payee.deleted_at is not None:
        assert not isinstance(deleted, Exception), deleted
        assert refused_for_the_payee(created), created
        assert not made.exists()
        return "delete"
    assert not isinstance(created, Exception), created
    assert isinstance(deleted, PayeeInUse), deleted
    assert made.count() == 1
    return "create"


@pytest.mark.django_db(transaction=True)
def test_a_payout_and_the_delete_of_its_payee_racing_100_times_have_one_winner():
    wins = {"create": 0, "delete": 0}
    with Racers(2) as racers:
        for _ in range(ROUNDS):
            source = funded_account()
            payee = payee_for(source.owner)
            created, deleted = racers.run(partial(schedule_payout, source=source, payee=payee),
                                          partial(delete, payee))
            made = ScheduledPayment.objects.filter(to_payee=payee)
            wins[assert_one_winner(created, deleted, payee, made)] += 1
    assert sum(wins.values()) == ROUNDS, wins
    assert not ScheduledPayment.objects.filter(to_payee__deleted_at__isnull=False).exists()
    assert reconcile().get("payout_to_deleted_payee").violations == 0


@pytest.mark.django_db(transaction=True)
def test_a_payout_series_and_the_delete_of_its_payee_racing_100_times_have_one_winner():
    wins = {"create": 0, "delete": 0}
    with Racers(2) as racers:
        for _ in range(ROUNDS):
            source = funded_account()
            payee = payee_for(source.owner)
            created, deleted = racers.run(partial(create_series, source=source, payee=payee),
                                          partial(delete, payee))
            made = RecurringPayment.objects.filter(to_payee=payee)
            winner = assert_one_winner(created, deleted, payee, made)
            wins[winner] += 1
            # The series' first occurrence is created with it, to the same payee, or not at all.
            occurrences = ScheduledPayment.objects.filter(to_payee=payee)
            assert occurrences.count() == (1 if winner == "create" else 0)
    assert sum(wins.values()) == ROUNDS, wins
    assert not RecurringPayment.objects.filter(to_payee__deleted_at__isnull=False).exists()
    assert not ScheduledPayment.objects.filter(to_payee__deleted_at__isnull=False).exists()


@pytest.mark.django_db
def test_a_deleted_payee_is_refused_to_a_payout_and_a_series():
    source = funded_account()
    payee = payee_for(source.owner)
    delete(payee)
    for create in (schedule_payout, create_series):
        with pytest.raises(PaymentValidationError) as refused:
            create(source=source, payee=payee)
        assert refused.value.fields == {"to_payee": ["No such payee of yours."]}
    assert not ScheduledPayment.objects.exists() and not RecurringPayment.objects.exists()
    assert Payee.objects.get(pk=payee.pk).deleted_at is not None


def hide(payee) -> None:
    """Delete the payee behind payee_delete's back (as a hand edit of the database would)."""
    Payee.objects.filter(pk=payee.pk).update(deleted_at=timezone.now())


@pytest.mark.django_db
def test_a_series_whose_payee_is_gone_ends_instead_of_generating(caplog):
    source = funded_account()
    payee = payee_for(source.owner)
    rec = create_series(source=source, payee=payee)
    (first,) = ScheduledPayment.objects.filter(recurring=rec)
    ScheduledPayment.objects.filter(pk=first.pk).update(status="CANCELLED", cancelled_at=timezone.now())
    past = timezone.now() - timedelta(days=2)
    RecurringPayment.objects.filter(pk=rec.pk).update(last_occurrence_at=past, next_occurrence_at=past)
    hide(payee)
    assert recurring_generate_due() == 0
    rec.refresh_from_db()
    assert (rec.status, rec.next_occurrence_at) == ("ENDED", None)
    assert RecurringEvent.objects.filter(recurring=rec, kind="ended").get().data == {"reason": "payee deleted"}
    assert ScheduledPayment.objects.filter(recurring=rec).count() == 1
    assert "its payee is deleted" in caplog.text


@pytest.mark.django_db
@pytest.mark.usefixtures("fast_rail")
def test_a_payout_whose_payee_was_deleted_fails_without_a_reserve_or_a_call(rail_gateway):
    source = funded_account(balance=100)
    payee = payee_for(source.owner)
    payout = due_payout(source=source, payee=payee, amount=30)
    hide(payee)
    pending = reconcile().get("payout_to_deleted_payee")
    assert pending.violations == 1 and pending.samples[0].startswith(f"{payout.id} SCHEDULED to {payee.id} deleted ")
    result = work_payouts()
    assert result.failed == {payout.id: "payee_deleted"}
    payout.refresh_from_db()
    assert (payout.status, payout.failure_reason) == ("FAILED", "payee_deleted")
    assert not Payout.objects.filter(pk=payout.pk).exists() and not PendingTransfer.objects.exists()
    assert rail_gateway.payouts(payout.id)["count"] == 0
    assert Account.objects.get(pk=source.id).balance == 100
    report = reconcile()
    assert report.ok, [(c.name, c.samples) for c in report.checks if not c.ok]


@pytest.mark.django_db
@pytest.mark.usefixtures("fast_rail")
def test_reconciliation_tells_a_payout_paid_before_its_payee_was_deleted_from_one_paid_after():
    source = funded_account(balance=100)
    payee = payee_for(source.owner)
    payout = due_payout(source=source, payee=payee, amount=30)
    assert work_payouts().executed == [payout.id]
    delete(payee)
    assert reconcile().ok
    # Executed after the delete (what the race let through): a violation. (A finished
    # payment is final, so the payee's deletion is moved back instead.)
    payout.refresh_from_db()
    Payee.objects.filter(pk=payee.pk).update(deleted_at=payout.executed_at - timedelta(seconds=1))
    check = reconcile().get("payout_to_deleted_payee")
    assert check.violations == 1 and check.samples[0].startswith(f"{payout.id} EXECUTED to {payee.id} deleted ")
