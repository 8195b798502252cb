"""What a user may schedule beyond well-formed input: never into a system account, and
within three per-user limits (docs/reference/configuration.md, "Per-user limits").

* ``DELAYPAY_MAX_PENDING_PAYMENTS_PER_USER``: one-off payments the user created that
  still wait to run (SCHEDULED, overdue or waiting for a retry included). Once claimed
  they leave within a lease, or are parked in NEEDS_REVIEW, which the user cannot cause;
  neither counts. Occurrences of recurring payments do not count: the series limit
  bounds them.
* ``DELAYPAY_MAX_ACTIVE_SERIES_PER_USER``: recurring payments ACTIVE or PAUSED (a paused
  one may resume at any time without asking again).
* ``DELAYPAY_MAX_DAILY_OUTFLOW_PER_USER``: units the user's payments take out on one UTC
  day (by ``execute_at``): the one-off payments due that day (executed ones included;
  cancelled and failed ones moved nothing), plus every ACTIVE or PAUSED series at its
  busiest UTC day (its amount times the most occurrences it has in one UTC day). A series
  is counted in full when it is created or changed, for every day, so generating its
  occurrences never checks a limit and never fails or skips one. The price is caution: a
  weekly series counts on the six days it does not run too.

0 (or ``off``) turns a limit off. The checks run inside the caller's transaction under a
per-payer advisory lock held until it commits, so two requests at the cap cannot both
pass. Only what a user asks for is checked: generating occurrences, executing, staff
re-drives and resolutions never are. Lowering a cap refuses new requests over it and
leaves what exists alone; a change that does not add to a day (a smaller amount on the
same day) is never refused.
"""

import functools
import math
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache

from croniter import croniter
from django.conf import settings
from django.db import connection

from common.db import database_now
from ledger.models import Account

from . import sql
from .exceptions import ActiveSeriesLimit, DailyOutflowLimit, PendingPaymentsLimit, SystemAccountPayee
from .models import RecurringPayment, RecurringStatus, ScheduledPayment
from .rules import Rule, RuleError, iter_occurrences, parse_interval, shortest_interval_seconds

# The advisory lock namespace of LOCK_PAYER_LIMITS: the bytes "lim1" as an int4.
LOCK_NAMESPACE = int.from_bytes(b"lim1", "big")
RESERVING = (RecurringStatus.ACTIVE, RecurringStatus.PAUSED)
# A series' busiest day is found by walking its first year of occurrences, at most this
# many (series_daily_peak).
PEAK_SAMPLE_DAYS = 366
PEAK_SAMPLE_OCCURRENCES = 1000
FAR_FUTURE = datetime(9999, 12, 31, tzinfo=UTC)


@dataclass(frozen=True)
class Caps:
    pending_payments: int
    active_series: int
    daily_outflow: int


def caps() -> Caps:
    """The limits now in force (settings; 0 is no limit)."""
    return Caps(
        pending_payments=settings.DELAYPAY_MAX_PENDING_PAYMENTS_PER_USER,
        active_series=settings.DELAYPAY_MAX_ACTIVE_SERIES_PER_USER,
        daily_outflow=settings.DELAYPAY_MAX_DAILY_OUTFLOW_PER_USER,
    )


# --- Admission: called by the services ---------------------------------------------------


REFUSALS = (PendingPaymentsLimit, ActiveSeriesLimit, DailyOutflowLimit, SystemAccountPayee)


def counted(admit):
    """Count each refusal in ``delaypay_limit_refusals_total{limit=<code>}``."""

    @functools.wraps(admit)
    def checked(*args, **kwargs):
        try:
            return admit(*args, **kwargs)
        except REFUSALS as exc:
            from . import metrics  # metrics imports services, which imports this module

            metrics.record_limit_refusal(exc.code)
            raise

    return checked


@counted
def admit_payment(
    *, payer, to_account_id: str | None, amount: int, execute_at: datetime, jitter_seconds: int = 0
) -> None:
    """``payment_schedule``, after its input is valid, in its transaction: refuse a
    system payee, then check the pending-payments and daily-outflow limits. With jitter
    the due day is not known yet: each day the drawn time may fall on is checked."""
    if to_account_id is not None:  # a payout's payee is outside the ledger
        refuse_system_payee(to_account_id=to_account_id)
    limits = caps()
    if not (limits.pending_payments or limits.daily_outflow):
        return
    lock_payer(payer.pk)
    if limits.pending_payments:
        pending = pending_payments(payer_id=payer.pk)
        if pending >= limits.pending_payments:
            raise PendingPaymentsLimit(
                f"You have {pending} scheduled payments waiting to run, the most allowed "
                f"(DELAYPAY_MAX_PENDING_PAYMENTS_PER_USER = {limits.pending_payments}). "
                "Cancel one, or wait for one to run.",
                limit=limits.pending_payments,
                usage=pending,
            )
    if limits.daily_outflow:
        latest = execute_at + timedelta(seconds=jitter_seconds)
        for day in sorted({utc_day(execute_at), utc_day(latest)}):
            _check_day(payer_id=payer.pk, day=day, adding=amount, limit=limits.daily_outflow)


