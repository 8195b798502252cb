"""The state machine as documented (ALLOWED_TRANSITIONS) is the one the database enforces."""

import pytest
from django.db import DatabaseError, connection, transaction

from payments.models import ALLOWED_TRANSITIONS, PaymentStatus
from tests.factories import funded_account, future_payment

pytestmark = pytest.mark.django_db

# Every column a status's check constraint asks for, so that only the trigger can refuse.
SET_STATUS = """
UPDATE payments_scheduledpayment
   SET status = %s, lease_until = now() + interval '1 hour', executed_at = now(),
       failure_reason = 'insufficient_funds', cancelled_at = now(), review_reason = 'attempts_exhausted'
 WHERE id = %s
"""


def put_in_status(payment_id: str, status: str) -> None:
    """Straight into ``status``, past the trigger (set-up only: replica mode fires no trigger)."""
    with connection.cursor() as cur:
        cur.execute("SET session_replication_role = replica")
        cur.execute(SET_STATUS, [status, payment_id])
        cur.execute("SET session_replication_role = origin")


def refused(statement: str, params: list) -> str | None:
    """The guard's message if it refuses ``statement``, else None (rolled back either way)."""
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(statement, params)
            transaction.set_rollback(True)
        return None
    except DatabaseError as exc:
        return str(exc)


def trigger_allows(payment_id: str, new_status: str) -> bool:
    return refused(SET_STATUS, [new_status, payment_id]) is None


def test_allowed_transitions_match_the_database_trigger_for_every_pair():
    source, target = funded_account(balance=100), funded_account()
    enforced = {}
    for old in PaymentStatus.values:
        payment = future_payment(source=source, target=target)
        put_in_status(payment.pk, old)
        for new in PaymentStatus.values:
            enforced[(old, new)] = trigger_allows(payment.pk, new)
    documented = {
        (old, new): new in ALLOWED_TRANSITIONS[old] for old in PaymentStatus.values for new in PaymentStatus.values
    }
    assert enforced == documented
    assert sum(enforced.values()) == 12  # the check can fail: most pairs are refused


@pytest.mark.parametrize(
    ("status", "change", "message"),
    [
        ("SCHEDULED", "attempt = attempt - 1", "attempt may not go back"),
        ("SCHEDULED", "id = id || 'x'", "fields are frozen once claimed"),
        ("SCHEDULED", "payer_id = payer_id + 1", "fields are frozen once claimed"),
        ("SCHEDULED", "created_at = created_at - interval '1 day'", "fields are frozen once claimed"),
        ("EXECUTING", "amount = amount + 1", "fields are frozen once claimed"),
        ("EXECUTING", "execute_at = execute_at + interval '1 minute'", "fields are frozen once claimed"),
        ("NEEDS_REVIEW", "to_account_id = from_account_id", "fields are frozen once claimed"),
        ("EXECUTED", "updated_at = now()", "is EXECUTED and final"),
        ("CANCELLED", "tries = tries", "is CANCELLED and final"),
    ],
)
def test_the_guard_refuses_each_illegal_change(status, change, message):
    # The trigger calls the guard only when its WHEN finds an update illegal (payments/0020):
    # each of the guard's refusals must still reach it.
    payment = future_payment(source=funded_account(balance=100), target=funded_account())
    put_in_status(payment.pk, status)
    if status == "SCHEDULED":
        with connection.cursor() as cur:
            cur.execute("SET session_replication_role = replica")
            cur.execute("UPDATE payments_scheduledpayment SET attempt = 1 WHERE id = %s", [payment.pk])
            cur.execute("SET session_replication_role = origin")
    found = refused(f"UPDATE payments_scheduledpayment SET {change} WHERE id = %s", [payment.pk])
    assert found is not None and message in found, found


@pytest.mark.parametrize(
    ("status", "change"),
    [
        ("SCHEDULED", "amount = amount + 1, execute_at = execute_at + interval '1 minute'"),  # reschedule
        ("SCHEDULED", "attempt = attempt + 1, status = 'EXECUTING'"),  # a claim
        ("EXECUTING", "status = 'EXECUTED', lease_until = NULL"),  # a finish
        ("NEEDS_REVIEW", "status = 'SCHEDULED', review_reason = ''"),  # a re-drive
    ],
)
def test_the_guard_lets_legal_changes_through(status, change):
    payment = future_payment(source=funded_account(balance=100), target=funded_account())
    put_in_status(payment.pk, status)
    assert refused(f"UPDATE payments_scheduledpayment SET {change} WHERE id = %s", [payment.pk]) is None


def test_a_payment_cannot_be_deleted():
    payment = future_payment(source=funded_account(balance=100), target=funded_account())
    found = refused("DELETE FROM payments_scheduledpayment WHERE id = %s", [payment.pk])
    assert found is not None and "cannot be deleted" in found, found
