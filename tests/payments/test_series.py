"""Recurring payments (recurring/services.py): generation, pause, resume, end, update."""

import logging
import threading
import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from ledger.models import Account, Transfer
from payments import metrics, promoter
from payments.exceptions import PaymentValidationError, RecurringStateError, VersionMismatch
from payments.execution import execute_batch
from payments.models import PaymentEvent, PaymentStatus, RecurringEvent, RecurringPayment, ScheduledPayment
from payments.promoter import claim_due
from payments.services import payment_cancel
from recurring import sql
from recurring.services import (
    recurring_create,
    recurring_end,
    recurring_generate_due,
    recurring_pause,
    recurring_resume,
    recurring_update,
)
from tests.concurrency import Racers, run_concurrently, start_thread
from tests.factories import claimed, due_payment, funded_account

# --- recurring payments -----------------------------------------------------------------

def recurring(source, target, **kwargs):
    kwargs.setdefault("amount", 10)
    kwargs.setdefault("start_at", timezone.now() + timedelta(hours=1))
    kwargs.setdefault("interval", "P1D")
    return recurring_create(payer=source.owner, from_account_id=source.id, to_account_id=target.id, **kwargs)


def occurrences(rec):
    return list(ScheduledPayment.objects.filter(recurring=rec).order_by("occurrence_at"))


@pytest.mark.django_db
def test_create_generates_the_first_occurrence_only():
    a, b = funded_account(), funded_account()
    rec = recurring(a, b)
    assert rec.status == "ACTIVE"
    (first,) = occurrences(rec)
    assert first.occurrence_at == first.execute_at == rec.start_at
    assert rec.next_occurrence_at == rec.start_at + timedelta(days=1)
    # The first occurrence is not due yet: the tick generates nothing more.
    assert recurring_generate_due() == 0


@pytest.mark.django_db
def test_minimum_interval_and_rule_validation():
    a, b = funded_account(), funded_account()
    for kwargs, field in [
        ({"interval": "PT30S"}, "interval"),
        ({"interval": "P1X"}, "interval"),
        ({"interval": "", "cron": "61 * * * *"}, "cron"),
        ({"interval": "P1D", "cron": "0 12 * * *"}, "interval"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"count": 0}, "count"),
    ]:
        with pytest.raises(PaymentValidationError) as err:
            recurring(a, b, **kwargs)
        assert field in err.value.fields, (kwargs, err.value.fields)
    assert not RecurringPayment.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_next_occurrence_is_generated_once_the_previous_is_due(settings):
    settings.DELAYPAY_MIN_RECURRING_INTERVAL = 1
    a, b = funded_account(), funded_account()
    rec = recurring(a, b, start_at=timezone.now() + timedelta(seconds=1), interval="PT1S")
    assert len(occurrences(rec)) == 1
    time.sleep(1.2)
    # Duplicated and concurrent ticks create each occurrence exactly once.
    results = run_concurrently(recurring_generate_due, recurring_generate_due, recurring_generate_due)
    assert sum(results) == 1
    assert recurring_generate_due() == 0
    times = [p.occurrence_at for p in occurrences(rec)]
    assert times[1] - times[0] == timedelta(seconds=1)


@pytest.mark.django_db
def test_count_ends_the_series():
    a, b = funded_account(), funded_account()
    rec = recurring(a, b, interval="P1D", count=1)
    assert rec.status == "ENDED"
    assert len(occurrences(rec)) == 1
    assert RecurringEvent.objects.filter(recurring=rec, kind="ended").exists()


