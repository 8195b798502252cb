"""Payouts through the sandbox gateway (a real process), worked in-process: claim with the
promoter's payouts claim, then the worker's run_payout_batch. Each test ends with the
reconciliation clean and the gateway holding at most one payout per key."""

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.models import Account, PendingTransfer
from payments import promoter
from payments.models import BreakerState, Payout, PayoutState, RailState, ScheduledPayment
from payments.reconciliation import reconcile
from payouts.executor import run_payout_batch
from tests.conftest import client_for
from tests.factories import claim_payouts, due_payment, due_payout, funded_account, payee_for, work_payouts

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_rail")]


claim, work = claim_payouts, work_payouts


def balance(account_id: str) -> int:
    return Account.objects.get(pk=account_id).balance


def assert_clean():
    report = reconcile()
    assert report.ok, [(c.name, c.samples) for c in report.checks if not c.ok]


def expire(payment):
    ScheduledPayment.objects.filter(pk=payment.pk, status="EXECUTING").update(
        lease_until=timezone.now() - timedelta(hours=1)
    )


def test_a_payout_is_paid_once_and_its_reserve_posted(rail_gateway):
    source = funded_account(balance=500)
    payout = due_payout(source=source, payee=payee_for(source.owner), amount=120)
    result = work()
    assert result.executed == [payout.id]
    payout.refresh_from_db()
    assert payout.status == "EXECUTED"
    record = Payout.objects.get(pk=payout.pk)
    assert record.state == PayoutState.PAID and record.reference.startswith("po_") and record.paid_at
    assert balance(source.id) == 380
    assert balance("acc_sandbox_clearing") == 0
    assert balance("acc_sandbox_settlement") == 120
    assert PendingTransfer.objects.get(pk=payout.pk).state == "posted"
    assert rail_gateway.payouts(payout.id)["count"] == 1
    assert_clean()


def test_a_declined_payout_fails_and_its_money_comes_back(rail_gateway):
    source = funded_account(balance=500)
    payout = due_payout(source=source, payee=payee_for(source.owner, destination="decline-closed"), amount=120)
    result = work()
    assert result.failed == {payout.id: "declined"}
    assert balance(source.id) == 500
    assert balance("acc_sandbox_clearing") == 0
    assert Payout.objects.get(pk=payout.pk).state == PayoutState.DECLINED
    assert rail_gateway.payouts(payout.id)["count"] == 0
    assert_clean()


def test_insufficient_funds_fail_without_a_call(rail_gateway):
    source = funded_account(balance=10)
    payout = due_payout(source=source, payee=payee_for(source.owner), amount=120)
    result = work()
    assert result.failed == {payout.id: "insufficient_funds"}
    assert not Payout.objects.filter(pk=payout.pk).exists()
    assert rail_gateway.payouts(payout.id)["count"] == 0
    assert_clean()


def test_a_message_delivered_again_after_its_attempt_was_unknown_is_stale(rail_gateway):
    """The broker delivers an attempt's message again after that attempt recorded an
    unknown outcome (the payout stays EXECUTING at that attempt, its lease moved to the
    follow-up): the redelivery changes nothing, and the successor attempt, claimed when
    the lease ends, looks the payout up and finishes it (chaos seed 514838 found the
    redelivery paying the payout under an attempt whose one row said "unknown")."""
    source = funded_account(balance=500)
    payout = due_payout(source=source, payee=payee_for(source.owner), amount=120)
    pairs = claim()
    rail_gateway.faults(timeout_rate=1.0)
    assert run_payout_batch(pairs, worker="first").unknown == [payout.id]
    rail_gateway.faults(timeout_rate=0.0)
    again = run_payout_batch(pairs, worker="redelivered")
    assert again.stale == pairs and not again.executed
    payout.refresh_from_db()
    assert (payout.status, payout.attempt) == ("EXECUTING", 1)
    assert list(payout.attempts.values_list("attempt", "outcome")) == [(1, "unknown")]
    assert_clean()
    expire(payout)
    assert work().executed == [payout.id]
    payout.refresh_from_db()
    assert (payout.status, payout.attempt) == ("EXECUTED", 2)
    assert rail_gateway.payouts(payout.id)["count"] == 1
    assert_clean()


