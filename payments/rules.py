"""When the occurrences of a recurring payment fall. Pure functions, no database.

Two kinds of rule:

* ``interval``: an ISO 8601 duration (``P1D``, ``P1W``, ``P1M``, ``PT6H``, ``P1Y2M``).
  Occurrence *n* is ``start + n * interval`` computed from the start each time (never
  by adding to the previous occurrence), so the 31st of a month lands on the last day
  of shorter months and comes back to the 31st afterwards. Calendar parts (years,
  months, weeks, days) are applied to the wall clock in the rule's time zone, so
  "every day at 12:00 Europe/Berlin" stays at 12:00 across daylight-saving changes;
  a duration with only hours, minutes or seconds is exact elapsed time.
* ``cron``: five fields (croniter) evaluated in the rule's time zone. A wall-clock time
  that happens twice when clocks go back fires once; one skipped when clocks go
  forward fires at the first valid instant after the gap.

A series whose next instant would fall past year 9999, or a cron expression that no
longer matches any date, simply has no next occurrence: computing one never raises,
because the promoter's tick computes it (an exception there would stop every payment).
Intervals are at most MAX_INTERVAL_YEARS long, and a cron expression that matches no
date at all ("0 0 30 2 *") is refused when the rule is validated.
"""

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadCronError, CroniterBadDateError, croniter
from dateutil.relativedelta import relativedelta

_DURATION_RE = re.compile(
    r"^P(?!$)(?:(?P<years>\d+)Y)?(?:(?P<months>\d+)M)?(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?:T(?=\d)(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+)S)?)?$"
)
_CALENDAR = ("years", "months", "weeks", "days")
_CLOCK = ("hours", "minutes", "seconds")
# Longer intervals are refused: they are no use for payments and, compounded by a
# count, reach instants past year 9999 that no datetime can hold.
MAX_INTERVAL_YEARS = 10