@pytest.mark.django_db(transaction=True)
def test_pause_cancels_pending_and_resume_skips_missed_occurrences(settings):
    settings.DELAYPAY_MIN_RECURRING_INTERVAL = 1
    a, b = funded_account(), funded_account()
    rec = recurring(a, b, start_at=timezone.now() + timedelta(seconds=2), interval="PT1S")
    (pending,) = occurrences(rec)
    paused = recurring_pause(recurring_id=rec.id, actor=a.owner)
    assert paused.status == "PAUSED"
    assert ScheduledPayment.objects.get(pk=pending.id).status == PaymentStatus.CANCELLED
    time.sleep(4.2)
    assert recurring_generate_due() == 0  # nothing while paused
    resumed = recurring_resume(recurring_id=rec.id, actor=a.owner)
    assert resumed.status == "ACTIVE"
    live = [p for p in occurrences(rec) if p.status == PaymentStatus.SCHEDULED]
    assert len(live) == 1 and live[0].execute_at > timezone.now() - timedelta(seconds=1)
    event = RecurringEvent.objects.get(recurring=rec, kind="resumed")
    assert len(event.data["skipped"]) >= 3  # missed while paused: recorded, not paid


@pytest.mark.django_db
def test_end_cancels_pending_and_is_final():
    a, b = funded_account(), funded_account()
    rec = recurring(a, b)
    ended = recurring_end(recurring_id=rec.id, actor=a.owner)
    assert ended.status == "ENDED"
    assert all(p.status == PaymentStatus.CANCELLED for p in occurrences(rec))
    assert recurring_end(recurring_id=rec.id, actor=a.owner).status == "ENDED"  # idempotent
    with pytest.raises(RecurringStateError):
        recurring_pause(recurring_id=rec.id, actor=a.owner)


@pytest.mark.django_db
def test_update_replaces_the_pending_occurrence_under_the_new_terms():
    a, b = funded_account(), funded_account()
    rec = recurring(a, b, amount=10)
    updated = recurring_update(recurring_id=rec.id, actor=a.owner, amount=25, expected_version=rec.version)
    assert updated.version == rec.version + 1
    live = [p for p in occurrences(rec) if p.status == PaymentStatus.SCHEDULED]
    assert [p.amount for p in live] == [25]
    with pytest.raises(VersionMismatch):
        recurring_update(recurring_id=rec.id, actor=a.owner, amount=30, expected_version=rec.version)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"interval": "", "cron": "0 0 30 2 *"}, "cron"), ({"interval": "P5000Y"}, "interval"),
     ({"interval": "P1Y", "count": 10_000}, None)],
    ids=["cron-no-date", "interval-too-long", "count-past-9999"],
)
def test_rules_that_reach_no_or_unrepresentable_dates_never_raise_unexpectedly(kwargs, field):
    a, b = funded_account(), funded_account()
    if field is None:
        rec = recurring(a, b, **kwargs)  # runs out at year 9999: accepted, and no crash
        assert rec.status == "ACTIVE" and rec.last_at is None
        return
    with pytest.raises(PaymentValidationError) as err:
        recurring(a, b, **kwargs)
    assert field in err.value.fields


@pytest.mark.django_db
def test_a_schedule_that_cannot_be_generated_holds_up_neither_the_others_nor_the_claim(caplog):
    a, b = funded_account(balance=100), funded_account()
    long_ago = timezone.now() - timedelta(hours=1)
    # Bad data no service would write (a bug, a hand edit): its rule cannot be evaluated.
    broken = RecurringPayment.objects.create(
        payer=a.owner, from_account=a, to_account=b, amount=1, start_at=long_ago, interval="every day",
        next_occurrence_at=long_ago, last_occurrence_at=long_ago,
    )
    healthy = recurring(a, b, start_at=timezone.now() + timedelta(hours=1))
    RecurringPayment.objects.filter(pk=healthy.pk).update(last_occurrence_at=long_ago)
    due = due_payment(source=a, target=b, amount=5)

    assert recurring_generate_due() == 1
    assert len(occurrences(healthy)) == 2
    assert not occurrences(broken)
    assert RecurringPayment.objects.get(pk=broken.pk).next_occurrence_at == long_ago  # left as it was
    assert "recurring occurrence not generated" in caplog.text
    assert claim_due(batch=10, lease_seconds=60).fresh == [(due.id, 1)]


