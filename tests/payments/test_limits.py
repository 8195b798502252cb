"""Payments into system accounts, and the per-user limits (payments/limits.py), through
the services: what counts, what is refused, what is never refused, and the races."""

import zoneinfo
from datetime import UTC, date, datetime, time, timedelta
from functools import partial

import pytest
from django.db import transaction
from django.utils import timezone

from ledger.models import ISSUANCE_ACCOUNT_ID, Account
from payments import limits
from payments.exceptions import (
    ActiveSeriesLimit,
    DailyOutflowLimit,
    PaymentValidationError,
    PendingPaymentsLimit,
    SystemAccountPayee,
)
from payments.execution import execute_batch
from payments.models import IdempotencyKey, PaymentStatus, RecurringPayment, RecurringStatus, ScheduledPayment
from payments.promoter import claim_due
from payments.rules import Rule
from payments.services import payment_cancel, payment_schedule, payment_update
from recurring.services import (
    recurring_create,
    recurring_end,
    recurring_generate_due,
    recurring_pause,
    recurring_update,
)
from tests.concurrency import Racers, start_thread, wait_for_lock_waiters
from tests.factories import UserFactory, due_payment, funded_account

DAY = (timezone.now() + timedelta(days=3)).date()  # a UTC day well ahead, whatever the hour now
NOON = datetime.combine(DAY, time(12), tzinfo=UTC)


def schedule(source, target, *, amount: int = 10, execute_at: datetime = NOON, **kwargs):
    return payment_schedule(
        payer=source.owner, from_account_id=source.id, to_account_id=target.id, amount=amount,
        execute_at=execute_at, **kwargs,
    )


def series(source, target, *, amount: int = 10, interval: str = "P1D", **kwargs):
    kwargs.setdefault("start_at", NOON)
    return recurring_create(
        payer=source.owner, from_account_id=source.id, to_account_id=target.id, amount=amount, interval=interval,
        **kwargs,
    )


@pytest.fixture
def caps(settings):
    """Set the limits for one test: ``caps(pending=3)``; the others are off."""

    def set_caps(*, pending: int = 0, series: int = 0, daily: int = 0) -> None:
        settings.DELAYPAY_MAX_PENDING_PAYMENTS_PER_USER = pending
        settings.DELAYPAY_MAX_ACTIVE_SERIES_PER_USER = series
        settings.DELAYPAY_MAX_DAILY_OUTFLOW_PER_USER = daily

    return set_caps


# --- System accounts ------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_payment_into_the_issuance_account_is_refused_and_creates_nothing():
    a = funded_account(balance=100)
    issuance = Account.objects.get(pk=ISSUANCE_ACCOUNT_ID)
    with pytest.raises(SystemAccountPayee) as err:
        schedule(a, issuance)
    assert err.value.code == "system_account"
    assert not ScheduledPayment.objects.exists()


@pytest.mark.django_db
def test_a_payment_into_any_system_account_is_refused_with_every_limit_off(caps):
    caps()  # the payee rule is not a limit: it holds with every limit off
    a = funded_account(balance=100)
    fees = Account.objects.create(id="acc_fees", name="Fees", kind=Account.Kind.SYSTEM)
    with pytest.raises(SystemAccountPayee):
        schedule(a, fees)


@pytest.mark.django_db
def test_a_recurring_payment_into_the_issuance_account_is_refused_and_creates_nothing():
    a = funded_account(balance=100)
    with pytest.raises(SystemAccountPayee):
        series(a, Account.objects.get(pk=ISSUANCE_ACCOUNT_ID))
    assert not RecurringPayment.objects.exists()
    assert not ScheduledPayment.objects.exists()


@pytest.mark.django_db
def test_invalid_input_is_reported_before_the_system_payee():
    a = funded_account(balance=100)
    with pytest.raises(PaymentValidationError) as err:
        schedule(a, Account.objects.get(pk=ISSUANCE_ACCOUNT_ID), amount=0)
    assert set(err.value.fields) == {"amount"}


# --- Pending payments -----------------------------------------------------------------------


