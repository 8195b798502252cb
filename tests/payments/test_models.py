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


def trigger_allows(payment_id: str, new_status: str) -> bool:
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(SET_STATUS, [new_status, payment_id])
            transaction.set_rollback(True)
        return True
    except DatabaseError:
        return False


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