@counted
def admit_change(*, payment: ScheduledPayment, amount: int, execute_at: datetime) -> None:
    """``payment_update``, before its compare-and-set, in its transaction: the daily
    limit on the day the payment would then fall on. Nothing is checked when the change
    adds nothing to a day (same day, same or smaller amount)."""
    limit = caps().daily_outflow
    day = utc_day(execute_at)
    if not limit or (day == utc_day(payment.execute_at) and amount <= payment.amount):
        return
    lock_payer(payment.payer_id)
    adding = amount
    if payment.recurring_id and payment.occurrence_at and utc_day(payment.occurrence_at) == day:
        series = RecurringPayment.objects.filter(pk=payment.recurring_id).values("amount", "status").first()
        if series and series["status"] in RESERVING:
            adding = max(amount - series["amount"], 0)  # the series' reservation covers the rest
    _check_day(payer_id=payment.payer_id, day=day, adding=adding, limit=limit, exclude_payment_id=payment.id)


@counted
def admit_series(
    *, payer, to_account_id: str | None, terms, last_at: datetime | None, replacing: str | None = None
) -> None:
    """``recurring_create`` (and ``recurring_update`` with ``replacing``, the series'
    id), after its terms are valid, in its transaction: refuse a system payee, then check
    the series limit (on create) and the daily limit: the series at its busiest day, on
    top of the user's other series and their busiest future day of one-off payments.
    ``terms`` has amount, start_at, interval, cron and timezone (series.Terms)."""
    limits = caps()
    if replacing is None and to_account_id is not None:
        refuse_system_payee(to_account_id=to_account_id)
    counting = replacing is None and limits.active_series
    if not (counting or limits.daily_outflow):
        return
    requested = 0
    if limits.daily_outflow:
        requested = terms.amount * series_daily_peak(Rule(terms.start_at, terms.interval, terms.cron, terms.timezone,
                                                          last_at))
        if replacing is not None:
            current = RecurringPayment.objects.get(pk=replacing)
            if requested <= current.amount * series_daily_peak(current.rule):
                return  # the series takes out no more in a day than it already may
    lock_payer(payer.pk)
    if counting:
        active = RecurringPayment.objects.filter(payer_id=payer.pk, status__in=RESERVING).count()
        if active >= limits.active_series:
            raise ActiveSeriesLimit(
                f"You have {active} active or paused recurring payments, the most allowed "
                f"(DELAYPAY_MAX_ACTIVE_SERIES_PER_USER = {limits.active_series}). End one first.",
                limit=limits.active_series,
                usage=active,
            )
    if limits.daily_outflow:
        reserved = series_reserved(payer_id=payer.pk, excluding=replacing)
        by_day = outflow_by_day(
            payer_id=payer.pk, since=_start_of_today(), series_id=replacing, series_amount=terms.amount
        )
        busiest = max(by_day, key=lambda d: (by_day[d], d), default=None)
        usage = reserved + (by_day[busiest] if busiest else 0)
        if usage + requested > limits.daily_outflow:
            raise DailyOutflowLimit(
                f"This recurring payment can take out {requested} units in one UTC day, and your busiest "
                f"day{f' ({busiest.isoformat()})' if busiest else ''} already has {usage} due (one-off payments "
                f"plus your other recurring payments at their busiest): {usage + requested} in all, over the "
                f"daily limit of {limits.daily_outflow} (DELAYPAY_MAX_DAILY_OUTFLOW_PER_USER).",
                limit=limits.daily_outflow,
                usage=usage,
                requested=requested,
                **({"day": busiest.isoformat()} if busiest else {}),
            )


def refuse_system_payee(*, to_account_id: str) -> None:
    """Money enters through deposits into user accounts and never flows back into the
    issuance account (or any system account) by a payment."""
    if Account.objects.filter(pk=to_account_id, kind=Account.Kind.SYSTEM).exists():
        raise SystemAccountPayee()


def lock_payer(payer_id: int) -> None:
    """Serialize this payer's admissions until the transaction ends."""
    with connection.cursor() as cur:
        cur.execute(sql.LOCK_PAYER_LIMITS, {"namespace": LOCK_NAMESPACE, "payer": payer_id})