@pytest.mark.django_db
def test_pending_payments_are_capped_per_user_and_a_cancel_makes_room(caps):
    caps(pending=3)
    a, b = funded_account(), funded_account()
    made = [schedule(a, b) for _ in range(3)]
    with pytest.raises(PendingPaymentsLimit) as err:
        schedule(a, b)
    assert err.value.code == "limit_pending_payments"
    assert err.value.extra == {"limit": 3, "usage": 3}
    assert "3 scheduled payments" in err.value.detail and "DELAYPAY_MAX_PENDING_PAYMENTS_PER_USER" in err.value.detail
    assert ScheduledPayment.objects.filter(payer=a.owner).count() == 3
    # Another user has room of their own.
    schedule(funded_account(), b)
    payment_cancel(payment_id=made[0].id, actor=a.owner)
    schedule(a, b)


@pytest.mark.django_db
def test_finished_payments_and_occurrences_do_not_count_as_pending(caps):
    a, b = funded_account(balance=100), funded_account()
    executed = due_payment(source=a, target=b, amount=1)
    claim_due(batch=10, lease_seconds=60)
    execute_batch(pairs=[(executed.id, 1)])
    assert ScheduledPayment.objects.get(pk=executed.id).status == PaymentStatus.EXECUTED
    series(a, b)  # its first occurrence is SCHEDULED
    assert limits.pending_payments(payer_id=a.owner_id) == 0
    caps(pending=1)
    schedule(a, b)
    with pytest.raises(PendingPaymentsLimit):
        schedule(a, b)


@pytest.mark.django_db
def test_overdue_and_retrying_payments_count_as_pending_and_claimed_ones_do_not(caps):
    a, b = funded_account(balance=100), funded_account()
    overdue = due_payment(source=a, target=b, amount=1, seconds_ago=3 * 86400)
    due_payment(source=a, target=b, amount=1, seconds_ago=10)
    ScheduledPayment.objects.filter(pk=overdue.pk).update(next_attempt_at=timezone.now() + timedelta(minutes=5))
    assert limits.pending_payments(payer_id=a.owner_id) == 2
    caps(pending=2)
    with pytest.raises(PendingPaymentsLimit):
        schedule(a, b)
    claim_due(batch=10, lease_seconds=60)  # the one not waiting for its retry is now EXECUTING
    assert limits.pending_payments(payer_id=a.owner_id) == 1
    schedule(a, b)


@pytest.mark.django_db
def test_a_limit_of_zero_is_no_limit(caps):
    caps()
    a, b = funded_account(), funded_account()
    for _ in range(5):
        schedule(a, b, amount=10**12)
    for _ in range(3):
        series(a, b, amount=10**12, interval="PT1M")


# --- Active series --------------------------------------------------------------------------


@pytest.mark.django_db
def test_active_and_paused_series_are_capped_and_ending_one_makes_room(caps):
    caps(series=2)
    a, b = funded_account(), funded_account()
    first = series(a, b)
    recurring_pause(recurring_id=series(a, b).id, actor=a.owner)
    with pytest.raises(ActiveSeriesLimit) as err:
        series(a, b)
    assert err.value.code == "limit_active_series"
    assert err.value.extra == {"limit": 2, "usage": 2}
    assert RecurringPayment.objects.filter(payer=a.owner).count() == 2
    recurring_end(recurring_id=first.id, actor=a.owner)
    series(a, b)


@pytest.mark.django_db
def test_changing_a_series_at_the_cap_is_not_refused(caps):
    caps(series=1)
    a, b = funded_account(), funded_account()
    rec = series(a, b)
    assert recurring_update(recurring_id=rec.id, actor=a.owner, amount=11).amount == 11


# --- Daily outflow --------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_units_due_on_one_utc_day_are_capped(caps):
    caps(daily=100)
    a, b = funded_account(), funded_account()
    schedule(a, b, amount=60)
    schedule(a, b, amount=40, execute_at=NOON + timedelta(hours=11, minutes=59))
    with pytest.raises(DailyOutflowLimit) as err:
        schedule(a, b, amount=1, execute_at=NOON - timedelta(hours=12))  # 00:00, the same day
    assert err.value.code == "limit_daily_outflow"
    assert err.value.extra == {"limit": 100, "usage": 100, "requested": 1, "day": DAY.isoformat()}
    assert DAY.isoformat() in err.value.detail and "DELAYPAY_MAX_DAILY_OUTFLOW_PER_USER" in err.value.detail
    # The next day, and another user, have room of their own.
    schedule(a, b, amount=100, execute_at=NOON + timedelta(hours=12))
    schedule(funded_account(), b, amount=100)


