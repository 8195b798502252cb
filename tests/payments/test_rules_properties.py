"""Property-based tests of the recurrence rules (payments/rules.py): whatever the start
(anywhere in the calendar), time zone, interval, cron expression, end and count, a rule
is either refused with a RuleError naming a field the API knows (a 400 validation_error),
or it yields strictly increasing aware UTC occurrences that respect the minimum interval;
and every call costs a bounded number of steps, counted (croniter steps, interval
evaluations), never timed, so these tests cannot flake on a slow machine."""

import contextlib
import functools
import itertools
import string
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from unittest import mock
from zoneinfo import ZoneInfo, available_timezones

from dateutil.relativedelta import relativedelta
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from payments import rules
from payments.rules import (
    CRON_PROBE_YEARS,
    EARLIEST,
    LATEST,
    MAX_COUNT,
    MAX_CRON_COUNT,
    MAX_SKIPPED,
    Rule,
    RuleError,
    check_rule,
    iter_occurrences,
    next_occurrence,
    nth_occurrence,
    occurrences_between,
)
from tests.scale import scaled

# The fields a RuleError may name: each is a field of the recurring payment's body.
FIELDS = {"start_at", "interval", "cron", "timezone", "count", "end_at"}
ZONES = sorted(available_timezones())
BAD_ZONES = ["", "Mars/Olympus", "../../etc/passwd", "UTC/", "Europe", "Europe/Berlin ", "\x00", "a" * 300]
# Enough occurrences per example to cross a clock change or two without making each
# example slow.
TAKE = 12


@dataclass
class Steps:
    cron: int = 0  # croniter get_next / get_prev calls
    interval: int = 0  # evaluations of an interval rule's n-th step


@contextlib.contextmanager
def counted_steps():
    """Count the work rules.py does inside the block: every croniter step goes through
    rules._cron_step and every interval step through rules._interval_at."""
    steps = Steps()
    cron_step, interval_at = rules._cron_step, rules._interval_at

    def counting_cron_step(*args, **kwargs):
        steps.cron += 1
        return cron_step(*args, **kwargs)

    def counting_interval_at(*args, **kwargs):
        steps.interval += 1
        return interval_at(*args, **kwargs)

    with (
        mock.patch.object(rules, "_cron_step", counting_cron_step),
        mock.patch.object(rules, "_interval_at", counting_interval_at),
    ):
        yield steps


# --- strategies --------------------------------------------------------------------------------


def weighted(*choices: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    """One of the strategies, drawn in proportion to its weight (mostly what a client would
    send, sometimes anything)."""
    table = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, len(table) - 1).flatmap(lambda i: table[i])


FULL_CALENDAR = st.datetimes(min_value=datetime.min, max_value=datetime.max, timezones=st.just(UTC))
# Where the time zones change most (daylight saving, Samoa, Kiritimati, Monrovia, Vostok).
RECENT = st.datetimes(min_value=datetime(1969, 12, 1), max_value=datetime(2045, 12, 31), timezones=st.just(UTC))
CALENDAR_END = st.datetimes(
    min_value=datetime(9999, 11, 1), max_value=datetime(9999, 12, 31, 23, 59), timezones=st.just(UTC)
)
instants = weighted((2, FULL_CALENDAR), (6, RECENT), (2, CALENDAR_END))

# Mostly real zones (every one of them, with all their history), sometimes names that are not.
zones = weighted((8, st.sampled_from(ZONES)), (1, st.sampled_from(BAD_ZONES)), (1, st.text(max_size=20)))

_UNIT_SIZES = weighted(
    (6, st.integers(0, 3)), (2, st.integers(0, 100)), (1, st.integers(0, 10**12)), (1, st.just(10**40))
)


@st.composite
def built_intervals(draw) -> str:
    def part(unit: str) -> str:
        n = draw(weighted((2, st.none()), (1, _UNIT_SIZES)))
        return "" if n is None else f"{n}{unit}"

    calendar = "".join(part(u) for u in "YMWD")
    clock = "".join(part(u) for u in "HMS")
    return "P" + calendar + (f"T{clock}" if clock or draw(st.booleans()) else "")


intervals = weighted(
    (5, built_intervals()),
    (4, st.sampled_from(["P1D", "P1W", "P1M", "P1Y", "PT1H", "PT1M", "PT1S", "P1DT1H", "P10Y", "P1M1D", "PT59S"])),
    (1, st.text(alphabet="PYMWDTHS0123456789-.,", max_size=45)),
)