@pytest.mark.parametrize("fault", ["timeout_rate", "error_rate"])
def test_an_ambiguous_answer_stays_in_flight_and_the_lookup_resolves_it(rail_gateway, fault):
    source = funded_account(balance=500)
    payout = due_payout(source=source, payee=payee_for(source.owner), amount=120)
    rail_gateway.faults(**{fault: 1.0})
    result = work()
    assert result.unknown == [payout.id]
    payout.refresh_from_db()
    assert payout.status == "EXECUTING" and payout.lease_until > timezone.now()
    assert payout.attempts.get(attempt=1).outcome == "unknown"
    assert balance(source.id) == 380 and balance("acc_sandbox_clearing") == 120  # reserved, not gone
    # The creator cannot cancel it meanwhile.
    assert_clean()
    rail_gateway.faults(**{fault: 0.0})
    expire(payout)
    result = work()
    assert result.executed == [payout.id]
    record = Payout.objects.get(pk=payout.pk)
    # A timeout happened after the gateway paid: the lookup finds it. A 5xx came before:
    # nothing found, submitted again under the same key.
    assert (record.lookups, record.submissions) == ((1, 1) if fault == "timeout_rate" else (1, 2))
    assert rail_gateway.payouts(payout.id)["count"] == 1
    assert balance("acc_sandbox_settlement") == 120
    assert_clean()


def test_the_budget_spent_on_unknowns_parks_it_with_its_funds_reserved(rail_gateway, settings, superuser, api, user):
    staff_api = client_for(superuser)
    settings.DELAYPAY_MAX_ATTEMPTS = 2
    source = funded_account(owner=user, balance=500)
    payout = due_payout(source=source, payee=payee_for(user), amount=120)
    rail_gateway.faults(timeout_rate=1.0)  # paid at the rail, the answer lost
    work()
    rail_gateway.faults(timeout_rate=0.0, error_rate=1.0)  # and the lookup fails too
    expire(payout)
    result = work()
    assert result.parked == {payout.id: "outcome_unknown"}
    payout.refresh_from_db()
    assert payout.status == "NEEDS_REVIEW"
    assert balance("acc_sandbox_clearing") == 120
    # Its creator cannot cancel it: the rail may have paid.
    response = api.delete(f"/api/v1/payments/{payout.id}")
    assert response.status_code == 409 and response.json()["code"] == "payout_outcome_unknown"
    # Resolving it as failed asks the rail: no answer, 503; then it says it paid: refused,
    # re-drive it instead.
    resolve = {"outcome": "failed", "reason": "x"}
    response = staff_api.post(f"/api/v1/payments/{payout.id}/resolve", resolve, format="json")
    assert response.status_code == 503 and response.json()["code"] == "rail_unavailable"
    rail_gateway.faults(error_rate=0.0)
    response = staff_api.post(f"/api/v1/payments/{payout.id}/resolve", resolve, format="json")
    assert response.status_code == 409 and response.json()["code"] == "payout_paid_at_rail"
    response = staff_api.post(f"/api/v1/payments/{payout.id}/redrive", {"reason": "the rail paid it"}, format="json")
    assert response.status_code == 200
    result = work()
    assert result.executed == [payout.id]
    assert rail_gateway.payouts(payout.id)["count"] == 1
    assert_clean()