@pytest.mark.django_db
def test_cancelled_and_failed_payments_free_their_day_and_executed_ones_count(caps):
    a, b = funded_account(balance=5), funded_account()
    cancelled = schedule(a, b, amount=70)
    payment_cancel(payment_id=cancelled.id, actor=a.owner)
    assert limits.outflow_on(payer_id=a.owner_id, day=DAY) == 0
    executed, failed = due_payment(source=a, target=b, amount=5), due_payment(source=a, target=b, amount=50)
    claim_due(batch=10, lease_seconds=60)
    execute_batch(pairs=[(executed.id, 1), (failed.id, 1)])
    assert ScheduledPayment.objects.get(pk=failed.id).status == PaymentStatus.FAILED
    assert limits.outflow_on(payer_id=a.owner_id, day=limits.utc_day(executed.execute_at)) == 5


@pytest.mark.django_db
def test_a_jittered_payment_is_checked_on_every_day_it_may_fall_on(caps):
    caps(daily=100)
    a, b = funded_account(), funded_account()
    schedule(a, b, amount=100, execute_at=NOON + timedelta(hours=12))  # the next day is full
    just_before_midnight = NOON + timedelta(hours=11, minutes=50)
    with pytest.raises(DailyOutflowLimit) as err:
        schedule(a, b, amount=1, execute_at=just_before_midnight, jitter_seconds=3600)
    assert err.value.extra["day"] == (DAY + timedelta(days=1)).isoformat()
    schedule(a, b, amount=1, execute_at=just_before_midnight, jitter_seconds=60)


@pytest.mark.django_db
def test_a_change_that_adds_to_a_full_day_is_refused_and_one_that_adds_nothing_is_not(caps):
    caps(daily=100)
    a, b = funded_account(), funded_account()
    payment = schedule(a, b, amount=60)
    schedule(a, b, amount=30)
    with pytest.raises(DailyOutflowLimit) as err:
        payment_update(payment_id=payment.id, actor=a.owner, amount=71)
    assert err.value.extra == {"limit": 100, "usage": 30, "requested": 71, "day": DAY.isoformat()}
    assert payment_update(payment_id=payment.id, actor=a.owner, amount=70).amount == 70
    # Moving it to a day that has no room is refused; to an empty one it is not.
    schedule(a, b, amount=50, execute_at=NOON + timedelta(days=1))
    with pytest.raises(DailyOutflowLimit):
        payment_update(payment_id=payment.id, actor=a.owner, execute_at=NOON + timedelta(days=1))
    moved = payment_update(payment_id=payment.id, actor=a.owner, execute_at=NOON + timedelta(days=2))
    assert limits.utc_day(moved.execute_at) == DAY + timedelta(days=2)
    # With the cap lowered under what is due, a smaller amount on the same day still goes through.
    caps(daily=10)
    assert payment_update(payment_id=payment.id, actor=a.owner, amount=69).amount == 69
    assert payment_update(payment_id=payment.id, actor=a.owner, execute_at=NOON + timedelta(days=2, hours=1))


@pytest.mark.django_db
def test_a_series_counts_at_its_busiest_day_on_every_day(caps):
    caps(daily=100)
    a, b = funded_account(), funded_account()
    series(a, b, amount=30, interval="P1W")
    assert limits.series_reserved(payer_id=a.owner_id) == 30
    other_day = NOON + timedelta(days=2)  # a day the weekly series does not run
    with pytest.raises(DailyOutflowLimit) as err:
        schedule(a, b, amount=71, execute_at=other_day)
    assert err.value.extra["usage"] == 30
    schedule(a, b, amount=70, execute_at=other_day)


@pytest.mark.django_db
def test_creating_a_series_is_checked_against_the_busiest_day(caps):
    caps(daily=1000)
    a, b = funded_account(), funded_account()
    schedule(a, b, amount=500, execute_at=NOON + timedelta(days=5))
    schedule(a, b, amount=100)
    with pytest.raises(DailyOutflowLimit) as err:
        series(a, b, amount=21, interval="PT1H")  # 24 a day: 504
    assert err.value.extra == {
        "limit": 1000, "usage": 500, "requested": 504, "day": (DAY + timedelta(days=5)).isoformat()
    }
    assert not RecurringPayment.objects.exists()
    series(a, b, amount=20, interval="PT1H")  # 480
    with pytest.raises(DailyOutflowLimit) as err:
        series(a, b, amount=21, interval="P1D")
    assert err.value.extra["usage"] == 980