_NUMBER = st.integers(-1, 62).map(str)
_SMALL = st.integers(0, 23).map(str)
_ATOM = weighted(
    (4, st.just("*")),
    (4, _SMALL),
    (1, _NUMBER),
    (1, st.builds(lambda a, b: f"{a}-{b}", _SMALL, _NUMBER)),
    (1, st.builds(lambda a, b: f"{a}/{b}", st.sampled_from(["*", "0", "5", "1-20"]), st.integers(0, 61))),
    (1, st.sampled_from(["L", "?", "W", "15W", "1#5", "5#3", "0#1", "7L", "H", "MON", "fri", "JAN", "SUN-SAT"])),
)
_FIELD = weighted((3, _ATOM), (1, st.lists(_ATOM, min_size=2, max_size=3).map(",".join)))
crons = weighted(
    (5, st.lists(_FIELD, min_size=5, max_size=5).map(" ".join)),
    (4, st.sampled_from(
        ["* * * * *", "0 12 * * FRI", "30 2 * * *", "0 0 29 2 *", "0 0 29 2 1", "0 0 1 1 *", "0 0 31 12 *",
         "0,59 0,23 1,31 * *", "*/20 1-3 * * *", "0 0 L * *", "0 0 * 2 1#5", "0 0 30 2 *", "*/5 2 * * *"]
    )),
    (1, st.text(alphabet=string.digits + " */,-#LW?HMONTUESJA", max_size=40)),
)


@st.composite
def rule_kwargs(draw) -> dict:
    kind = draw(st.sampled_from(["interval", "cron"] * 4 + ["both", "neither"]))
    return {
        "start_at": draw(instants),
        "interval": draw(intervals) if kind in ("interval", "both") else "",
        "cron": draw(crons) if kind in ("cron", "both") else "",
        "timezone": draw(zones),
        "end_at": draw(weighted((3, st.none()), (1, instants))),
    }


@st.composite
def afters(draw, start: datetime) -> datetime:
    """Anywhere in the calendar, or (mostly) within a few years either side of the start."""
    if draw(st.integers(0, 3)) == 0:
        return draw(instants)
    offset = timedelta(seconds=draw(st.integers(-10**8, 10**8)))
    try:
        return start + offset
    except OverflowError:
        return start


min_intervals = st.sampled_from([0, 1, 60, 3600, 86400])
PROPERTY = settings(max_examples=scaled(600), suppress_health_check=[HealthCheck.too_slow])
SMALLER = settings(PROPERTY, max_examples=scaled(300))


def validated(kwargs: dict, min_interval: int) -> Rule | None:
    """The rule, or None when validation refuses it; validation itself is bounded and
    names a known field."""
    rule = Rule(**kwargs, min_gap=min_interval)
    with counted_steps() as steps:
        try:
            check_rule(rule, min_interval=min_interval)
        except RuleError as exc:
            assert exc.field in FIELDS, exc.field
            rule = None
    # The cron probe: two steps per year boundary, nothing else. Never an interval step.
    assert steps.cron <= 2 * CRON_PROBE_YEARS, steps
    assert steps.interval == 0, steps
    return rule


# --- properties -------------------------------------------------------------------------------


@PROPERTY
@given(kwargs=rule_kwargs(), min_interval=min_intervals, data=st.data())
def test_a_rule_is_refused_or_yields_strictly_increasing_utc_occurrences(kwargs, min_interval, data):
    after = data.draw(afters(kwargs["start_at"]))
    rule = validated(kwargs, min_interval)
    if rule is None:
        return
    assert EARLIEST <= rule.start_at <= LATEST
    with counted_steps() as steps:
        moments = list(itertools.islice(iter_occurrences(rule, after=after), TAKE))
    # Bounded: a couple of steps to find the first, about one per occurrence after it.
    assert steps.cron <= 4 + 3 * len(moments), (steps, len(moments))
    assert steps.interval <= 2 * MAX_SKIPPED + 4 + 2 * len(moments), (steps, len(moments))
    for moment in moments:
        assert moment.tzinfo is UTC
        assert moment > after and moment >= rule.start_at and moment <= LATEST
        assert rule.end_at is None or moment <= rule.end_at
    for earlier, later in itertools.pairwise(moments):
        assert later > earlier
        assert (later - earlier).total_seconds() >= min_interval, (earlier, later)
    # Asked one at a time from each occurrence (what the promoter's tick does), the rule
    # gives the same series.
    if moments:
        assert next_occurrence(rule, after=after) == moments[0]
    for earlier, later in itertools.pairwise(moments):
        assert next_occurrence(rule, after=earlier) == later


