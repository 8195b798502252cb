"""Races on real PostgreSQL, many repetitions, every racer on its own connection.

Each test releases its racers at the same instant (tests/concurrency.py) and checks the
guarantee that must hold whoever wins: one winner, one transfer, nothing left behind,
no negative balance.
"""

from functools import partial

import pytest
from django.db import IntegrityError, connection, transaction

from ledger.models import Account, Transfer
from ledger.services import Outcome, ledger_deposit, ledger_transfer
from payments.exceptions import PaymentNotCancellable
from payments.execution import execute_batch
from payments.models import ExecutionAttempt, PaymentEvent, PaymentStatus, ScheduledPayment
from payments.promoter import claim_due
from payments.reconciliation import reconcile
from payments.services import payment_cancel
from tests.concurrency import Racers
from tests.factories import bulk_due_payments, due_payment, expire_lease, funded_account
from tests.scale import scaled

pytestmark = pytest.mark.django_db(transaction=True)


def cancel_answer(payment_id, actor) -> str:
    """What a client is told: the cancelled payment's status, or the status that made
    the payment not cancellable."""
    try:
        return payment_cancel(payment_id=payment_id, actor=actor).status
    except PaymentNotCancellable as exc:
        return exc.status


def event_kinds(payment) -> list[str]:
    return list(PaymentEvent.objects.filter(payment=payment).order_by("id").values_list("kind", flat=True))


CANCEL_ROUNDS, EXECUTE_ROUNDS, STALE_ROUNDS, FUNDS_ROUNDS = scaled(500), scaled(200), scaled(200), scaled(100)


def test_cancel_racing_claim_500_times_has_one_winner_and_a_truthful_loser():
    a, b = funded_account(), funded_account()
    wins = {"cancel": 0, "claim": 0}
    with Racers(2) as racers:
        for _ in range(CANCEL_ROUNDS):
            payment = due_payment(source=a, target=b, amount=1)
            cancel, claim = racers.run(
                partial(cancel_answer, payment.id, a.owner), partial(claim_due, batch=10, lease_seconds=60)
            )
            assert not isinstance(cancel, Exception), cancel
            assert not isinstance(claim, Exception), claim
            payment.refresh_from_db()
            claim_won = claim.fresh == [(payment.id, 1)]
            cancel_won = cancel == PaymentStatus.CANCELLED
            assert claim_won != cancel_won, (cancel, claim)
            # The loser's answer is the final state.
            if claim_won:
                wins["claim"] += 1
                assert cancel == payment.status == PaymentStatus.EXECUTING
                assert payment.attempt == 1
                assert event_kinds(payment) == ["created"]  # a first claim writes no event
            else:
                wins["cancel"] += 1
                assert len(claim) == 0
                assert (payment.status, payment.attempt) == (PaymentStatus.CANCELLED, 0)
                assert event_kinds(payment) == ["created", "cancelled"]
    assert sum(wins.values()) == CANCEL_ROUNDS, wins


def drain(*, batch: int) -> list[tuple[str, int]]:
    taken = []
    while claim := claim_due(batch=batch, lease_seconds=60):
        taken.extend(claim.fresh + claim.reclaimed)
    return taken


def assert_each_claimed_once(claims, *, total: int, attempt: int) -> None:
    everything = [pair for claim in claims for pair in claim]
    assert len(everything) == total
    assert len({pid for pid, _ in everything}) == total
    assert {att for _, att in everything} == {attempt}
    assert sum(1 for claim in claims if claim) > 1, "the promoters did not share the work"
    with connection.cursor() as cur:
        # Nothing claimed twice: each row is at this attempt (a second claim raises it), and
        # has one "reclaimed" event per attempt after the first (a first claim writes none).
        cur.execute("SELECT count(*) FILTER (WHERE attempt = %s), count(*) FROM payments_scheduledpayment", [attempt])
        assert cur.fetchone() == (total, total)
        cur.execute(
            "SELECT attempt, count(*), count(DISTINCT payment_id) FROM payments_paymentevent"
            " WHERE kind IN ('claimed', 'reclaimed') GROUP BY attempt ORDER BY attempt"
        )
        assert cur.fetchall() == [(later, total, total) for later in range(2, attempt + 1)]


def test_four_promoters_drain_20000_due_payments_claiming_each_once_per_attempt():
    a, b = funded_account(), funded_account()
    total = 20_000
    bulk_due_payments(source=a, target=b, count=total)
    with Racers(4) as racers:
        claims = racers.run(*[partial(drain, batch=500)] * 4)
        assert not any(isinstance(c, Exception) for c in claims), claims
        assert_each_claimed_once(claims, total=total, attempt=1)
        assert not ScheduledPayment.objects.filter(status=PaymentStatus.SCHEDULED).exists()

        # Every lease lapses at once (all messages lost): the four take each row again, once.
        ScheduledPayment.objects.filter(status=PaymentStatus.EXECUTING).update(lease_until="2000-01-01T00:00:00Z")
        reclaims = racers.run(*[partial(drain, batch=500)] * 4)
        assert not any(isinstance(c, Exception) for c in reclaims), reclaims
        assert_each_claimed_once(reclaims, total=total, attempt=2)
    assert ScheduledPayment.objects.filter(status=PaymentStatus.EXECUTING, attempt=2).count() == total


