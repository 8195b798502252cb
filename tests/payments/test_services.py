from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from ledger.models import Account, Transfer
from ledger.services import account_set_status
from payments.exceptions import PaymentNotCancellable, PaymentNotEditable, PaymentValidationError, VersionMismatch
from payments.execution import execute_batch
from payments.models import PaymentEvent, PaymentStatus, ScheduledPayment
from payments.promoter import claim_due
from payments.services import payment_cancel, payment_schedule, payment_update
from tests.factories import UserFactory, due_payment, funded_account, parked_payment

pytestmark = pytest.mark.django_db


def schedule(source, target, amount=10, in_seconds=60, payer=None):
    return payment_schedule(
        payer=payer or source.owner,
        from_account_id=source.id,
        to_account_id=target.id,
        amount=amount,
        execute_at=timezone.now() + timedelta(seconds=in_seconds),
    )


def test_schedule_records_payment_and_created_event():
    a, b = funded_account(), funded_account()
    payment = schedule(a, b, amount=500)
    assert payment.status == PaymentStatus.SCHEDULED
    assert payment.id.startswith("pay_")
    assert payment.attempt == 0
    event = PaymentEvent.objects.get(payment=payment)
    assert (event.kind, event.to_status, event.actor) == ("created", "SCHEDULED", f"user:{a.owner_id}")


def test_funds_are_not_checked_at_schedule_time():
    a, b = funded_account(balance=0), funded_account()
    assert schedule(a, b, amount=10**6).status == PaymentStatus.SCHEDULED


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"in_seconds": -1}, "execute_at"),
        ({"in_seconds": 366 * 86400}, "execute_at"),
        ({"amount": 0}, "amount"),
        ({"amount": 10**12 + 1}, "amount"),
    ],
)
def test_schedule_rejects_bad_values(kwargs, field):
    a, b = funded_account(), funded_account()
    with pytest.raises(PaymentValidationError) as err:
        schedule(a, b, **kwargs)
    assert field in err.value.fields
    assert not ScheduledPayment.objects.exists()


def test_schedule_rejects_naive_time():
    a, b = funded_account(), funded_account()
    with pytest.raises(PaymentValidationError) as err:
        payment_schedule(
            payer=a.owner, from_account_id=a.id, to_account_id=b.id, amount=1,
            execute_at=timezone.now().replace(tzinfo=None) + timedelta(hours=1),
        )
    assert "execute_at" in err.value.fields


def test_schedule_requires_owning_an_active_source_and_an_open_target():
    a, b = funded_account(), funded_account()
    with pytest.raises(PaymentValidationError) as err:
        schedule(a, b, payer=UserFactory())
    assert "from_account" in err.value.fields
    with pytest.raises(PaymentValidationError) as err:
        schedule(a, a)
    assert "to_account" in err.value.fields
    account_set_status(account_id=b.id, status=Account.Status.CLOSED)
    with pytest.raises(PaymentValidationError) as err:
        schedule(a, b)
    assert "to_account" in err.value.fields
    account_set_status(account_id=a.id, status=Account.Status.FROZEN)
    with pytest.raises(PaymentValidationError) as err:
        schedule(a, funded_account())
    assert "from_account" in err.value.fields


def test_cancel_scheduled_payment_records_event_and_repeat_is_idempotent():
    a, b = funded_account(), funded_account()
    payment = schedule(a, b)
    cancelled = payment_cancel(payment_id=payment.id, actor=a.owner)
    assert cancelled.status == PaymentStatus.CANCELLED
    assert cancelled.cancelled_at is not None
    again = payment_cancel(payment_id=payment.id, actor=a.owner)
    assert again.status == PaymentStatus.CANCELLED
    kinds = list(PaymentEvent.objects.filter(payment=payment).values_list("kind", flat=True))
    assert kinds == ["created", "cancelled"]


def test_cancel_after_claim_raises_with_status():
    a, b = funded_account(), funded_account()
    payment = due_payment(source=a, target=b, amount=1)
    assert claim_due(batch=10, lease_seconds=60).fresh == [(payment.id, 1)]
    with pytest.raises(PaymentNotCancellable) as err:
        payment_cancel(payment_id=payment.id, actor=a.owner)
    assert err.value.status == PaymentStatus.EXECUTING


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE payments_scheduledpayment SET status = 'EXECUTED', executed_at = now()",  # skips EXECUTING
        "UPDATE payments_scheduledpayment SET attempt = -1",
        "DELETE FROM payments_scheduledpayment",
    ],
)
def test_database_enforces_the_state_machine(sql):
    a, b = funded_account(), funded_account()
    schedule(a, b)
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cur:
        cur.execute(sql)


def test_terminal_payment_is_frozen_in_the_database():
    a, b = funded_account(), funded_account()
    payment = schedule(a, b)
    payment_cancel(payment_id=payment.id, actor=a.owner)
    for sql in (
        "UPDATE payments_scheduledpayment SET status = 'SCHEDULED', cancelled_at = NULL",
        "UPDATE payments_scheduledpayment SET amount = 999",
    ):
        with pytest.raises(IntegrityError, match="final"), transaction.atomic(), connection.cursor() as cur:
            cur.execute(sql)


