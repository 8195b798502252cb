from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Count, F, Sum
from django.utils import timezone

from devtools.bench import loader
from devtools.bench.check import check_run
from ledger.models import ISSUANCE_ACCOUNT_ID, Account, Transfer
from payments.execution import execute_batch
from payments.models import PaymentEvent, PaymentStatus, ScheduledPayment
from payments.promoter import claim_due

pytestmark = pytest.mark.django_db

ACCOUNTS = 20


def load(payments=200, **kwargs):
    loader.load_accounts(accounts=ACCOUNTS)
    due_at = kwargs.pop("due_at", timezone.now() - timedelta(seconds=5))
    return loader.load_payments(payments=payments, accounts=ACCOUNTS, due_at=due_at, **kwargs), due_at


def run_everything():
    """Claim and execute every due payment, as the promoter and the workers would."""
    while claim := claim_due(batch=60, lease_seconds=60):
        execute_batch(pairs=claim.fresh + claim.reclaimed, worker="test")


def test_burst_load_writes_due_payments_events_and_funding_deposits():
    loaded, due_at = load()
    payments = ScheduledPayment.objects.all()
    assert loaded.payments == payments.count() == 200
    assert set(payments.values_list("execute_at", flat=True)) == {due_at}
    assert set(payments.values_list("status", flat=True)) == {PaymentStatus.SCHEDULED}
    assert not payments.filter(from_account_id=F("to_account_id")).exists()
    assert PaymentEvent.objects.filter(kind="created").count() == 200
    planted = payments.filter(amount=loader.UNDERFUNDED_AMOUNT)
    assert set(planted.values_list("id", flat=True)) == loader.underfunded_ids(1, 200)
    assert loaded.underfunded == planted.count() == 4  # every 50th: 2%
    # Every payer holds exactly what its normal payments need, deposited from issuance.
    needs = dict(
        payments.exclude(amount=loader.UNDERFUNDED_AMOUNT)
        .values_list("from_account_id").annotate(total=Sum("amount"))
    )
    balances = dict(Account.objects.filter(kind="user").values_list("id", "balance"))
    assert {k: v for k, v in balances.items() if v} == needs
    assert Transfer.objects.filter(debit_account_id=ISSUANCE_ACCOUNT_ID).count() == len(needs)
    assert Account.objects.aggregate(total=Sum("balance"))["total"] == 0


def test_hot_sender_load_debits_the_treasury_only():
    load(hot_sender=True)
    senders = ScheduledPayment.objects.values("from_account_id").annotate(n=Count("id"))
    assert list(senders) == [{"from_account_id": loader.TREASURY_ACCOUNT, "n": 200}]
    assert not ScheduledPayment.objects.filter(to_account_id=loader.TREASURY_ACCOUNT).exists()


def test_steady_load_spreads_due_times_evenly_over_the_window():
    _, due_at = load(payments=100, timing="even", window_seconds=10)
    times = list(ScheduledPayment.objects.order_by("id").values_list("execute_at", flat=True))
    assert times[0] == due_at
    assert times[-1] == due_at + timedelta(seconds=9.9)
    assert times[50] - times[49] == timedelta(seconds=0.1)


def test_jittered_burst_keeps_the_requested_time_and_spreads_due_times_after_it():
    _, due_at = load(payments=200, jitter_seconds=10, due_at=timezone.now() - timedelta(seconds=20))
    rows = list(ScheduledPayment.objects.values_list("requested_execute_at", "execute_at", "jitter_seconds"))
    assert {requested for requested, _, _ in rows} == {due_at}
    assert {jitter for _, _, jitter in rows} == {10}
    assert all(due_at <= execute_at <= due_at + timedelta(seconds=10) for _, execute_at, _ in rows)
    assert len({execute_at for _, execute_at, _ in rows}) > 100  # spread, not one instant
    run_everything()
    assert check_run(expected_failed=loader.underfunded_ids(1, 200)).correct


def test_a_second_load_continues_the_numbering_and_funds_its_own_payers():
    first, due_at = load(payments=100)
    second = loader.load_payments(payments=100, accounts=ACCOUNTS, due_at=due_at, first=101)
    assert (second.first, second.last, second.underfunded) == (101, 200, 2)
    assert ScheduledPayment.objects.count() == 200
    assert loader.underfunded_count(1, 200) == first.underfunded + second.underfunded
    assert Account.objects.aggregate(total=Sum("balance"))["total"] == 0


def test_check_passes_after_every_payment_ran_and_exactly_the_planted_ones_failed():
    loaded, _ = load()
    run_everything()
    result = check_run(expected_failed=loader.underfunded_ids(loaded.first, loaded.last))
    assert result.violations == {}
    assert result.correct
    assert result.counts == {"EXECUTED": 196, "FAILED": 4}


def test_check_reports_payments_left_unfinished():
    load()
    result = check_run()
    assert not result.correct
    assert result.violations["not_terminal"]["count"] == 200


def test_check_detects_a_transfer_for_a_failed_payment():
    load()
    run_everything()
    failed = ScheduledPayment.objects.filter(status=PaymentStatus.FAILED).first()
    Transfer.objects.create(key=failed.id, debit_account_id=failed.from_account_id,
                            credit_account_id=failed.to_account_id, amount=1)
    violations = check_run().violations
    assert violations["transfer_for_unexecuted_payment"]["sample"] == [failed.id]
    assert "transfer_differs_from_payment" in violations  # amount 1, not the payment's
    assert "balance_differs_from_transfers" in violations  # no balance moved with it


def test_check_detects_a_balance_that_disagrees_with_its_transfers_and_a_nonzero_sum():
    load()
    run_everything()
    Account.objects.filter(pk=loader.account_id(3)).update(balance=10**6)
    result = check_run()
    assert result.violations["balance_differs_from_transfers"]["sample"] == [loader.account_id(3)]
    assert result.sum_of_balances != 0
    assert not result.correct


def test_check_detects_an_executed_payment_without_its_transfer_or_audit():
    load()
    run_everything()
    payment = ScheduledPayment.objects.filter(status=PaymentStatus.EXECUTED).first()
    with connection.cursor() as cur:
        # Only possible behind the triggers' back: the bench must still notice.
        cur.execute("SET LOCAL session_replication_role = replica")  # triggers off, this transaction only
        cur.execute("DELETE FROM ledger_transfer WHERE key = %s", [payment.id])
        cur.execute("DELETE FROM payments_paymentevent WHERE payment_id = %s AND to_status = 'EXECUTED'",
                    [payment.id])
    violations = check_run().violations
    assert violations["executed_without_transfer"]["sample"] == [payment.id]
    assert violations["finished_without_event"]["sample"] == [payment.id]


def test_check_detects_a_failure_that_was_not_planted():
    loaded, _ = load()
    run_everything()
    planted = loader.underfunded_ids(loaded.first, loaded.last)
    violations = check_run(expected_failed=planted | {loader.payment_id(1)}).violations
    assert violations["planted_underfunded_not_failed"]["sample"] == [loader.payment_id(1)]
    violations = check_run(expected_failed=planted - {loader.payment_id(50)}).violations
    assert violations["failed_but_not_planted"]["sample"] == [loader.payment_id(50)]