@pytest.mark.django_db
def test_a_retried_recurring_change_with_the_version_it_was_made_against_is_a_no_op():
    a, b = funded_account(), funded_account()
    rec = recurring(a, b, amount=10)
    v1 = rec.version
    updated = recurring_update(recurring_id=rec.id, actor=a.owner, amount=25, expected_version=v1)
    # The response was lost; the client retries the same request with the same If-Match.
    assert recurring_update(recurring_id=rec.id, actor=a.owner, amount=25, expected_version=v1).version == (
        updated.version
    )
    state = lambda r: (r.status, r.version)  # noqa: E731 - model equality compares only the pk
    paused = recurring_pause(recurring_id=rec.id, actor=a.owner, expected_version=updated.version)
    assert state(recurring_pause(recurring_id=rec.id, actor=a.owner, expected_version=updated.version)) == state(paused)
    resumed = recurring_resume(recurring_id=rec.id, actor=a.owner, expected_version=paused.version)
    assert state(recurring_resume(recurring_id=rec.id, actor=a.owner, expected_version=paused.version)) == (
        state(resumed)
    )
    ended = recurring_end(recurring_id=rec.id, actor=a.owner, expected_version=resumed.version)
    assert state(recurring_end(recurring_id=rec.id, actor=a.owner, expected_version=resumed.version)) == state(ended)
    assert RecurringEvent.objects.filter(recurring=rec).exclude(kind="generated").count() == 5
    # A real change against a stale version is still refused.
    other = recurring(a, b)
    recurring_update(recurring_id=other.id, actor=a.owner, amount=11)
    with pytest.raises(VersionMismatch):
        recurring_pause(recurring_id=other.id, actor=a.owner, expected_version=other.version)
    with pytest.raises(VersionMismatch):
        recurring_end(recurring_id=other.id, actor=a.owner, expected_version=other.version)


@pytest.mark.django_db
def test_ending_a_completed_series_still_cancels_its_pending_last_occurrence():
    a, b = funded_account(), funded_account()
    rec = recurring(a, b, count=1)
    assert rec.status == "ENDED"
    (last,) = occurrences(rec)
    assert last.status == PaymentStatus.SCHEDULED
    recurring_end(recurring_id=rec.id, actor=a.owner)
    assert ScheduledPayment.objects.get(pk=last.pk).status == PaymentStatus.CANCELLED


@pytest.mark.django_db
def test_resume_records_as_skipped_only_what_the_pause_missed():
    a, b = funded_account(), funded_account()
    # Anchored ten minutes ago: the occurrences before creation were never due to be paid.
    rec = recurring(a, b, start_at=timezone.now() - timedelta(minutes=10), interval="PT1M")
    (pending,) = occurrences(rec)
    recurring_pause(recurring_id=rec.id, actor=a.owner)
    recurring_resume(recurring_id=rec.id, actor=a.owner)
    event = RecurringEvent.objects.get(recurring=rec, kind="resumed")
    assert event.data["skipped"] == []  # the cancelled occurrence is still ahead: generated again
    live = [p for p in occurrences(rec) if p.status == PaymentStatus.SCHEDULED]
    assert [p.occurrence_at for p in live] == [pending.occurrence_at]


@pytest.mark.django_db
def test_generation_skips_only_a_duplicate_occurrence_never_another_integrity_error(monkeypatch):
    from django.db import IntegrityError

    from recurring import services as series_module

    a, b = funded_account(), funded_account()
    long_ago = timezone.now() - timedelta(hours=1)
    rec = recurring(a, b, start_at=timezone.now() + timedelta(hours=1))
    RecurringPayment.objects.filter(pk=rec.pk).update(last_occurrence_at=long_ago)
    before = RecurringPayment.objects.get(pk=rec.pk).next_occurrence_at

    def violates_a_check(**kwargs):
        raise IntegrityError("new row violates check constraint")

    monkeypatch.setattr(series_module, "create_payment_row", violates_a_check)
    assert recurring_generate_due() == 0
    # Not mistaken for "already exists": the schedule did not move past the occurrence.
    assert RecurringPayment.objects.get(pk=rec.pk).next_occurrence_at == before


# --- history: a cancelled occurrence stays cancelled (issue 14) --------------------------------


def at_slot(rec, occurrence_at) -> list[ScheduledPayment]:
    return list(ScheduledPayment.objects.filter(recurring=rec, occurrence_at=occurrence_at))


