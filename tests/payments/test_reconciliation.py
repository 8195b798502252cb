import json
import logging
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from ledger.services import ledger_deposit, ledger_transfer
from payments import tasks
from payments.execution import execute_batch
from payments.models import ExecutionAttempt, Heartbeat, PaymentEvent, ScheduledPayment
from payments.promoter import claim_due
from payments.reconciliation import CHECKS, reconcile
from payments.services import payment_cancel
from tests.factories import due_payment, expire_lease, funded_account

pytestmark = pytest.mark.django_db


def violated(report) -> dict[str, list[str]]:
    return {c.name: c.samples for c in report.checks if not c.ok}


def executed_payment(source, target, amount=10):
    payment = due_payment(source=source, target=target, amount=amount)
    claim = claim_due(batch=100, lease_seconds=60)
    execute_batch(pairs=[p for p in claim.fresh + claim.reclaimed if p[0] == payment.id])
    payment.refresh_from_db()
    return payment


def drop_constraint(table: str, like: str) -> None:
    """Remove a safety net inside this test's transaction (rolled back afterwards)."""
    with connection.cursor() as cur:
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")  # ALTER TABLE refuses pending deferred checks
        cur.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND conname LIKE %s", [table, like]
        )
        (name,) = cur.fetchone()
        cur.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')


@pytest.fixture
def history():
    """A clean history with every kind of outcome: executed (one re-claimed first),
    failed, cancelled, still scheduled, in flight, and a deposit."""
    a, b, poor = funded_account(balance=1000), funded_account(), funded_account(balance=1)
    ok = executed_payment(a, b, 100)
    reclaimed = due_payment(source=a, target=b, amount=5)
    claim_due(batch=100, lease_seconds=60)
    expire_lease(reclaimed)
    claim_due(batch=100, lease_seconds=60)
    assert execute_batch(pairs=[(reclaimed.id, 1)]).stale  # the superseded attempt turns up late
    execute_batch(pairs=[(reclaimed.id, 2)])
    failed = executed_payment(poor, b, 50)
    cancelled = due_payment(source=a, target=b, amount=1, seconds_ago=-3600)
    payment_cancel(payment_id=cancelled.id, actor=a.owner)
    later = due_payment(source=a, target=b, amount=1, seconds_ago=-3600)
    in_flight = due_payment(source=a, target=b, amount=1)
    claim_due(batch=100, lease_seconds=60)
    return {"a": a, "b": b, "ok": ok, "reclaimed": reclaimed, "failed": failed,
            "cancelled": cancelled, "later": later, "in_flight": in_flight}


def test_clean_history_passes_every_check(history):
    report = reconcile()
    assert report.ok, violated(report)
    assert [c.name for c in report.checks] == list(CHECKS)
    assert report.payments == 6
    assert ScheduledPayment.objects.get(pk=history["failed"].id).status == "FAILED"


def test_executed_payment_without_transfer_is_reported(history):
    payment = history["in_flight"]
    # A status CAS without the ledger write: what a broken executor would leave.
    ScheduledPayment.objects.filter(pk=payment.id).update(status="EXECUTED", executed_at=timezone.now())
    report = reconcile()
    assert [s.split()[0] for s in report.get("executed_without_transfer").samples] == [payment.id]


def test_second_transfer_for_one_payment_is_reported_as_duplicate(history):
    payment = history["ok"]
    drop_constraint("ledger_transfer", "%key%")
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO ledger_transfer (key, debit_account_id, credit_account_id, amount, created_at)"
            " VALUES (%s, %s, %s, %s, now())",
            [payment.id, payment.from_account_id, payment.to_account_id, payment.amount],
        )
    report = violated(reconcile())
    assert report["duplicate_transfers"] == [f"{payment.id} 2 transfers"]
    assert "balance_mismatch" in report  # balances did not follow the second transfer


def test_transfer_to_an_account_that_does_not_exist_is_reported(history):
    # Transfers carry no foreign key to their accounts (decision 0014): only
    # ledger_post_batch writes them, after locking both accounts. One written around it:
    a = history["a"]
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO ledger_transfer (key, debit_account_id, credit_account_id, amount, created_at)"
            " VALUES ('stray', %s, 'acc_nobody', 3, now())",
            [a.id],
        )
    report = violated(reconcile())
    assert report["transfer_unknown_account"] == ["acc_nobody net 3"]