@SMALLER
@given(
    kwargs=rule_kwargs(),
    count=st.one_of(
        st.integers(-3, 40),
        st.sampled_from([MAX_CRON_COUNT, MAX_CRON_COUNT + 1, MAX_COUNT, MAX_COUNT + 1, 10**30]),
    ),
)
def test_a_count_resolves_in_bounded_steps_or_is_refused(kwargs, count):
    rule = validated(kwargs, 60)
    if rule is None:
        return
    with counted_steps() as steps:
        try:
            last = nth_occurrence(rule, count)
        except RuleError as exc:
            assert exc.field == "count"
            assert not 1 <= count <= (MAX_COUNT if rule.interval else MAX_CRON_COUNT)
            assert steps == Steps()  # refused before any work
            return
    if rule.interval:
        assert steps.interval == 1 and steps.cron == 0  # closed form: the (count - 1)-th step
    else:
        assert steps.cron <= 2 + 2 * count and steps.interval == 0
    if last is not None:
        assert last.tzinfo is UTC and rule.start_at <= last <= LATEST
        assert rule.end_at is None or last <= rule.end_at
    if rule.cron and count <= 40:
        listed = list(itertools.islice(iter_occurrences(rule, after=rule.start_at - timedelta(microseconds=1)), count))
        assert last == (listed[-1] if len(listed) == count else None)


@SMALLER
@given(kwargs=rule_kwargs(), data=st.data(), span=st.integers(0, 10**9), limit=st.integers(0, 150))
def test_listing_missed_occurrences_is_bounded_by_its_limit(kwargs, data, span, limit):
    after = data.draw(afters(kwargs["start_at"]))
    rule = validated(kwargs, 60)
    if rule is None:
        return
    until = after + min(timedelta(seconds=span), datetime.max.replace(tzinfo=UTC) - after)
    with counted_steps() as steps:
        missed = occurrences_between(rule, after=after, until=until, limit=limit)
    assert len(missed) <= limit
    assert all(after < m <= until for m in missed)
    assert steps.cron <= 4 + 3 * (limit + 1) and steps.interval <= 2 * MAX_SKIPPED + 4 + 2 * (limit + 1)


OUTSIDE_THE_CALENDAR = st.one_of(
    st.datetimes(min_value=datetime.min, max_value=EARLIEST.replace(tzinfo=None) - timedelta(microseconds=1)),
    st.datetimes(min_value=LATEST.replace(tzinfo=None) + timedelta(microseconds=1), max_value=datetime.max),
).map(lambda moment: moment.replace(tzinfo=UTC))


@settings(max_examples=scaled(200))
@given(kwargs=rule_kwargs(), start_at=OUTSIDE_THE_CALENDAR)
def test_a_start_outside_the_calendar_is_refused_by_every_entry_point(kwargs, start_at):
    rule = replace(Rule(**kwargs), start_at=start_at)
    for call in (
        lambda: check_rule(rule),
        lambda: next_occurrence(rule, after=EARLIEST),
        lambda: nth_occurrence(rule, 2),
    ):
        try:
            call()
        except RuleError as exc:
            assert exc.field == "start_at"
        else:
            raise AssertionError("accepted a start outside the calendar")


# --- around clock changes ---------------------------------------------------------------------

# Zones whose changes are unusual: daylight saving (Berlin), a 30-minute one (Lord Howe),
# 2-3 hours (Troll, Casey), 7 hours (Vostok), a whole day skipped (Apia, Kiritimati), an
# offset in seconds (Monrovia, -00:44:30 until 1972).
ODD_ZONES = [
    "Europe/Berlin", "Australia/Lord_Howe", "Antarctica/Troll", "Antarctica/Casey", "Antarctica/Vostok",
    "Pacific/Apia", "Pacific/Kiritimati", "Africa/Monrovia",
]


@functools.cache
def clock_changes(name: str) -> list[datetime]:
    """The instants the zone's offset changed between 1970 and 2040 (a daily scan, then
    bisection to the second)."""
    tz, changes = ZoneInfo(name), []
    moment, offset = EARLIEST, EARLIEST.astimezone(tz).utcoffset()
    while moment < datetime(2040, 1, 1, tzinfo=UTC):
        following = moment + timedelta(days=1)
        if following.astimezone(tz).utcoffset() != offset:
            low, high = moment, following
            while high - low > timedelta(seconds=1):
                middle = low + (high - low) / 2
                low, high = (middle, high) if middle.astimezone(tz).utcoffset() == offset else (low, middle)
            changes.append(high)
            offset = following.astimezone(tz).utcoffset()
        moment = following
    return changes