def last_event(rec, kind: str) -> RecurringEvent:
    return RecurringEvent.objects.filter(recurring=rec, kind=kind).latest("id")


def let_fall_due(rec) -> None:
    """Time passes: the occurrence generated ahead is due, so the tick generates the next."""
    RecurringPayment.objects.filter(pk=rec.pk).update(last_occurrence_at=timezone.now() - timedelta(hours=1))


def shift_into_the_past(rec, by: timedelta) -> None:
    """Time passes by ``by``: the series and its occurrences move that much earlier."""
    RecurringPayment.objects.filter(pk=rec.pk).update(
        start_at=F("start_at") - by, last_occurrence_at=F("last_occurrence_at") - by,
        next_occurrence_at=F("next_occurrence_at") - by,
    )
    ScheduledPayment.objects.filter(recurring=rec, status=PaymentStatus.SCHEDULED).update(
        execute_at=F("execute_at") - by, occurrence_at=F("occurrence_at") - by,
        requested_execute_at=F("requested_execute_at") - by,
    )


@pytest.mark.django_db
def test_an_occurrence_cancelled_on_its_own_stays_cancelled_when_the_amount_changes():
    a, b = funded_account(), funded_account()
    rec = recurring(a, b, amount=10)
    (x,) = occurrences(rec)
    payment_cancel(payment_id=x.id, actor=a.owner)  # DELETE /payments/X
    updated = recurring_update(recurring_id=rec.id, actor=a.owner, amount=25)
    assert [p.id for p in at_slot(rec, x.occurrence_at)] == [x.id]  # not generated again
    assert ScheduledPayment.objects.get(pk=x.id).status == PaymentStatus.CANCELLED
    assert updated.next_occurrence_at == x.occurrence_at + timedelta(days=1)
    event = last_event(rec, "updated")
    assert event.data["kept_cancelled"] == [{"payment_id": x.id, "occurrence_at": x.occurrence_at.isoformat()}]
    assert (event.data["cancelled"], event.data["next_payment_id"]) == ([], None)
    # The series goes on under the new amount from the occurrence after it.
    let_fall_due(rec)
    assert recurring_generate_due() == 1
    (after,) = at_slot(rec, x.occurrence_at + timedelta(days=1))
    assert (after.status, after.amount) == (PaymentStatus.SCHEDULED, 25)


@pytest.mark.django_db
def test_an_occurrence_cancelled_on_its_own_stays_cancelled_across_pause_and_resume():
    a, b = funded_account(), funded_account()
    rec = recurring(a, b)
    (x,) = occurrences(rec)
    payment_cancel(payment_id=x.id, actor=a.owner)
    paused = recurring_pause(recurring_id=rec.id, actor=a.owner)
    assert last_event(rec, "paused").data["cancelled"] == []  # nothing left for the pause to cancel
    recurring_resume(recurring_id=rec.id, actor=a.owner, expected_version=paused.version)
    assert [p.id for p in at_slot(rec, x.occurrence_at)] == [x.id]
    assert not ScheduledPayment.objects.filter(recurring=rec, status=PaymentStatus.SCHEDULED).exists()
    assert last_event(rec, "resumed").data["kept_cancelled"] == [
        {"payment_id": x.id, "occurrence_at": x.occurrence_at.isoformat()}
    ]
    # Paused and resumed once more, and changed: still never generated again.
    recurring_pause(recurring_id=rec.id, actor=a.owner)
    recurring_resume(recurring_id=rec.id, actor=a.owner)
    recurring_update(recurring_id=rec.id, actor=a.owner, amount=11)
    assert [p.id for p in at_slot(rec, x.occurrence_at)] == [x.id]