def _check_day(*, payer_id: int, day: date, adding: int, limit: int, exclude_payment_id: str = "") -> None:
    usage = outflow_on(payer_id=payer_id, day=day, exclude_payment_id=exclude_payment_id)
    if usage + adding > limit:
        raise DailyOutflowLimit(
            f"{day.isoformat()} (UTC) already has {usage} units of your payments due (recurring payments "
            f"at their busiest day included); {adding} more makes {usage + adding}, over the daily limit "
            f"of {limit} (DELAYPAY_MAX_DAILY_OUTFLOW_PER_USER).",
            limit=limit,
            usage=usage,
            requested=adding,
            day=day.isoformat(),
        )


# --- Usage: what the checks and the admin read --------------------------------------------


def utc_day(moment: datetime) -> date:
    return moment.astimezone(UTC).date()


def _start_of_today() -> datetime:
    now = database_now()
    return datetime.combine(utc_day(now), time(), tzinfo=UTC)


def pending_payments(*, payer_id: int) -> int:
    """The payer's one-off payments still SCHEDULED."""
    return pending_by_payer([payer_id]).get(payer_id, 0)


def pending_by_payer(payer_ids: list[int]) -> dict[int, int]:
    with connection.cursor() as cur:
        cur.execute(sql.PENDING_PAYMENTS_BY_PAYER, {"payers": payer_ids})
        return dict(cur.fetchall())


def outflow_by_day(
    *,
    payer_id: int,
    since: datetime,
    until: datetime = FAR_FUTURE,
    exclude_payment_id: str = "",
    series_id: str | None = None,
    series_amount: int | None = None,
) -> dict[date, int]:
    """Units the payer's payments take out per UTC day in [since, until), series'
    occurrences beyond what their reservation covers (sql.OUTFLOW_BY_PAYER_AND_DAY)."""
    return outflow_by_payer_and_day(
        [payer_id], since=since, until=until, exclude_payment_id=exclude_payment_id, series_id=series_id,
        series_amount=series_amount,
    ).get(payer_id, {})


def outflow_by_payer_and_day(
    payer_ids: list[int],
    *,
    since: datetime,
    until: datetime = FAR_FUTURE,
    exclude_payment_id: str = "",
    series_id: str | None = None,
    series_amount: int | None = None,
) -> dict[int, dict[date, int]]:
    by_payer: dict[int, dict[date, int]] = {}
    with connection.cursor() as cur:
        cur.execute(
            sql.OUTFLOW_BY_PAYER_AND_DAY,
            {"payers": payer_ids, "since": since, "until": until, "exclude": exclude_payment_id,
             "series": series_id, "series_amount": series_amount},
        )
        for payer_id, day, total in cur.fetchall():
            by_payer.setdefault(payer_id, {})[day] = int(total)
    return by_payer


def outflow_on(*, payer_id: int, day: date, exclude_payment_id: str = "") -> int:
    """Units counted against the payer's daily limit on ``day``: the payments due that
    day plus every active or paused series at its busiest day."""
    start = datetime.combine(day, time(), tzinfo=UTC)
    payments = outflow_by_day(
        payer_id=payer_id, since=start, until=start + timedelta(days=1), exclude_payment_id=exclude_payment_id
    )
    return sum(payments.values()) + series_reserved(payer_id=payer_id)


def series_reserved(*, payer_id: int, excluding: str | None = None) -> int:
    """What the payer's active and paused series may take out in one UTC day, each at
    its busiest."""
    series = RecurringPayment.objects.filter(payer_id=payer_id, status__in=RESERVING).exclude(pk=excluding or "")
    return sum(rec.amount * series_daily_peak(rec.rule) for rec in series)


@lru_cache(maxsize=4096)
def series_daily_peak(rule: Rule) -> int:
    """The most occurrences ``rule`` has in one UTC day. An interval of hours, minutes or
    seconds: what a day holds at that gap, exactly; a calendar interval in a zone whose
    offset never changes (UTC): one, exactly. Otherwise the busiest UTC day of its
    first year (days the clocks change included), read from its occurrences; a cron
    expression firing too often for PEAK_SAMPLE_OCCURRENCES to cover a week counts its
    minutes times its hours, plus one more hour of them for a day the clocks change. A pure
    function of the rule, so cached per process (a year of a daily cron: about 25 ms)."""
    try:
        shortest = shortest_interval_seconds(rule)
        at_most = max(1, math.ceil(86400 / shortest)) if shortest > 0 else 1
        calendar = ("years", "months", "weeks", "days")
        if rule.interval and not any(parse_interval(rule.interval).get(unit) for unit in calendar):
            return at_most  # exact elapsed time: the most that fit in a day is what a day holds
        if rule.interval and fixed_offset(rule.timezone):
            # A calendar step (a day at least) on a clock that never changes is 24 hours or
            # more, and two instants of one UTC day are less than 24 hours apart.
            return 1
        if rule.cron:
            minutes, hours = (len(field) if field != ["*"] else n for field, n in zip(
                croniter(rule.cron).expanded[:2], (60, 24), strict=True))
            if minutes * hours * 7 > PEAK_SAMPLE_OCCURRENCES:
                return min(minutes * hours + minutes, at_most)
    except RuleError:
        return 1  # refused when validated; a stored rule that no longer parses generates nothing
    return sampled_peak(rule)