def test_money_fields_are_frozen_once_claimed():
    a, b = funded_account(), funded_account()
    due_payment(source=a, target=b, amount=1)
    claim_due(batch=10, lease_seconds=60)
    with pytest.raises(IntegrityError, match="frozen"), transaction.atomic(), connection.cursor() as cur:
        cur.execute("UPDATE payments_scheduledpayment SET amount = 2")


def schedule_later(source, target, **kwargs):
    kwargs.setdefault("amount", 10)
    kwargs.setdefault("execute_at", timezone.now() + timedelta(hours=1))
    return payment_schedule(payer=source.owner, from_account_id=source.id, to_account_id=target.id, **kwargs)


# --- update (PATCH) --------------------------------------------------------------------

@pytest.mark.django_db
def test_update_changes_amount_and_time_bumps_version_and_records_old_and_new():
    a, b = funded_account(), funded_account()
    payment = schedule_later(a, b)
    later = payment.execute_at + timedelta(days=1)
    updated = payment_update(payment_id=payment.id, actor=a.owner, amount=99, execute_at=later)
    assert (updated.amount, updated.execute_at, updated.version) == (99, later, payment.version + 1)
    event = PaymentEvent.objects.get(payment=payment, kind="updated")
    assert event.data["old"]["amount"] == 10 and event.data["new"]["amount"] == 99
    assert event.data["new"]["execute_at"] == later.isoformat()


@pytest.mark.django_db
def test_update_with_stale_version_is_refused():
    a, b = funded_account(), funded_account()
    payment = schedule_later(a, b)
    payment_update(payment_id=payment.id, actor=a.owner, amount=11)
    with pytest.raises(VersionMismatch) as err:
        payment_update(payment_id=payment.id, actor=a.owner, amount=12, expected_version=payment.version)
    assert err.value.version == payment.version + 1
    assert ScheduledPayment.objects.get(pk=payment.id).amount == 11


@pytest.mark.django_db
def test_update_is_idempotent_under_retries():
    a, b = funded_account(), funded_account()
    payment = schedule_later(a, b)
    first = payment_update(payment_id=payment.id, actor=a.owner, amount=50, expected_version=payment.version)
    again = payment_update(payment_id=payment.id, actor=a.owner, amount=50, expected_version=payment.version)
    assert again.version == first.version
    assert PaymentEvent.objects.filter(payment=payment, kind="updated").count() == 1


@pytest.mark.django_db
def test_update_after_claim_is_refused():
    a, b = funded_account(), funded_account()
    payment = due_payment(source=a, target=b, amount=1)
    claim_due(batch=10, lease_seconds=60)
    with pytest.raises(PaymentNotEditable) as err:
        payment_update(payment_id=payment.id, actor=a.owner, amount=2)
    assert err.value.status == PaymentStatus.EXECUTING


@pytest.mark.django_db
def test_update_validates_like_create():
    a, b = funded_account(), funded_account()
    payment = schedule_later(a, b)
    with pytest.raises(PaymentValidationError) as err:
        payment_update(payment_id=payment.id, actor=a.owner, amount=0, execute_at=timezone.now() - timedelta(1))
    assert set(err.value.fields) == {"amount", "execute_at"}


# --- jitter and the overdue policy ------------------------------------------------------

@pytest.mark.django_db
def test_jitter_draws_within_the_window_never_earlier():
    a, b = funded_account(), funded_account()
    requested = timezone.now() + timedelta(hours=1)
    draws = [schedule_later(a, b, execute_at=requested, jitter_seconds=60) for _ in range(30)]
    assert all(requested <= p.execute_at <= requested + timedelta(seconds=60) for p in draws)
    assert all(p.requested_execute_at == requested for p in draws)
    assert len({p.execute_at for p in draws}) > 1
    assert schedule_later(a, b, execute_at=requested).execute_at == requested


@pytest.mark.django_db
@pytest.mark.parametrize("jitter", [-1, 3601, 1.5])
def test_jitter_out_of_range_is_rejected(jitter):
    a, b = funded_account(), funded_account()
    with pytest.raises(PaymentValidationError) as err:
        schedule_later(a, b, jitter_seconds=jitter)
    assert "jitter_seconds" in err.value.fields


@pytest.mark.django_db
def test_payment_past_its_expiry_fails_expired_and_moves_nothing():
    a, b = funded_account(balance=100), funded_account()
    late = due_payment(source=a, target=b, amount=10, seconds_ago=120)
    ScheduledPayment.objects.filter(pk=late.id).update(expires_after=timedelta(seconds=60))
    patient = due_payment(source=a, target=b, amount=10, seconds_ago=120)  # default: run late
    result = execute_batch(pairs=claim_due(batch=10, lease_seconds=60).fresh)
    assert result.failed == {late.id: "expired"}
    assert result.executed == [patient.id]
    assert not Transfer.objects.filter(key=late.id).exists()