@pytest.mark.django_db
def test_an_occurrence_the_series_cancelled_comes_back_and_one_cancelled_on_its_own_does_not():
    a, b = funded_account(), funded_account()
    rec = recurring(a, b)
    (x,) = occurrences(rec)
    recurring_pause(recurring_id=rec.id, actor=a.owner)  # cancelled by the series
    assert ScheduledPayment.objects.get(pk=x.id).cancelled_by_series
    recurring_resume(recurring_id=rec.id, actor=a.owner)
    (withdrawn, again) = sorted(at_slot(rec, x.occurrence_at), key=lambda p: p.created_at)
    assert (withdrawn.id, withdrawn.status, again.status) == (x.id, "CANCELLED", "SCHEDULED")
    payment_cancel(payment_id=again.id, actor=a.owner)  # now cancelled on its own
    recurring_pause(recurring_id=rec.id, actor=a.owner)
    recurring_resume(recurring_id=rec.id, actor=a.owner)
    assert len(at_slot(rec, x.occurrence_at)) == 2
    assert not ScheduledPayment.objects.get(pk=again.id).cancelled_by_series
    event = PaymentEvent.objects.get(payment_id=x.id, kind="cancelled")
    assert event.data == {"by_series": "paused", "recurring_id": rec.id}


@pytest.mark.django_db
def test_a_change_leaves_an_occurrence_that_is_due_and_unclaimed_to_run_exactly_once():
    a, b = funded_account(balance=100), funded_account()
    rec = recurring(a, b, amount=10)
    (x,) = occurrences(rec)
    shift_into_the_past(rec, timedelta(hours=2))  # X fell due an hour ago; no tick claimed it yet
    x.refresh_from_db()
    updated = recurring_update(recurring_id=rec.id, actor=a.owner, amount=25)
    assert ScheduledPayment.objects.get(pk=x.id).status == PaymentStatus.SCHEDULED  # not cancelled
    event = last_event(rec, "updated")
    assert (event.data["left_to_run"], event.data["cancelled"]) == ([x.id], [])
    # The replacement is the first occurrence after now, under the new amount.
    (following,) = at_slot(rec, x.occurrence_at + timedelta(days=1))
    assert (following.amount, event.data["next_payment_id"]) == (25, following.id)
    assert updated.last_occurrence_at == following.occurrence_at
    # X runs under the terms it was generated with, once.
    assert execute_batch(pairs=claimed(x)).executed == [x.id]
    assert ScheduledPayment.objects.get(pk=x.id).status == PaymentStatus.EXECUTED
    assert list(Transfer.objects.filter(key=x.id).values_list("amount", flat=True)) == [10]
    assert recurring_generate_due() == 0
    assert claimed(x) == []  # nothing left to claim for X
    assert [p.id for p in at_slot(rec, x.occurrence_at)] == [x.id]


@pytest.mark.django_db
def test_a_change_replaces_an_occurrence_not_yet_due_and_frees_its_slot():
    a, b = funded_account(), funded_account()
    rec = recurring(a, b, amount=10)
    (x,) = occurrences(rec)
    recurring_update(recurring_id=rec.id, actor=a.owner, amount=25)
    replaced = ScheduledPayment.objects.get(pk=x.id)
    assert (replaced.status, replaced.cancelled_by_series) == (PaymentStatus.CANCELLED, True)
    (again,) = [p for p in at_slot(rec, x.occurrence_at) if p.status == PaymentStatus.SCHEDULED]
    assert again.amount == 25
    assert last_event(rec, "updated").data["cancelled"] == [x.id]


@pytest.mark.django_db(transaction=True)
def test_a_change_racing_the_claim_never_loses_nor_repeats_the_due_occurrence():
    a, b = funded_account(balance=10_000), funded_account()
    with Racers(2) as racers:
        for round_ in range(8):
            rec = recurring(a, b, amount=10)
            (x,) = occurrences(rec)
            shift_into_the_past(rec, timedelta(hours=2))
            x.refresh_from_db()
            claim, update = racers.run(
                lambda: claim_due(batch=100, lease_seconds=60),
                lambda rec=rec, n=round_: recurring_update(recurring_id=rec.id, actor=a.owner, amount=20 + n),
            )
            assert not isinstance(claim, Exception) and not isinstance(update, Exception), (claim, update)
            assert ScheduledPayment.objects.get(pk=x.id).status == PaymentStatus.EXECUTING  # claimed, whoever won
            execute_batch(pairs=[pair for pair in claim.fresh if pair[0] == x.id])
            assert Transfer.objects.filter(key=x.id).count() == 1
            assert len(at_slot(rec, x.occurrence_at)) == 1


