"""Recurring payments (payments/series.py): generation, pause, resume, end, update."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from payments.exceptions import PaymentValidationError, RecurringStateError, VersionMismatch
from payments.models import PaymentStatus, RecurringEvent, RecurringPayment, ScheduledPayment
from payments.promoter import claim_due
from payments.series import (
    recurring_create,
    recurring_end,
    recurring_generate_due,
    recurring_pause,
    recurring_resume,
    recurring_update,
)
from tests.concurrency import run_concurrently
from tests.factories import due_payment, funded_account

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

    from payments import series as series_module

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
