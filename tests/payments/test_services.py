from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from ledger.models import Account
from ledger.services import account_set_status
from payments.exceptions import PaymentNotCancellable, PaymentValidationError
from payments.models import PaymentEvent, PaymentStatus, ScheduledPayment
from payments.promoter import claim_due
from payments.services import payment_cancel, payment_schedule
from tests.factories import UserFactory, due_payment, funded_account

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
