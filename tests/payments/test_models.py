"""The state machine as documented (ALLOWED_TRANSITIONS) is the one the database enforces;
the payments' audit tables (events, attempts) are append-only."""

from datetime import timedelta

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from payments import partitions
from payments.execution import execute_batch
from payments.models import ALLOWED_TRANSITIONS, ExecutionAttempt, PaymentEvent, PaymentStatus
from tests.factories import claimed, due_payment, funded_account, future_payment

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


# --- the audit tables are append-only --------------------------------------------------------
# payments_paymentevent and payments_executionattempt refuse UPDATE and DELETE by a row
# trigger (payments/0002, payments_append_only()), defined on the partitioned parent and so
# cloned onto every partition, those made later by ensure_partitions included (migration
# 0018 copied it over when it partitioned them). Archival leaves by DETACH and DROP of a
# whole partition (payments/partitions.py), which fires no row trigger; nothing in the
# product updates or deletes a row of either (the reconciliation tests that forge history
# disable the trigger for their transaction). TRUNCATE is not refused: pytest-django's
# transactional tests and the benchmark's reset empty the tables with it.

AUDIT = {"payments_paymentevent": PaymentEvent, "payments_executionattempt": ExecutionAttempt}


@pytest.fixture
def executed():
    """A payment executed by the worker: its "created" and "executed" events and its attempt."""
    payment = due_payment(source=funded_account(balance=100), target=funded_account(), amount=5)
    execute_batch(pairs=claimed(payment))
    assert PaymentEvent.objects.filter(payment=payment).count() >= 2
    assert ExecutionAttempt.objects.filter(payment=payment, outcome="executed").count() == 1
    return payment


def audit_rows(payment) -> dict[str, list[tuple]]:
    with connection.cursor() as cur:
        rows = {}
        for table in AUDIT:
            cur.execute(f"SELECT * FROM {table} WHERE payment_id = %s ORDER BY id", [payment.pk])
            rows[table] = cur.fetchall()
    return rows


@pytest.mark.parametrize(
    ("table", "statement"),
    [
        ("payments_paymentevent", "UPDATE {table} SET actor = 'forged' WHERE payment_id = %s"),
        ("payments_paymentevent", "UPDATE {table} SET payment_id = payment_id WHERE payment_id = %s"),
        ("payments_paymentevent", "DELETE FROM {table} WHERE payment_id = %s"),
        ("payments_executionattempt", "UPDATE {table} SET outcome = 'failed' WHERE payment_id = %s"),
        ("payments_executionattempt", "DELETE FROM {table} WHERE payment_id = %s"),
    ],
)
@pytest.mark.parametrize("target", ["parent", "partition"])
def test_raw_sql_may_not_update_or_delete_an_audit_row(executed, table, statement, target):
    before = audit_rows(executed)
    with connection.cursor() as cur:
        cur.execute(f"SELECT tableoid::regclass::text FROM {table} WHERE payment_id = %s LIMIT 1", [executed.pk])
        partition = cur.fetchone()[0]
    assert partition != table  # rows live in a partition; the statement goes to either
    operation = statement.split()[0]
    with pytest.raises(IntegrityError, match=f"{table} is append-only: {operation} refused"):
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(statement.format(table=table if target == "parent" else partition), [executed.pk])
    assert audit_rows(executed) == before


@pytest.mark.parametrize("table", AUDIT)
def test_the_orm_may_not_update_or_delete_an_audit_row(executed, table):
    model = AUDIT[table]
    before = audit_rows(executed)
    row = model.objects.filter(payment=executed).first()
    refusals = {
        "UPDATE": [
            lambda: model.objects.filter(payment=executed).update(error="forged") if model is ExecutionAttempt
            else model.objects.filter(payment=executed).update(actor="forged"),
            lambda: row.save(),  # an existing primary key: Django saves by UPDATE
        ],
        "DELETE": [lambda: model.objects.filter(payment=executed).delete(), lambda: row.delete()],
    }
    for operation, attempts in refusals.items():
        for attempt in attempts:
            with pytest.raises(IntegrityError, match=f"{table} is append-only: {operation} refused"):
                with transaction.atomic():
                    attempt()
    assert audit_rows(executed) == before


def test_every_partition_of_the_audit_tables_carries_the_append_only_trigger():
    later = timezone.now() + timedelta(days=800)
    assert partitions.ensure_partitions(ahead=1, now=later)  # months made now get it too
    with connection.cursor() as cur:
        for table in AUDIT:
            cur.execute(
                """
                SELECT c.relname, t.tgenabled, t.tgtype, p.proname
                  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                  LEFT JOIN pg_trigger t ON t.tgrelid = c.oid AND t.tgname = %s
                  LEFT JOIN pg_proc p ON p.oid = t.tgfoid
                 WHERE i.inhparent = %s::regclass
                """,
                [f"{table}_append_only", table],
            )
            found = cur.fetchall()
            assert len(found) >= 3 and any(name.endswith("_default") for name, *_ in found), found
            # Enabled always ("O"); ROW | BEFORE | DELETE | UPDATE = 1 | 2 | 8 | 16, no INSERT.
            assert all(row[1:] == ("O", 27, "payments_append_only") for row in found), found