def test_two_workers_executing_the_same_attempt_at_once_make_one_transfer():
    a, b = funded_account(balance=10_000), funded_account()
    with Racers(2) as racers:
        for _ in range(EXECUTE_ROUNDS):
            payment = due_payment(source=a, target=b, amount=7)
            pairs = claim_due(batch=10, lease_seconds=60).fresh
            first, second = racers.run(partial(execute_batch, pairs=pairs), partial(execute_batch, pairs=pairs))
            assert sorted([len(first.executed), len(second.executed)]) == [0, 1]
            assert sorted([first.stale, second.stale]) == [[], pairs]
            assert Transfer.objects.filter(key=payment.id).count() == 1
            assert ExecutionAttempt.objects.get(payment=payment).outcome == "executed"

        # Overlapping batches: each payment of the overlap moves once, whoever gets it.
        for _ in range(10):
            for _ in range(60):
                due_payment(source=a, target=b, amount=1)
            pairs = claim_due(batch=100, lease_seconds=60).fresh
            left, right = racers.run(
                partial(execute_batch, pairs=pairs[:40]), partial(execute_batch, pairs=pairs[20:])
            )
            executed = left.executed + right.executed
            assert sorted(executed) == sorted(pid for pid, _ in pairs)
            assert sorted(left.stale + right.stale) == sorted(pairs[20:40])
    a.refresh_from_db()
    assert a.balance == 10_000 - EXECUTE_ROUNDS * 7 - 600
    assert reconcile().ok


def late_then_reclaim(payment_id):
    """The promoter re-claims the expired lease and a worker executes the new attempt."""
    claim = claim_due(batch=10, lease_seconds=60)
    return [execute_batch(pairs=[pair]) for pair in claim.reclaimed if pair[0] == payment_id]


def test_stale_attempt_result_racing_a_reclaim_is_rejected_and_audited():
    a, b = funded_account(balance=10_000), funded_account()
    superseded = 0
    with Racers(2) as racers:
        for _ in range(STALE_ROUNDS):
            payment = due_payment(source=a, target=b, amount=3)
            claim_due(batch=10, lease_seconds=60)
            expire_lease(payment)  # its worker stalled past the lease...
            # ...and delivers its result just as the promoter re-claims the payment.
            zombie, promoter = racers.run(
                partial(execute_batch, pairs=[(payment.id, 1)]), partial(late_then_reclaim, payment.id)
            )
            assert not isinstance(zombie, Exception) and not isinstance(promoter, Exception), (zombie, promoter)
            payment.refresh_from_db()
            assert payment.status == PaymentStatus.EXECUTED
            assert Transfer.objects.filter(key=payment.id).count() == 1
            attempts = dict(ExecutionAttempt.objects.filter(payment=payment).values_list("attempt", "outcome"))
            if payment.attempt == 1:  # the late result got there before the re-claim: it counts
                assert zombie.executed == [payment.id] and promoter == []
                assert attempts == {1: "executed"}
            else:  # re-claimed first: the late result is refused, and the audit says so
                superseded += 1
                assert zombie.stale == [(payment.id, 1)] and zombie.executed == []
                assert attempts == {1: "stale", 2: "executed"}
                stale = ExecutionAttempt.objects.get(payment=payment, attempt=1)
                assert "superseded" in stale.error
    a.refresh_from_db()
    assert a.balance == 10_000 - STALE_ROUNDS * 3
    assert reconcile().ok


def test_concurrent_deposits_and_payments_never_take_a_balance_below_zero():
    a, b = funded_account(balance=0), funded_account()
    for _ in range(4 * FUNDS_ROUNDS):
        due_payment(source=a, target=b, amount=15)
    pairs = claim_due(batch=1000, lease_seconds=600).fresh
    deposited = moved = 0
    refused = 0
    with Racers(6) as racers:
        for round_ in range(FUNDS_ROUNDS):
            mine = pairs[4 * round_:4 * round_ + 4]
            results = racers.run(
                partial(ledger_deposit, key=f"dep-{round_}-1", account_id=a.id, amount=10),
                partial(ledger_deposit, key=f"dep-{round_}-2", account_id=a.id, amount=10),
                partial(execute_batch, pairs=mine[:2]),
                partial(execute_batch, pairs=mine[2:]),
                partial(ledger_transfer, key=f"tr-{round_}-1", debit_account_id=a.id, credit_account_id=b.id,
                        amount=7),
                partial(ledger_transfer, key=f"tr-{round_}-2", debit_account_id=a.id, credit_account_id=b.id,
                        amount=7),
            )
            assert not any(isinstance(r, Exception) for r in results), results
            deposited += 20
            moved += 15 * sum(len(r.executed) for r in results[2:4])
            refused += sum(len(r.failed) for r in results[2:4])
            moved += sum(7 for r in results[4:] if r.outcome == Outcome.APPLIED)
            refused += sum(1 for r in results[4:] if r.outcome == Outcome.INSUFFICIENT_FUNDS)
            a.refresh_from_db()
            assert a.balance >= 0
    assert a.balance == deposited - moved
    assert refused > 0, "the account never ran short: the race did not test the funds check"
    assert reconcile().ok


def debit_without_funds_check(account_id: str, amount: int) -> str:
    """What a buggy service would do: subtract with no funds check of its own."""
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("UPDATE ledger_account SET balance = balance - %s WHERE id = %s", [amount, account_id])
        return "applied"
    except IntegrityError:
        return "refused"


def test_balance_check_constraint_holds_against_concurrent_unchecked_debits():
    account = funded_account(balance=100)
    with Racers(8) as racers:
        for _ in range(25):
            Account.objects.filter(pk=account.id).update(balance=100)
            answers = racers.run(*[partial(debit_without_funds_check, account.id, 30)] * 8)
            account.refresh_from_db()
            assert answers.count("applied") == 3, answers  # 100 holds three debits of 30, never four
            assert answers.count("refused") == 5
            assert account.balance == 10
