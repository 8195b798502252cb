"""Row locks that let the other writers through, and a deadlock victim applied again.

The executor's locks say ``FOR NO KEY UPDATE``: no key changes, so a foreign-key check
of a row that references a locked payment or account (PostgreSQL takes ``FOR KEY
SHARE`` for it) never waits on a batch. With ``FOR UPDATE`` it did, and a batch writing
stale-attempt rows could deadlock against one holding those payments. Each test holds
the lock in another thread's transaction and writes a referencing row with a one-second
``lock_timeout``: with ``FOR UPDATE`` the write times out.
"""

import threading

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.utils import timezone

from ledger import sql as ledger_sql
from payments import metrics
from payments import sql as payments_sql
from payments.models import ExecutionAttempt, PaymentStatus, ScheduledPayment
from payments.promoter import claim_due
from payments.worker import is_conflict, retry_conflicts
from tests.factories import due_payment, funded_account, future_payment

pytestmark = pytest.mark.django_db(transaction=True)


class HeldLock:
    """Run ``sql`` in a transaction on another connection and keep it open until exit."""

    def __init__(self, sql: str, params):
        self.sql, self.params = sql, params
        self.locked, self.release = threading.Event(), threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        try:
            with transaction.atomic(), connection.cursor() as cur:
                cur.execute(self.sql, self.params)
                assert cur.fetchall(), "the statement locked nothing"
                self.locked.set()
                self.release.wait(30)
        except BaseException as exc:  # reported to the test
            self.error = exc
            self.locked.set()
        finally:
            connections.close_all()

    def __enter__(self) -> "HeldLock":
        self.thread.start()
        assert self.locked.wait(30)
        assert self.error is None, self.error
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.thread.join(30)


def with_lock_timeout(write):
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SET LOCAL lock_timeout = '1s'")
        return write()


def test_fenced_payments_do_not_block_rows_that_reference_them():
    a, b = funded_account(balance=100), funded_account()
    payment = due_payment(source=a, target=b, amount=1)
    [(payment_id, attempt)] = claim_due(batch=10, lease_seconds=60).fresh
    params = {"ids": [payment_id], "attempts": [attempt], "expected": [PaymentStatus.EXECUTING]}
    with HeldLock(payments_sql.LOCK_FENCED, params):
        # What a stale attempt's batch writes for the same payment: an attempt row.
        row = with_lock_timeout(lambda: ExecutionAttempt.objects.create(
            payment_id=payment.id, attempt=attempt, started_at=timezone.now(), worker="other", outcome="error"
        ))
    assert row.pk


def test_locked_accounts_do_not_block_rows_that_reference_them():
    a, b = funded_account(balance=100), funded_account()
    with HeldLock(ledger_sql.LOCK_ACCOUNTS, [[a.id, b.id]]):
        payment = with_lock_timeout(lambda: future_payment(source=a, target=b, amount=5))
    assert ScheduledPayment.objects.filter(pk=payment.pk).exists()


def test_a_deadlock_victim_is_applied_again_and_counted():
    """Two transactions lock two accounts in opposite orders: PostgreSQL aborts one as the
    deadlock victim (after deadlock_timeout, 1 s); retry_conflicts runs it again and both
    commit."""
    a, b = funded_account(balance=100), funded_account(balance=100)
    both_hold_one = threading.Barrier(2)
    before = metrics.conflict_retries_total._value.get()
    results: dict[str, object] = {}

    def lock_in_order(first, second, name):
        rounds = {"n": 0}

        def apply():
            rounds["n"] += 1
            with transaction.atomic(), connection.cursor() as cur:
                cur.execute("UPDATE ledger_account SET balance = balance + 1 WHERE id = %s", [first])
                if rounds["n"] == 1:
                    both_hold_one.wait(10)
                cur.execute("UPDATE ledger_account SET balance = balance - 1 WHERE id = %s", [second])
            return rounds["n"]

        try:
            results[name] = retry_conflicts(apply)
        except BaseException as exc:
            results[name] = exc
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=lock_in_order, args=(a.id, b.id, "ab")),
        threading.Thread(target=lock_in_order, args=(b.id, a.id, "ba")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(results.values()) == [1, 2], results  # one victim, applied on its second round
    assert metrics.conflict_retries_total._value.get() == before + 1
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.balance, b.balance) == (100, 100)  # +1 -1 on each, both transactions committed


def test_other_operational_errors_are_not_retried():
    calls = []

    def apply():
        calls.append(1)
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SET LOCAL statement_timeout = '10ms'")
            cur.execute("SELECT pg_sleep(1)")

    with pytest.raises(OperationalError) as raised:
        retry_conflicts(apply)
    assert not is_conflict(raised.value)
    assert calls == [1]