class RuleError(ValueError):
    """An interval, cron expression, time zone or count that cannot be used; ``field``
    names the input at fault."""

    def __init__(self, message: str, *, field: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Rule:
    start_at: datetime
    interval: str = ""
    cron: str = ""
    timezone: str = "UTC"
    end_at: datetime | None = None  # no occurrence after this instant

    @property
    def zone(self) -> ZoneInfo:
        return zone(self.timezone)


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise RuleError(f"Unknown time zone {name!r}.", field="timezone") from exc


def parse_interval(text: str) -> dict[str, int]:
    """``P1M`` -> ``{"months": 1}``; RuleError when it is not an ISO 8601 duration."""
    match = _DURATION_RE.match(text or "")
    if not match:
        raise RuleError("Must be an ISO 8601 duration such as P1D, P1W, P1M or PT1H.", field="interval")
    parts = {k: int(v) for k, v in match.groupdict().items() if v is not None}
    if not any(parts.values()):
        raise RuleError("The interval must be longer than zero.", field="interval")
    if _approx_seconds(parts) > MAX_INTERVAL_YEARS * 366 * 86400:
        raise RuleError(f"The interval must be at most {MAX_INTERVAL_YEARS} years.", field="interval")
    return parts


def shortest_interval_seconds(rule: Rule) -> float:
    """A lower bound of the gap between two occurrences, for the minimum-interval rule."""
    if rule.interval:
        parts = parse_interval(rule.interval)
        # The shortest month has 28 days and the shortest year 365; a local day can be
        # 23 hours long on a daylight-saving change.
        days = parts.get("years", 0) * 365 + parts.get("months", 0) * 28 + parts.get("weeks", 0) * 7
        days += parts.get("days", 0)
        clock = parts.get("hours", 0) * 3600 + parts.get("minutes", 0) * 60 + parts.get("seconds", 0)
        return days * 86400 - (3600 if days else 0) + clock
    validate_cron(rule.cron)
    it = croniter(rule.cron, rule.start_at.astimezone(rule.zone))
    try:
        times = [it.get_next(datetime) for _ in range(50)]
    except (CroniterBadDateError, ValueError, OverflowError) as exc:
        # "0 0 30 2 *": croniter gives up looking for a 30th of February.
        raise RuleError("The cron expression matches no date, or too few.", field="cron") from exc
    return min((b - a).total_seconds() for a, b in itertools.pairwise(times))


def validate_cron(expression: str) -> None:
    if len((expression or "").split()) != 5:
        raise RuleError("Must be a five-field cron expression such as '0 12 * * FRI'.", field="cron")
    try:
        croniter(expression)
    except (CroniterBadCronError, CroniterBadDateError, ValueError, KeyError) as exc:
        raise RuleError(f"Invalid cron expression: {exc}", field="cron") from exc


def _interval_occurrence(rule: Rule, n: int) -> datetime:
    parts = parse_interval(rule.interval)
    calendar = {k: parts[k] * n for k in _CALENDAR if parts.get(k)}
    clock = timedelta(**{k: parts[k] * n for k in _CLOCK if parts.get(k)})
    if calendar:
        local = rule.start_at.astimezone(rule.zone).replace(tzinfo=None) + relativedelta(**calendar)
        # A wall time inside a spring-forward gap resolves (fold=0) to the instant after it.
        moment = local.replace(tzinfo=rule.zone).astimezone(UTC)
    else:
        moment = rule.start_at.astimezone(UTC)
    return moment + clock


def _approx_seconds(parts: dict[str, int]) -> float:
    return (
        parts.get("years", 0) * 365.2425 * 86400
        + parts.get("months", 0) * 30.436875 * 86400
        + parts.get("weeks", 0) * 7 * 86400
        + parts.get("days", 0) * 86400
        + parts.get("hours", 0) * 3600
        + parts.get("minutes", 0) * 60
        + parts.get("seconds", 0)
    )


def _first_interval_index(rule: Rule, after: datetime) -> int:
    """The index n of the first occurrence strictly after ``after``."""
    if after < rule.start_at:
        return 0
    step = _approx_seconds(parse_interval(rule.interval))
    n = max(int((after - rule.start_at).total_seconds() // step) - 1, 0)
    while _interval_occurrence(rule, n) <= after:
        n += 1
    while n > 0 and _interval_occurrence(rule, n - 1) > after:
        n -= 1
    return n


def _iter_interval(rule: Rule, after: datetime) -> Iterator[datetime]:
    n = _first_interval_index(rule, after)
    while True:
        yield _interval_occurrence(rule, n)
        n += 1


def _iter_cron(rule: Rule, after: datetime) -> Iterator[datetime]:
    base = max(after, rule.start_at - timedelta(microseconds=1)).astimezone(rule.zone)
    it = croniter(rule.cron, base)
    previous_wall = base.replace(tzinfo=None, fold=0)
    repeats = 0
    while True:
        try:
            candidate = it.get_next(datetime)
        except CroniterBadDateError:
            return  # no matching date any more
        wall = candidate.replace(tzinfo=None, fold=0)
        # Clocks went back: the same wall time again is the same occurrence, fire once.
        if wall == previous_wall:
            repeats += 1
            if repeats > 1000:
                raise RuleError("The cron expression has no next occurrence.", field="cron")
            continue
        repeats = 0
        previous_wall = wall
        yield candidate.astimezone(UTC)


MAX_COUNT = 10_000


def iter_occurrences(rule: Rule, *, after: datetime) -> Iterator[datetime]:
    """Occurrences strictly after ``after`` (the start itself counts when ``after``
    precedes it), in order, until ``end_at``. One croniter walks a cron rule, so listing
    thousands costs one pass."""
    moments = _iter_interval(rule, after) if rule.interval else _iter_cron(rule, after)
    while True:
        try:
            moment = next(moments)
        except StopIteration:
            return
        except (ValueError, OverflowError) as exc:
            if isinstance(exc, RuleError):
                raise
            return  # the next instant is past year 9999: the series has run out
        if rule.end_at is not None and moment > rule.end_at:
            return
        yield moment


def next_occurrence(rule: Rule, *, after: datetime) -> datetime | None:
    """The first occurrence strictly after ``after``, or None when the series has ended."""
    return next(iter_occurrences(rule, after=after), None)


def nth_occurrence(rule: Rule, count: int) -> datetime | None:
    """The ``count``-th occurrence from the start (1-based), or None if the series ends first.

    A ``count`` turns into an end instant once, at creation: occurrences skipped while
    paused still use up their place in the series.
    """
    if not 1 <= count <= MAX_COUNT:
        raise RuleError(f"Must be between 1 and {MAX_COUNT}.", field="count")
    moments = itertools.islice(iter_occurrences(rule, after=rule.start_at - timedelta(microseconds=1)), count)
    listed = list(moments)
    return listed[-1] if len(listed) == count else None


def occurrences_between(rule: Rule, *, after: datetime, until: datetime, limit: int = 1000) -> list[datetime]:
    """Occurrences in (after, until], at most ``limit`` (for recording skipped ones)."""
    return list(
        itertools.islice(itertools.takewhile(lambda m: m <= until, iter_occurrences(rule, after=after)), limit)
    )
