"""Payouts end to end: the real `worker`, `promoter`, `payouts`, `beat` and `gateway`
processes (the Procfile's lines), the gateway's faults set over its control endpoint.
Nothing is mocked: the rail is a loopback HTTP server with its own storage."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from devtools.gateway import SandboxGateway, free_port
from ledger.models import Account
from payments.models import BreakerState, Payout, RailState, ScheduledPayment
from payments.reconciliation import reconcile
from payments.services import payment_cancel, payment_schedule
from payouts.payees import payee_create
from tests.concurrency import wait_until
from tests.factories import funded_account

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PORT = free_port()
PAYOUT_ENV = {
    "DELAYPAY_RAIL_SANDBOX_URL": f"http://127.0.0.1:{PORT}",
    "DELAYPAY_RAIL_TIMEOUT_SECONDS": "2",
    "DELAYPAY_RAIL_FOLLOWUP_DELAYS": "0.5,1,1,2,2",
    "DELAYPAY_RAIL_BREAKER_FAILURES": "3",
    "DELAYPAY_RAIL_BREAKER_COOLDOWN_SECONDS": "2",
    "DELAYPAY_MAX_ATTEMPTS": "10",
    "DELAYPAY_LEASE_SECONDS": "10",
}


@pytest.fixture
def gateway(celery_stack):
    """The Procfile's gateway line, on the port the processes were told."""
    celery_stack.start_gateway(PORT)
    control = SandboxGateway(port=PORT, db_path=celery_stack.log_dir / "unused.db")
    wait_until(lambda: _answers(control), timeout=20, stack=celery_stack, what="the gateway answers")
    try:
        yield control
    finally:
        control._client.close()


def _answers(control) -> bool:
    try:
        control.faults()
        return True
    except Exception:
        return False


def start(stack):
    stack.start_worker("worker1", concurrency=2)
    stack.start_payouts()
    stack.start_promoter()
    stack.start_beat()
    stack.wait_ready(["worker1", "payouts", "promoter", "beat"])


def payout(source, payee, amount, seconds=1.0):
    return payment_schedule(payer=source.owner, from_account_id=source.id, to_payee_id=payee.id, amount=amount,
                            execute_at=timezone.now() + timedelta(seconds=seconds))


def finished(ids) -> bool:
    return not ScheduledPayment.objects.filter(pk__in=list(ids)).exclude(
        status__in=["EXECUTED", "FAILED", "CANCELLED"]).exists()


def check_gateway_agrees(control, ids):
    """Every EXECUTED payout has exactly one payout at the gateway, every other none."""
    held = {}
    for row in control.all_payouts():
        if row["status"] == "paid":
            held[row["idempotency_key"]] = held.get(row["idempotency_key"], 0) + 1
    assert control.summary()["duplicates"] == []
    for p in ScheduledPayment.objects.filter(pk__in=list(ids)):
        assert held.get(p.id, 0) == (1 if p.status == "EXECUTED" else 0), (p.id, p.status)


def assert_clean():
    report = reconcile(stuck_after_seconds=600, overdue_after_seconds=600)
    assert report.ok, [(c.name, c.samples) for c in report.checks if not c.ok]


@pytest.mark.parametrize("celery_stack", [PAYOUT_ENV], indirect=True)
def test_payouts_execute_decline_and_cancel_and_timeouts_resolve_by_lookup(celery_stack, gateway):
    alice = funded_account(balance=10_000)
    bob = payee_create(owner=alice.owner, name="Bob", rail="sandbox", destination="acct_bob")
    closed = payee_create(owner=alice.owner, name="Closed", rail="sandbox", destination="decline-closed")
    paid = payout(alice, bob, 100)
    declined = payout(alice, closed, 200)
    cancelled = payout(alice, bob, 300, seconds=60)
    payment_cancel(payment_id=cancelled.id, actor=alice.owner)
    # Half the answers are lost after the gateway paid: the lookups must find them.
    gateway.faults(timeout_rate=0.5)
    ambiguous = [payout(alice, bob, 10) for _ in range(20)]
    start(celery_stack)
    ids = [paid.id, declined.id, cancelled.id, *(p.id for p in ambiguous)]
    wait_until(lambda: finished(ids), timeout=90, stack=celery_stack, what="every payout finished")
    statuses = dict(ScheduledPayment.objects.filter(pk__in=ids).values_list("id", "status"))
    assert statuses[paid.id] == "EXECUTED"
    assert statuses[declined.id] == "FAILED"
    assert statuses[cancelled.id] == "CANCELLED"
    assert all(statuses[p.id] == "EXECUTED" for p in ambiguous)
    assert Payout.objects.filter(pk__in=[p.id for p in ambiguous], lookups__gt=0).exists()
    alice.refresh_from_db()
    assert alice.balance == 10_000 - 100 - 20 * 10  # the declined 200 came back
    assert Account.objects.get(pk="acc_sandbox_clearing").balance == 0
    assert Account.objects.get(pk="acc_sandbox_settlement").balance == 300
    check_gateway_agrees(gateway, ids)
    assert_clean()


@pytest.mark.parametrize("celery_stack", [PAYOUT_ENV], indirect=True)
def test_a_gateway_outage_opens_the_breaker_then_everything_drains(celery_stack, gateway):
    alice = funded_account(balance=10_000)
    target = funded_account()
    bob = payee_create(owner=alice.owner, name="Bob", rail="sandbox", destination="acct_bob")
    gateway.faults(down=True)
    start(celery_stack)
    first = [payout(alice, bob, 1) for _ in range(5)]
    wait_until(lambda: RailState.objects.get(pk="sandbox").breaker == BreakerState.OPEN, timeout=60,
               stack=celery_stack, what="the breaker opens")
    # While it is open: new payouts wait SCHEDULED, unclaimed; internal payments run.
    waiting = [payout(alice, bob, 1) for _ in range(10)]
    internal = payment_schedule(payer=alice.owner, from_account_id=alice.id, to_account_id=target.id, amount=7,
                                execute_at=timezone.now() + timedelta(seconds=1))
    wait_until(lambda: ScheduledPayment.objects.get(pk=internal.id).status == "EXECUTED", timeout=30,
               stack=celery_stack, what="the internal payment runs")
    time.sleep(3)
    for p in ScheduledPayment.objects.filter(pk__in=[w.id for w in waiting]):
        assert (p.status, p.attempt) == ("SCHEDULED", 0)
    assert not ScheduledPayment.objects.filter(rail="sandbox", status__in=["FAILED", "NEEDS_REVIEW"]).exists()
    gateway.faults(down=False)
    ids = [p.id for p in first + waiting]
    wait_until(lambda: finished(ids), timeout=90, stack=celery_stack, what="the payouts drain after the outage")
    assert RailState.objects.get(pk="sandbox").breaker == BreakerState.CLOSED
    assert set(ScheduledPayment.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"EXECUTED"}
    check_gateway_agrees(gateway, ids)
    assert_clean()