def test_transfer_that_disagrees_with_its_payment_is_reported(history):
    a, b = history["a"], history["b"]
    payment = due_payment(source=a, target=b, amount=7)
    ledger_transfer(key=payment.id, debit_account_id=a.id, credit_account_id=b.id, amount=8)
    claim_due(batch=100, lease_seconds=60)
    assert execute_batch(pairs=[(payment.id, 1)]).already_applied == [payment.id]
    samples = reconcile().get("transfer_mismatch").samples
    assert samples == [f"{payment.id} payment 7 {a.id}->{b.id}, transfer 8 {a.id}->{b.id}"]


def test_money_moved_for_unexecuted_or_missing_payments_is_reported(history):
    a, b = history["a"], history["b"]
    for payment in (history["cancelled"], history["later"]):
        ledger_transfer(key=payment.id, debit_account_id=a.id, credit_account_id=b.id, amount=1)
    ledger_transfer(key="pay_DOESNOTEXIST", debit_account_id=a.id, credit_account_id=b.id, amount=1)
    ledger_deposit(key="dep_fine", account_id=a.id, amount=1)  # not a payment key: not an orphan
    report = violated(reconcile())
    assert sorted(report["transfer_without_execution"]) == sorted(
        [f"{history['cancelled'].id} CANCELLED", f"{history['later'].id} SCHEDULED"]
    )
    assert report["transfer_for_missing_payment"] == ["pay_DOESNOTEXIST"]
    assert "balance_mismatch" not in report


def test_events_and_attempts_of_no_payment_are_reported(history):
    """They carry no foreign key to the partitioned payments (migration 0018, decision 0009)."""
    PaymentEvent.objects.create(payment_id="pay_GONE", kind="created", to_status="SCHEDULED", actor="test")
    ExecutionAttempt.objects.create(payment_id="pay_GONE", attempt=1, started_at=timezone.now(), outcome="executed")
    ExecutionAttempt.objects.create(payment_id="pay_ALSOGONE", attempt=1, started_at=timezone.now(), outcome="error")
    report = violated(reconcile())
    assert report["orphan_history"] == ["pay_ALSOGONE: 0 events, 1 attempts of no payment",
                                        "pay_GONE: 1 events, 1 attempts of no payment"]


def test_balances_that_do_not_follow_the_entries_are_reported(history):
    a = history["a"]
    with connection.cursor() as cur:
        cur.execute("UPDATE ledger_account SET balance = balance + 5 WHERE id = %s", [a.id])
    report = violated(reconcile())
    assert report["balance_sum_nonzero"] == ["sum 5"]
    assert report["balance_mismatch"] == [f"{a.id} balance {a.balance - 105 + 5}, entries {a.balance - 105}"]


def test_negative_user_balance_is_reported_even_without_the_check_constraint(history):
    b = history["b"]
    drop_constraint("ledger_account", "%non_negative%")
    with connection.cursor() as cur:
        cur.execute("UPDATE ledger_account SET balance = -1 WHERE id = %s", [b.id])
    assert reconcile().get("negative_user_balance").samples == [f"{b.id} balance -1"]


def test_stuck_lease_and_stalled_sweep_are_reported_past_their_thresholds(history):
    stuck = history["in_flight"]
    ScheduledPayment.objects.filter(pk=stuck.id).update(lease_until=timezone.now() - timedelta(minutes=10))
    overdue = due_payment(source=history["a"], target=history["b"], amount=1, seconds_ago=600)
    report = violated(reconcile(stuck_after_seconds=300, overdue_after_seconds=300))
    assert [s.split()[0] for s in report["stuck_executing"]] == [stuck.id]
    assert [s.split()[0] for s in report["overdue_scheduled"]] == [overdue.id]
    assert reconcile(stuck_after_seconds=3600, overdue_after_seconds=3600).ok


def test_history_that_contradicts_the_status_is_reported(history):
    ok = history["ok"]
    PaymentEvent.objects.create(payment=ok, kind="failed", from_status="EXECUTING", to_status="FAILED",
                                attempt=1, actor="forged")
    ExecutionAttempt.objects.create(payment=history["in_flight"], attempt=1, started_at=timezone.now(),
                                    outcome="executed")
    report = violated(reconcile())
    assert report["event_history"] == [f"{ok.id} EXECUTED: executed with 1 executed and 1 failed events"]
    assert report["attempt_history"] == [f"{history['in_flight'].id} EXECUTING: EXECUTING but attempt 1 is executed"]