@pytest.mark.django_db
def test_changing_a_series_is_checked_only_when_it_takes_out_more(caps):
    caps(daily=100)
    a, b = funded_account(), funded_account()
    rec = series(a, b, amount=40)
    schedule(a, b, amount=50)
    with pytest.raises(DailyOutflowLimit) as err:
        recurring_update(recurring_id=rec.id, actor=a.owner, amount=51)
    assert err.value.extra["usage"] == 50 and err.value.extra["requested"] == 51
    assert recurring_update(recurring_id=rec.id, actor=a.owner, amount=50).amount == 50
    with pytest.raises(DailyOutflowLimit):
        recurring_update(recurring_id=rec.id, actor=a.owner, interval="PT12H")  # twice a day: 100
    caps(daily=10)  # lowered under what the series already takes: a smaller amount is still fine
    assert recurring_update(recurring_id=rec.id, actor=a.owner, amount=45).amount == 45


@pytest.mark.django_db
def test_an_occurrence_counts_only_by_what_it_exceeds_its_series_amount(caps):
    caps(daily=100)
    a, b = funded_account(), funded_account()
    rec = series(a, b, amount=40)
    (occurrence,) = ScheduledPayment.objects.filter(recurring=rec)
    assert limits.outflow_on(payer_id=a.owner_id, day=DAY) == 40  # the reservation, not twice
    schedule(a, b, amount=50)
    assert payment_update(payment_id=occurrence.id, actor=a.owner, amount=50).amount == 50  # 10 over its series
    with pytest.raises(DailyOutflowLimit) as err:
        payment_update(payment_id=occurrence.id, actor=a.owner, amount=51)
    assert err.value.extra["usage"] == 90 and err.value.extra["requested"] == 11
    # Once its series has ended (as after an end that found it already claimed), nothing
    # reserves for it any more: it counts in full.
    RecurringPayment.objects.filter(pk=rec.pk).update(status=RecurringStatus.ENDED)
    assert limits.outflow_on(payer_id=a.owner_id, day=DAY) == 100


@pytest.mark.django_db
def test_generation_never_checks_a_limit(caps):
    a, b = funded_account(), funded_account()
    rec = series(a, b, amount=40, start_at=timezone.now() + timedelta(minutes=1), interval="PT1M")
    caps(pending=1, series=1, daily=1)  # far under what the series takes
    RecurringPayment.objects.filter(pk=rec.pk).update(last_occurrence_at=timezone.now() - timedelta(seconds=1))
    assert recurring_generate_due() == 1
    assert ScheduledPayment.objects.filter(recurring=rec).count() == 2


@pytest.mark.django_db
def test_a_paused_series_keeps_its_reservation_and_resumes_without_a_check(caps):
    from recurring.services import recurring_resume

    caps(daily=100, series=1)
    a, b = funded_account(), funded_account()
    rec = series(a, b, amount=60)
    recurring_pause(recurring_id=rec.id, actor=a.owner)
    with pytest.raises(DailyOutflowLimit):
        schedule(a, b, amount=41)
    schedule(a, b, amount=40)
    assert recurring_resume(recurring_id=rec.id, actor=a.owner).status == RecurringStatus.ACTIVE


@pytest.mark.parametrize(
    ("rule", "peak"),
    [
        (Rule(NOON, interval="PT1H"), 24),
        (Rule(NOON, interval="PT7H"), 4),
        (Rule(NOON, interval="PT25H"), 1),
        (Rule(NOON, interval="P1D"), 1),
        (Rule(NOON, interval="P1W"), 1),
        (Rule(NOON, interval="P1M"), 1),
        (Rule(NOON, cron="0 9,17 * * MON-FRI"), 2),
        (Rule(NOON, cron="*/5 * * * *"), 288),
        (Rule(NOON, cron="*/5 9-17 * * *"), 108),
        # Every day at 01:30 in Berlin is 00:30 UTC in winter and 23:30 UTC the day before in
        # summer: the day the clocks go forward holds two of them.
        (Rule(datetime(2026, 1, 5, 0, 30, tzinfo=UTC), interval="P1D", timezone="Europe/Berlin"), 2),
        (Rule(datetime(2026, 1, 5, 0, 30, tzinfo=UTC), cron="30 1 * * *", timezone="Europe/Berlin"), 2),
        (Rule(datetime(2026, 1, 5, 0, 30, tzinfo=UTC), cron="30 1 * * *"), 1),
        (Rule(NOON, cron="*/10 * * * *", timezone="Europe/Berlin"), 144),
    ],
    ids=lambda v: str(v) if isinstance(v, int) else f"{v.interval or v.cron} {v.timezone}",
)
def test_a_series_busiest_utc_day(rule, peak):
    assert limits.series_daily_peak(rule) == peak