@st.composite
def near_a_clock_change(draw) -> tuple[Rule, datetime, int]:
    zone_name = draw(st.sampled_from(ODD_ZONES))
    change = draw(st.sampled_from(clock_changes(zone_name)))
    start = change + timedelta(seconds=draw(st.integers(-40 * 86400, 3 * 3600)))
    after = change + timedelta(seconds=draw(st.integers(-2 * 86400, 2 * 3600)))
    interval = draw(st.sampled_from(["", "PT1M", "PT30M", "PT1H", "PT23H", "P1D", "P1W", "P1M", "P1DT30M"]))
    cron = "" if interval else draw(weighted((1, crons), (2, st.sampled_from(
        ["* * * * *", "*/10 * * * *", "0,30 * * * *", "59 1,3 * * *", "30 2 * * *", "*/15 23,0,1 * * *"]
    ))))
    min_interval = draw(st.sampled_from([0, 1, 60, 600, 3600, 4000]))
    return Rule(start, interval, cron, zone_name, None, min_gap=min_interval), after, min_interval


@settings(PROPERTY, max_examples=scaled(300))
@given(case=near_a_clock_change())
def test_across_clock_changes_occurrences_stay_strictly_increasing_and_apart(case):
    rule, after, min_interval = case
    try:
        check_rule(rule, min_interval=min_interval)
    except RuleError as exc:
        assert exc.field in FIELDS
        return
    with counted_steps() as steps:
        moments = list(itertools.islice(iter_occurrences(rule, after=after), 40))
    assert steps.cron <= 4 + 3 * len(moments), (steps, len(moments))
    assert all(moment > after and moment >= rule.start_at for moment in moments)
    for earlier, later in itertools.pairwise(moments):
        assert later > earlier and (later - earlier).total_seconds() >= min_interval, (earlier, later)
        assert next_occurrence(rule, after=earlier) == later


# --- the ten-year bound on an interval --------------------------------------------------------


def shortest_span_days(months: int) -> int:
    """What ``months`` calendar months last at their shortest, as the bound counts them
    (docs/reference/api.md, "Bounds"): 365 days a year, 28 days a month."""
    return 365 * (months // 12) + 28 * (months % 12)


@st.composite
def intervals_near_the_bound(draw) -> tuple[str, int, int]:
    """An interval whose calendar part is T <= 120 months and whose fixed part (weeks, days,
    hours, minutes, seconds) lies within a few days of what the bound leaves for it,
    written in any mix of units; with T and its fixed part in seconds."""
    months_total = draw(st.integers(0, 121))
    years = draw(st.integers(0, months_total // 12))
    months = months_total - 12 * years
    left = max(0, shortest_span_days(120 - months_total)) * 86400
    fixed = draw(st.integers(max(0, left - 3 * 86400), left + 2 * 86400))
    weeks = draw(st.integers(0, fixed // (7 * 86400)))
    rest = fixed - weeks * 7 * 86400
    days = draw(st.integers(0, rest // 86400))
    rest -= days * 86400
    hours = draw(st.integers(0, rest // 3600))
    rest -= hours * 3600
    minutes = draw(st.integers(0, rest // 60))
    seconds = rest - minutes * 60
    calendar = "".join(f"{n}{u}" for n, u in ((years, "Y"), (months, "M"), (weeks, "W"), (days, "D")) if n)
    clock = "".join(f"{n}{u}" for n, u in ((hours, "H"), (minutes, "M"), (seconds, "S")) if n)
    text = "P" + calendar + (f"T{clock}" if clock else "")
    return (text if text != "P" else "PT1S"), months_total, (fixed if text != "P" else 1)


@PROPERTY
@given(
    case=intervals_near_the_bound().filter(lambda case: len(case[0]) <= rules.MAX_INTERVAL_LENGTH),
    start=instants.filter(lambda moment: moment <= datetime(9989, 1, 1, tzinfo=UTC)),
)
def test_an_interval_is_refused_exactly_when_it_could_last_over_ten_years(case, start):
    """The bound applies to the whole duration (issue 33: P3660D, P10Y1D and PT87700H
    were accepted): at most 120 calendar months, and a fixed part no longer than the
    remaining months last at their shortest. An accepted interval never takes a start in
    UTC past the same instant ten years on."""
    text, months_total, fixed_seconds = case
    within = months_total <= 120 and fixed_seconds <= shortest_span_days(120 - months_total) * 86400
    try:
        parts = rules.parse_interval(text)
    except RuleError as exc:
        assert not within, (text, str(exc))
        assert exc.field == "interval" and "at most 10 years" in str(exc)
        return
    assert within, text
    step = rules._interval_at(Rule(start_at=start, interval=text), parts, 1)
    assert step is not None and step <= start + relativedelta(years=10), (text, start, step)