def test_resolving_a_parked_payout_the_rail_never_saw_voids_it(rail_gateway, settings, superuser):
    staff_api = client_for(superuser)
    settings.DELAYPAY_MAX_ATTEMPTS = 1
    source = funded_account(balance=500)
    payout = due_payout(source=source, payee=payee_for(source.owner), amount=120)
    rail_gateway.faults(error_rate=1.0)
    result = work()
    assert result.parked == {payout.id: "outcome_unknown"}
    rail_gateway.faults(error_rate=0.0)
    response = staff_api.post(f"/api/v1/payments/{payout.id}/resolve", {"outcome": "failed", "reason": "never sent"},
                              format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "FAILED"
    assert balance(source.id) == 500 and balance("acc_sandbox_clearing") == 0
    assert Payout.objects.get(pk=payout.pk).state == PayoutState.VOIDED
    assert_clean()


def test_the_breaker_opens_stops_claims_then_probes_and_closes(rail_gateway, settings):
    settings.DELAYPAY_RAIL_BREAKER_FAILURES = 2
    settings.DELAYPAY_RAIL_BREAKER_COOLDOWN_SECONDS = 0.2
    source = funded_account(balance=10_000)
    payee = payee_for(source.owner)
    first = [due_payout(source=source, payee=payee, amount=1) for _ in range(3)]
    rail_gateway.faults(down=True)
    work()
    assert RailState.objects.get(pk="sandbox").breaker == BreakerState.OPEN
    waiting = due_payout(source=source, payee=payee, amount=1)
    target = funded_account()
    internal = due_payment(source=source, target=target, amount=1)
    assert claim() == []  # open: nothing claimed, nothing failed
    waiting.refresh_from_db()
    assert waiting.status == "SCHEDULED" and waiting.attempt == 0
    assert promoter.claim_due(batch=10, lease_seconds=60).fresh == [(internal.id, 1)]  # internal unaffected
    rail_gateway.faults(down=False)
    import time

    time.sleep(0.3)
    probe = claim()
    assert len(probe) == 1  # half-open: one probe
    assert RailState.objects.get(pk="sandbox").breaker == BreakerState.HALF_OPEN
    assert claim() == []
    run_payout_batch(probe, worker="test")
    assert RailState.objects.get(pk="sandbox").breaker == BreakerState.CLOSED
    for p in first:
        expire(p)
    while work():
        pass
    assert ScheduledPayment.objects.filter(rail="sandbox", status="EXECUTED").count() == 4
    assert_clean()


def test_pacing_claims_no_more_than_the_bucket_holds(rail_gateway, settings):
    settings.DELAYPAY_RAIL_RATE_LIMIT = 5
    RailState.objects.filter(rail="sandbox").update(tokens=0, refilled_at=timezone.now())
    source = funded_account(balance=10_000)
    payee = payee_for(source.owner)
    for _ in range(20):
        due_payout(source=source, payee=payee, amount=1)
    import time

    time.sleep(1.0)
    claimed = claim()
    assert 4 <= len(claimed) <= 7  # 5/s for ~1 s, at most 1.25 s worth
    assert claim() == []


def test_a_rail_that_refuses_connections_costs_no_try(rail_gateway, settings):
    from devtools.gateway import free_port
    from rails.registry import close_rails

    settings.DELAYPAY_RAIL_SANDBOX_URL = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    close_rails()
    source = funded_account(balance=500)
    payout = due_payout(source=source, payee=payee_for(source.owner), amount=120)
    result = work()
    assert result.unknown == [payout.id]
    payout.refresh_from_db()
    assert (payout.status, payout.tries) == ("EXECUTING", 0)
    assert balance("acc_sandbox_clearing") == 120  # reserved until the rail answers
    assert_clean()


def test_a_message_on_the_wrong_queue_changes_nothing(rail_gateway):
    """A payout's claim delivered to the internal executor, and an internal payment's to
    the payouts worker (a misrouted or replayed message): neither executor fences the
    other's payment, neither records an attempt under its current attempt, and each
    payment is then worked by its own executor as if nothing had happened."""
    from payments.models import ExecutionAttempt
    from payments.worker import run_batch

    source, target = funded_account(balance=500), funded_account()
    payout = due_payout(source=source, payee=payee_for(source.owner), amount=120)
    internal = due_payment(source=source, target=target, amount=30)
    (payout_pair,) = claim()
    (internal_pair,) = [pair for pair in promoter.claim_due(batch=10, lease_seconds=60).fresh]

    assert run_batch([payout_pair], worker="wrong-queue").stale == [payout_pair]
    assert run_payout_batch([internal_pair], worker="wrong-queue").stale == [internal_pair]
    for payment, pair in ((payout, payout_pair), (internal, internal_pair)):
        row = ScheduledPayment.objects.get(pk=payment.pk)
        assert (row.status, row.attempt) == ("EXECUTING", pair[1])
    assert not ExecutionAttempt.objects.exists()

    assert run_payout_batch([payout_pair], worker="test").executed == [payout.id]
    assert run_batch([internal_pair], worker="test").executed == [internal.id]
    assert sorted(ExecutionAttempt.objects.values_list("payment_id", "outcome")) == sorted(
        [(payout.id, "executed"), (internal.id, "executed")]
    )
    assert balance(source.id) == 500 - 120 - 30
    # What the wrong queue does cost: its start is counted by the other kind's mechanism as
    # well (a start marker for the payout, the in-row count for the internal payment), so
    # each attempt counts as two tries of its budget (DELAYPAY_MAX_ATTEMPTS).
    assert [ScheduledPayment.objects.get(pk=p.pk).tries for p in (payout, internal)] == [2, 2]
    assert_clean()