@pytest.mark.parametrize("timezone", ["UTC", "Etc/UTC", "Etc/GMT+12", "Etc/GMT-14"])
@pytest.mark.parametrize("interval", ["P1D", "P3D", "P1W", "P1M", "P1Y", "P1DT1H", "P1MT30M"])
def test_a_calendar_interval_on_a_fixed_offset_holds_one_a_day_as_its_occurrences_say(interval, timezone):
    rule = Rule(datetime(2026, 3, 28, 23, 59, tzinfo=UTC), interval=interval, timezone=timezone)
    assert limits.series_daily_peak(rule) == limits.sampled_peak(rule) == 1


def test_the_zones_taken_as_fixed_offsets_never_change_their_offset():
    fixed = [name for name in sorted(zoneinfo.available_timezones()) if limits.fixed_offset(name)]
    assert "UTC" in fixed and "Etc/GMT+5" in fixed and "Europe/Berlin" not in fixed
    instants = [datetime(year, month, 1, tzinfo=UTC) for year in range(1970, 2100, 3) for month in (1, 4, 7, 10)]
    for name in fixed:
        zone = zoneinfo.ZoneInfo(name)
        assert len({moment.astimezone(zone).utcoffset() for moment in instants}) == 1, name


# --- Races: two real connections at the cap -------------------------------------------------


def outcome(call):
    try:
        call()
        return "ok"
    except (PendingPaymentsLimit, ActiveSeriesLimit, DailyOutflowLimit) as exc:
        return exc.code


@pytest.mark.django_db(transaction=True)
def test_two_schedules_racing_for_the_last_pending_slot_let_exactly_one_through(caps):
    caps(pending=2)
    a, b = funded_account(), funded_account()
    rounds = 30
    with Racers(2) as racers:
        for _ in range(rounds):
            ScheduledPayment.objects.filter(payer=a.owner, status=PaymentStatus.SCHEDULED).update(
                status=PaymentStatus.CANCELLED, cancelled_at=timezone.now()
            )
            schedule(a, b)
            results = racers.run(partial(outcome, partial(schedule, a, b)), partial(outcome, partial(schedule, a, b)))
            assert sorted(results) == ["limit_pending_payments", "ok"], results
            assert limits.pending_payments(payer_id=a.owner_id) == 2


@pytest.mark.django_db(transaction=True)
def test_two_schedules_racing_for_the_rest_of_a_day_let_exactly_one_through(caps):
    caps(daily=100)
    a, b = funded_account(), funded_account()
    with Racers(2) as racers:
        for round_ in range(30):
            at = NOON + timedelta(days=round_)
            schedule(a, b, amount=40, execute_at=at)
            results = racers.run(
                partial(outcome, partial(schedule, a, b, amount=50, execute_at=at)),
                partial(outcome, partial(schedule, a, b, amount=50, execute_at=at)),
            )
            assert sorted(results) == ["limit_daily_outflow", "ok"], results
            assert limits.outflow_on(payer_id=a.owner_id, day=at.date()) == 90


@pytest.mark.django_db(transaction=True)
def test_two_series_racing_for_the_last_slot_let_exactly_one_through(caps):
    caps(series=1)
    a, b = funded_account(), funded_account()
    with Racers(2) as racers:
        for _ in range(15):
            RecurringPayment.objects.filter(payer=a.owner, status=RecurringStatus.ACTIVE).update(
                status=RecurringStatus.ENDED
            )
            results = racers.run(partial(outcome, partial(series, a, b)), partial(outcome, partial(series, a, b)))
            assert sorted(results) == ["limit_active_series", "ok"], results
            assert RecurringPayment.objects.filter(payer=a.owner, status=RecurringStatus.ACTIVE).count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_lock_is_per_payer_and_held_to_the_holders_commit(caps):
    """While one transaction holds a payer's lock, that payer's next schedule waits for
    its commit and then counts what it committed; another payer's does not wait."""
    caps(pending=1)
    a, b, other = funded_account(), funded_account(), funded_account()
    with transaction.atomic():
        limits.lock_payer(a.owner_id)
        schedule(a, b)
        assert start_thread(partial(outcome, partial(schedule, other, b)))() == "ok"
        waiting = start_thread(partial(outcome, partial(schedule, a, b)))
        wait_for_lock_waiters(1)
    assert waiting() == "limit_pending_payments"