def sampled_peak(rule: Rule) -> int:
    """The busiest UTC day among the rule's occurrences in its first PEAK_SAMPLE_DAYS (at
    most PEAK_SAMPLE_OCCURRENCES of them)."""
    per_day: Counter[date] = Counter()
    horizon = rule.start_at + timedelta(days=PEAK_SAMPLE_DAYS)
    try:
        for moment in iter_occurrences(rule, after=rule.start_at - timedelta(microseconds=1)):
            if moment > horizon or per_day.total() >= PEAK_SAMPLE_OCCURRENCES:
                break
            per_day[utc_day(moment)] += 1
    except RuleError:
        pass  # a stored rule outside today's bounds (a series older than them): what it has so far
    # Not capped by at_most: the gap it comes from is read off a few weeks of the rule, and
    # a day the clocks change can bring a daily cron's occurrences closer than that.
    return max(per_day.values(), default=1)


def fixed_offset(timezone: str) -> bool:
    """Whether the zone's offset from UTC never changes: UTC and the ``Etc/`` zones."""
    return timezone in {"UTC", "Universal", "Zulu", "GMT", "Greenwich", "UCT"} or timezone.startswith("Etc/")


# --- The admin's view of usage --------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    """One user against the limits; each ``*_ratio`` is usage over cap (None: no cap)."""

    user_id: int
    username: str
    pending_payments: int
    active_series: int
    series_daily: int  # what the active and paused series reserve per day
    busiest_day: date | None  # from today on, the day with the most due (one-off payments)
    busiest_outflow: int  # that day's count against the daily limit, the series included
    caps: Caps

    @staticmethod
    def _ratio(used: int, cap: int) -> float | None:
        return used / cap if cap else None

    @property
    def pending_ratio(self) -> float | None:
        return self._ratio(self.pending_payments, self.caps.pending_payments)

    @property
    def series_ratio(self) -> float | None:
        return self._ratio(self.active_series, self.caps.active_series)

    @property
    def outflow_ratio(self) -> float | None:
        return self._ratio(self.busiest_outflow, self.caps.daily_outflow)

    @property
    def highest_ratio(self) -> float:
        return max((r for r in (self.pending_ratio, self.series_ratio, self.outflow_ratio) if r is not None), default=0)


def payer_usage(user) -> Usage:
    """``user`` against every limit, measured as the checks measure it."""
    return payer_usages([user])[0]


def payer_usages(users) -> list[Usage]:
    """Each of ``users`` against every limit, measured as the checks measure it, in a
    few queries whatever their number."""
    limits = caps()
    ids = [user.pk for user in users]
    pending = pending_by_payer(ids)
    by_day = outflow_by_payer_and_day(ids, since=_start_of_today())
    series_count: Counter[int] = Counter()
    reserved: Counter[int] = Counter()
    for rec in RecurringPayment.objects.filter(payer_id__in=ids, status__in=RESERVING):
        series_count[rec.payer_id] += 1
        reserved[rec.payer_id] += rec.amount * series_daily_peak(rec.rule)
    usages = []
    for user in users:
        days = by_day.get(user.pk, {})
        busiest = max(days, key=lambda d: (days[d], d), default=None)
        usages.append(Usage(
            user_id=user.pk,
            username=user.get_username(),
            pending_payments=pending.get(user.pk, 0),
            active_series=series_count[user.pk],
            series_daily=reserved[user.pk],
            busiest_day=busiest,
            busiest_outflow=reserved[user.pk] + (days[busiest] if busiest else 0),
            caps=limits,
        ))
    return usages


def users_nearest_limits(*, candidates_per_limit: int = 25) -> list[Usage]:
    """The users worth a look, nearest a limit first: the top ``candidates_per_limit``
    by each kind of usage (sql.LIMIT_CANDIDATES), each then measured exactly."""
    from django.contrib.auth import get_user_model

    with connection.cursor() as cur:
        cur.execute(sql.LIMIT_CANDIDATES, {"n": candidates_per_limit, "today": _start_of_today().date()})
        ids = [row[0] for row in cur.fetchall()]
    users = list(get_user_model().objects.filter(pk__in=ids))
    return sorted(payer_usages(users), key=lambda u: (-u.highest_ratio, u.username))