# --- the review queue: park, re-drive, resolve, cancel -----------------------------------

def staff_user():
    return UserFactory(is_staff=True)


def test_redrive_sends_a_parked_payment_through_again_with_a_fresh_budget(settings):
    from payments.services import payment_redrive
    from tests.factories import claimed

    a, b = funded_account(balance=10), funded_account()
    payment = parked_payment(settings, source=a, target=b, amount=4)
    staff = staff_user()
    outcome = payment_redrive(payment_id=payment.id, actor=staff, reason="worker bug fixed")
    assert outcome.changed_now
    assert (outcome.payment.status, outcome.payment.tries, outcome.payment.review_reason) == ("SCHEDULED", 0, "")
    event = PaymentEvent.objects.filter(payment=payment).last()
    assert (event.kind, event.actor_user, event.data["reason"]) == ("redriven", staff, "worker bug fixed")
    # Repeating it (a retried request) changes nothing and answers the payment as it is.
    again = payment_redrive(payment_id=payment.id, actor=staff, reason="worker bug fixed")
    assert not again.changed_now and again.payment.status == PaymentStatus.SCHEDULED
    # It is due at once and executes like any other payment.
    (pair,) = claimed(payment)
    assert execute_batch(pairs=[pair]).executed == [payment.id]
    a.refresh_from_db()
    assert a.balance == 6


def test_redrive_at_a_later_time_waits_until_then(settings):
    from payments.promoter import claim_due
    from payments.services import payment_redrive

    a, b = funded_account(balance=10), funded_account()
    payment = parked_payment(settings, source=a, target=b)
    later = timezone.now() + timedelta(hours=1)
    outcome = payment_redrive(payment_id=payment.id, actor=staff_user(), reason="after the fix", execute_at=later)
    assert outcome.payment.next_attempt_at == later
    assert claim_due(batch=10, lease_seconds=60).fresh == []


def test_resolve_ends_a_parked_payment_failed_with_the_staff_reason(settings):
    from payments.services import payment_resolve

    a, b = funded_account(balance=10), funded_account()
    payment = parked_payment(settings, source=a, target=b)
    staff = staff_user()
    outcome = payment_resolve(payment_id=payment.id, actor=staff, outcome="failed", reason="payee closed")
    assert (outcome.payment.status, outcome.payment.failure_reason) == ("FAILED", "resolved_by_staff")
    event = PaymentEvent.objects.filter(payment=payment).last()
    assert (event.kind, event.from_status, event.data["reason"]) == ("failed", "NEEDS_REVIEW", "payee closed")
    assert not payment_resolve(payment_id=payment.id, actor=staff, outcome="failed", reason="payee closed").changed_now
    a.refresh_from_db()
    assert a.balance == 10 and not Transfer.objects.filter(key=payment.id).exists()


def test_review_acts_refuse_a_payment_not_in_review_and_need_a_reason(settings):
    from payments.exceptions import PaymentNotInReview
    from payments.services import payment_redrive, payment_resolve

    a, b = funded_account(balance=10), funded_account()
    scheduled = schedule(a, b)
    with pytest.raises(PaymentNotInReview):
        payment_redrive(payment_id=scheduled.id, actor=staff_user(), reason="why not")
    parked = parked_payment(settings, source=a, target=b)
    with pytest.raises(PaymentValidationError):
        payment_redrive(payment_id=parked.id, actor=staff_user(), reason="  ")
    with pytest.raises(PaymentValidationError):
        payment_resolve(payment_id=parked.id, actor=staff_user(), outcome="executed", reason="it did")


def test_the_creator_may_cancel_a_parked_payment(settings):
    a, b = funded_account(balance=10), funded_account()
    payment = parked_payment(settings, source=a, target=b)
    cancelled = payment_cancel(payment_id=payment.id, actor=a.owner)
    assert cancelled.status == PaymentStatus.CANCELLED
    event = PaymentEvent.objects.filter(payment=payment).last()
    assert (event.kind, event.from_status) == ("cancelled", "NEEDS_REVIEW")


def test_the_review_queue_keeps_the_books_reconciled(settings):
    from payments.reconciliation import reconcile
    from payments.services import payment_redrive, payment_resolve
    from tests.factories import claimed

    a, b = funded_account(balance=10), funded_account()
    resolved, redriven, cancelled = (parked_payment(settings, source=a, target=b) for _ in range(3))
    payment_resolve(payment_id=resolved.id, actor=staff_user(), outcome="failed", reason="r")
    payment_redrive(payment_id=redriven.id, actor=staff_user(), reason="r")
    (pair,) = claimed(redriven)
    execute_batch(pairs=[pair])
    payment_cancel(payment_id=cancelled.id, actor=a.owner)
    report = reconcile(overdue_after_seconds=3600)
    assert report.ok, [(c.name, c.samples) for c in report.checks if not c.ok]