@pytest.mark.django_db
def test_a_refusal_inside_an_idempotent_request_stores_no_key(caps):
    from payments.idempotency import idempotent_call

    caps(pending=1)
    a, b = funded_account(), funded_account()
    schedule(a, b)

    def create():
        schedule(a, b)
        return 201, "{}"

    with pytest.raises(PendingPaymentsLimit):
        idempotent_call(actor=a.owner, key="k", fingerprint="f", create=create)
    assert not IdempotencyKey.objects.exists()


def test_the_limits_default_generously_and_parse_off():
    from django.conf import settings

    assert settings.DELAYPAY_MAX_PENDING_PAYMENTS_PER_USER == 10_000
    assert settings.DELAYPAY_MAX_ACTIVE_SERIES_PER_USER == 100
    assert settings.DELAYPAY_MAX_DAILY_OUTFLOW_PER_USER == 10**15


@pytest.mark.parametrize(("raw", "value"), [("off", 0), ("0", 0), ("", 0), ("25", 25), (" OFF ", 0)])
def test_a_limit_variable_reads_a_whole_number_or_off(monkeypatch, raw, value):
    from delaypay import settings as module

    monkeypatch.setenv("DELAYPAY_TEST_CAP", raw)
    assert module._per_user_cap("DELAYPAY_TEST_CAP", 7) == value


@pytest.mark.parametrize("raw", ["-1", "ten", "1.5"])
def test_a_limit_variable_that_is_not_a_whole_number_stops_the_start(monkeypatch, raw):
    from django.core.exceptions import ImproperlyConfigured

    from delaypay import settings as module

    monkeypatch.setenv("DELAYPAY_TEST_CAP", raw)
    with pytest.raises(ImproperlyConfigured, match="DELAYPAY_TEST_CAP"):
        module._per_user_cap("DELAYPAY_TEST_CAP", 7)


def test_usage_ratios():
    usage = limits.Usage(
        user_id=1, username="u", pending_payments=9, active_series=1, series_daily=0, busiest_day=date(2030, 1, 1),
        busiest_outflow=50, caps=limits.Caps(pending_payments=10, active_series=0, daily_outflow=100),
    )
    assert (usage.pending_ratio, usage.series_ratio, usage.outflow_ratio, usage.highest_ratio) == (0.9, None, 0.5, 0.9)


@pytest.mark.django_db
def test_payer_usage_measures_as_the_checks_do(caps):
    caps(pending=10, series=5, daily=1000)
    user = UserFactory()
    a, b = funded_account(owner=user), funded_account()
    schedule(a, b, amount=100)
    schedule(a, b, amount=300, execute_at=NOON + timedelta(days=1))
    series(a, b, amount=50, interval="PT12H")
    usage = limits.payer_usage(user)
    assert (usage.pending_payments, usage.active_series, usage.series_daily) == (2, 1, 100)
    assert (usage.busiest_day, usage.busiest_outflow) == (DAY + timedelta(days=1), 400)
    assert usage.highest_ratio == 0.4


# --- Metrics ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_each_refusal_is_counted_by_its_code(caps):
    from payments import metrics

    def count(code: str) -> float:
        return metrics.limit_refusals_total.labels(limit=code)._value.get()

    caps(pending=1)
    a, b = funded_account(), funded_account()
    before = {code: count(code) for code in ("limit_pending_payments", "system_account")}
    schedule(a, b)
    with pytest.raises(PendingPaymentsLimit):
        schedule(a, b)
    with pytest.raises(SystemAccountPayee):
        schedule(funded_account(), Account.objects.get(pk=ISSUANCE_ACCOUNT_ID))
    assert count("limit_pending_payments") == before["limit_pending_payments"] + 1
    assert count("system_account") == before["system_account"] + 1
