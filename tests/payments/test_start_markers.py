"""Start markers (issue 17; sql.MARK_STARTED, docs/decisions/0008-start-markers-off-the-row.md).

A worker records that it started a claimed attempt in a narrow unlogged table instead
of writing a new version of the payment row. The try is counted in ``tries`` when the
attempt ends (the CAS) or when its lease expires (the claim), and seen by the executor's
budget check before that. What must hold: a try is counted exactly once per started
claim, never for a claim no worker started, never twice for a redelivered message or for
a marker left behind; the payment row is not written by the start; the purge keeps every
marker an attempt still needs.
"""

import pytest
from django.db import connection

from payments import execution
from payments.execution import execute_batch, record_error
from payments.models import PaymentStatus, ScheduledPayment
from payments.promoter import claim_due
from tests.factories import claimed, due_payment, expire_lease, funded_account


def markers() -> set[tuple[str, int]]:
    with connection.cursor() as cur:
        cur.execute("SELECT payment_id, attempt FROM payments_startmarker")
        return set(cur.fetchall())


def row_version(payment) -> str:
    with connection.cursor() as cur:
        cur.execute("SELECT ctid::text || '/' || xmin::text FROM payments_scheduledpayment WHERE id = %s", [payment.id])
        return cur.fetchone()[0]


def a_payment(balance: int = 100):
    source, target = funded_account(balance=balance), funded_account()
    return due_payment(source=source, target=target, amount=1)


@pytest.mark.django_db
def test_the_start_writes_a_marker_and_leaves_the_payment_row_alone():
    payment = a_payment()
    (pair,) = claimed(payment)
    before = row_version(payment)
    assert execution.mark_started([pair]) == 1
    assert row_version(payment) == before  # no new version of the row, no index entries
    assert markers() == {pair}
    with connection.cursor() as cur:
        cur.execute("SELECT relpersistence FROM pg_class WHERE relname = 'payments_startmarker'")
        assert cur.fetchone() == ("u",)  # unlogged: no WAL


@pytest.mark.django_db
def test_a_worker_that_died_after_the_start_spent_one_try_counted_by_the_reclaim():
    payment = a_payment()
    (pair,) = claimed(payment)
    execution.mark_started([pair])  # the worker starts it, then dies
    expire_lease(payment)
    claim = claim_due(batch=10, lease_seconds=60)
    assert claim.reclaimed == [(payment.id, 2)]
    assert claim.started == {(payment.id, 2)}  # sent alone: it may be what killed its worker
    payment.refresh_from_db()
    assert (payment.tries, payment.tried_attempt) == (1, 1)
    # The next worker's start is its second try, counted when that attempt ends.
    execution.mark_started([(payment.id, 2)])
    assert execute_batch(pairs=[(payment.id, 2)]).executed == [payment.id]
    payment.refresh_from_db()
    assert (payment.status, payment.tries, payment.tried_attempt) == (PaymentStatus.EXECUTED, 2, 2)


@pytest.mark.django_db
def test_a_claim_no_worker_started_costs_no_try_when_it_expires():
    payment = a_payment()
    claimed(payment)
    expire_lease(payment)
    claim = claim_due(batch=10, lease_seconds=60)
    assert claim.reclaimed == [(payment.id, 2)] and not claim.started  # lost before any worker saw it
    payment.refresh_from_db()
    assert (payment.tries, payment.tried_attempt) == (0, None)


@pytest.mark.django_db
def test_the_budget_check_sees_the_current_start_before_it_is_counted(settings):
    settings.DELAYPAY_MAX_ATTEMPTS = 1
    payment = a_payment()
    (pair,) = claimed(payment)
    execution.mark_started([pair])
    expire_lease(payment)
    (pair,) = claimed(payment)  # the reclaim counted the first start: tries 1
    execution.mark_started([pair])  # the second start: 2 > 1, parked before any money moves
    assert execute_batch(pairs=[pair]).parked == {payment.id: "attempts_exhausted"}
    payment.refresh_from_db()
    assert (payment.status, payment.tries) == (PaymentStatus.NEEDS_REVIEW, 2)


@pytest.mark.django_db
def test_a_marker_left_behind_by_an_ended_attempt_is_never_counted_again():
    payment = a_payment()
    (pair,) = claimed(payment)
    execution.mark_started([pair])
    record_error(pair=pair, error="boom")  # back to SCHEDULED for a retry: the try is counted here
    payment.refresh_from_db()
    assert (payment.status, payment.tries) == (PaymentStatus.SCHEDULED, 1)
    assert pair in markers()  # not purged yet
    ScheduledPayment.objects.filter(pk=payment.pk).update(next_attempt_at=None)  # due again at once
    (pair2,) = claimed(payment)  # a fresh claim of the same row: nothing to fold
    payment.refresh_from_db()
    assert payment.tries == 1
    # Its own attempt, started and finished, is the second try.
    execution.mark_started([pair2])
    assert execute_batch(pairs=[pair2]).executed == [payment.id]
    payment.refresh_from_db()
    assert payment.tries == 2


@pytest.mark.django_db
def test_the_purge_keeps_the_markers_attempts_still_need_and_takes_the_rest():
    running, finished, reclaimed = a_payment(), a_payment(), a_payment()
    pairs = claimed(running, finished, reclaimed)
    execution.mark_started(pairs)
    stale = (running.id, 99)  # a message of an attempt that is not current
    execution.mark_started([stale])
    execute_batch(pairs=[p for p in pairs if p[0] == finished.id])
    expire_lease(reclaimed)
    claim_due(batch=10, lease_seconds=60)  # counted, and now at attempt 2
    assert execution.purge_start_markers(batch=1) == 3  # batches of one, until none is left
    assert markers() == {(running.id, 1)}
    execute_batch(pairs=[(running.id, 1)])
    running.refresh_from_db()
    assert running.tries == 1  # the kept marker was still needed
    assert execution.purge_start_markers() == 1
    assert markers() == set()