# --- the tick's generation: bounded transactions that cannot abort it (issue 14) -------------


def failures(reason: str) -> float:
    return metrics.recurring_generation_failures_total.labels(reason=reason)._value.get()


@pytest.mark.django_db(transaction=True)
def test_a_series_whose_generation_waits_on_a_lock_does_not_stop_the_others(caplog):
    a, b = funded_account(), funded_account()
    c, d = funded_account(), funded_account()
    blocked, healthy = recurring(a, b), recurring(c, d)
    let_fall_due(blocked)
    let_fall_due(healthy)
    before = failures("lock_timeout")
    locked, release = threading.Event(), threading.Event()

    def hold_the_source_account():
        # A deposit, say: the source account locked FOR UPDATE, which the occurrence's
        # foreign key (KEY SHARE) must wait for.
        with transaction.atomic():
            Account.objects.select_for_update().get(pk=a.pk)
            locked.set()
            release.wait(timeout=30)

    join = start_thread(hold_the_source_account)
    try:
        assert locked.wait(timeout=10)
        with caplog.at_level(logging.WARNING, logger="recurring.services"):
            assert recurring_generate_due() == 1  # the healthy one, in the same tick
    finally:
        release.set()
        join()
    assert len(occurrences(healthy)) == 2 and len(occurrences(blocked)) == 1
    assert failures("lock_timeout") == before + 1
    (record,) = [r for r in caplog.records if r.getMessage() == "recurring occurrence not generated"]
    assert (record.recurring_id, record.reason, record.sqlstate) == (blocked.id, "lock_timeout", "55P03")
    assert not record.exc_info  # the error's text (it may quote the row) is not logged
    # Left as it was, it is generated at the next tick.
    assert recurring_generate_due() == 1
    assert len(occurrences(blocked)) == 2


@pytest.mark.django_db
def test_a_database_error_in_the_generation_never_aborts_the_tick(monkeypatch, caplog):
    a, b = funded_account(balance=100), funded_account()
    rec = recurring(a, b)
    let_fall_due(rec)
    due = due_payment(source=a, target=b, amount=5)
    monkeypatch.setattr(sql, "RECURRING_DUE", "SELECT no_such_column FROM payments_recurringpayment")
    before = failures("database")
    published, tick = [], promoter.claim_and_publish
    monkeypatch.setattr(promoter, "claim_and_publish", lambda **kwargs: tick(publish=published.extend, **kwargs))
    with caplog.at_level(logging.WARNING, logger="recurring.services"):
        result = promoter.run_tick()
    assert result.claimed == 1 and published == [[(due.id, 1)]]  # the claim went ahead
    assert failures("database") == before + 1
    assert "recurring occurrence not generated" in caplog.text
    assert len(occurrences(rec)) == 1  # tried again next tick


@pytest.mark.django_db
def test_generation_takes_bounded_batches_and_each_series_once_per_tick():
    a, b = funded_account(), funded_account()
    recs = [recurring(a, b) for _ in range(5)]
    for rec in recs:
        let_fall_due(rec)
    # A series still behind after its generation (its next occurrence is due as well)
    # waits for the next tick: one generation per series per tick.
    behind = recurring(a, b, start_at=timezone.now() - timedelta(hours=5), interval="PT1H")
    RecurringPayment.objects.filter(pk=behind.pk).update(
        last_occurrence_at=timezone.now() - timedelta(hours=3), next_occurrence_at=timezone.now() - timedelta(hours=2)
    )
    assert recurring_generate_due(batch=2) == 6
    assert recurring_generate_due(batch=2, limit=1) == 1
    assert all(len(occurrences(rec)) == 2 for rec in recs)


@pytest.mark.django_db
def test_generation_stops_at_its_time_budget_and_leaves_the_rest_for_the_next_tick():
    a, b = funded_account(), funded_account()
    rec = recurring(a, b)
    let_fall_due(rec)
    assert recurring_generate_due(budget_seconds=0) == 0
    assert len(occurrences(rec)) == 1
    assert recurring_generate_due() == 1