def test_claim_events_follow_the_attempts_a_payment_claimed_before_0010_included(history):
    """A first claim writes no event and each later one writes "reclaimed" (decision record
    0010); a payment claimed before that change keeps its one "claimed" event at attempt 1."""
    ok, reclaimed, in_flight = history["ok"], history["reclaimed"], history["in_flight"]
    assert list(PaymentEvent.objects.filter(payment=reclaimed, kind__in=["claimed", "reclaimed"])
                .values_list("kind", "attempt")) == [("reclaimed", 2)]
    PaymentEvent.objects.create(payment=ok, kind="claimed", from_status="SCHEDULED", to_status="EXECUTING",
                                attempt=1, actor="before-0010")
    assert reconcile().ok, violated(reconcile())
    PaymentEvent.objects.create(payment=ok, kind="claimed", from_status="SCHEDULED", to_status="EXECUTING",
                                attempt=1, actor="forged")
    with connection.cursor() as cur:  # events are append-only: the trigger has to go first
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cur.execute("ALTER TABLE payments_paymentevent DISABLE TRIGGER USER")
        cur.execute("DELETE FROM payments_paymentevent WHERE payment_id = %s AND kind = 'reclaimed'", [reclaimed.id])
    PaymentEvent.objects.create(payment=in_flight, kind="reclaimed", from_status="EXECUTING", to_status="EXECUTING",
                                attempt=1, actor="forged")
    assert sorted(violated(reconcile())["event_history"]) == sorted([
        f"{ok.id} EXECUTED: 2 claimed and 0 reclaimed events for attempt 1",
        f"{reclaimed.id} EXECUTED: 0 claimed and 0 reclaimed events for attempt 2",
        f"{in_flight.id} EXECUTING: 0 claimed and 1 reclaimed events for attempt 1",
    ])


def test_two_attempts_that_both_moved_money_are_reported(history):
    reclaimed = history["reclaimed"]
    with connection.cursor() as cur:
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cur.execute("ALTER TABLE payments_executionattempt DISABLE TRIGGER USER")
        cur.execute("UPDATE payments_executionattempt SET outcome = 'executed' WHERE payment_id = %s", [reclaimed.id])
    (sample,) = reconcile().get("attempt_history").samples
    assert sample == f"{reclaimed.id} EXECUTED: 2 attempts moved money; 1 earlier attempts finished it"


def test_command_exits_0_when_clean_and_1_with_a_report(history, capsys):
    call_command("reconcile")
    assert "0 violations" in capsys.readouterr().out
    ScheduledPayment.objects.filter(pk=history["in_flight"].id).update(
        status="EXECUTED", executed_at=timezone.now()
    )
    with pytest.raises(CommandError) as err:
        call_command("reconcile", "--json", "--stuck-after", "1", "--overdue-after", "1", "--limit", "5")
    assert err.value.returncode == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    by_name = {c["name"]: c for c in report["checks"]}
    assert by_name["executed_without_transfer"]["violations"] == 1
    assert by_name["executed_without_transfer"]["samples"][0].startswith(history["in_flight"].id)
    assert by_name["duplicate_transfers"]["ok"] is True
    # Every run reports its result for delaypay_reconcile_violations (the alert).
    assert Heartbeat.objects.get(name=Heartbeat.RECONCILE).value == report["violations"] > 0


def test_daily_task_logs_every_violation_at_error(history, caplog):
    assert tasks.reconcile_daily() == {"ok": True, "violations": 0}
    assert Heartbeat.objects.get(name=Heartbeat.RECONCILE).value == 0
    ScheduledPayment.objects.filter(pk=history["in_flight"].id).update(
        status="EXECUTED", executed_at=timezone.now()
    )
    with caplog.at_level(logging.INFO, logger="payments.reconciliation"):
        assert tasks.reconcile_daily()["ok"] is False
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("executed_without_transfer" in m and history["in_flight"].id in m for m in errors)


def test_daily_reconcile_is_on_the_beat_schedule_off_the_promoter_queue():
    entry = django_settings.CELERY_BEAT_SCHEDULE["reconcile-daily"]
    assert entry["task"] == "payments.tasks.reconcile_daily"
    assert entry["options"]["queue"] != "promoter"
    assert entry["schedule"].remaining_estimate(timezone.now()) <= timedelta(days=1)
