"""When the occurrences of a recurring payment fall. Pure functions, no database.

Two kinds of rule:

* ``interval``: an ISO 8601 duration (``P1D``, ``P1W``, ``P1M``, ``PT6H``, ``P1Y2M``).
  Occurrence *n* is ``start + n * interval`` computed from the start each time (never
  by adding to the previous occurrence), so the 31st of a month lands on the last day
  of shorter months and comes back to the 31st afterwards. Calendar parts (years,
  months, weeks, days) are applied to the wall clock in the rule's time zone, so
  "every day at 12:00 Europe/Berlin" stays at 12:00 across daylight-saving changes;
  a duration with only hours, minutes or seconds is exact elapsed time.
* ``cron``: five fields (croniter) matched against the wall clock in the rule's time
  zone. A wall-clock time that happens twice when clocks go back fires once (the first
  time); one skipped when clocks go forward fires at the first instant after the gap.

Occurrences come out strictly increasing, as aware UTC datetimes, never closer together
than the rule's ``min_gap`` (DELAYPAY_MIN_RECURRING_INTERVAL for a stored series): an
occurrence that a clock change would bring closer than that to the previous one is left
out (noon on the day Samoa skipped is the same instant as noon the day after; every
match inside a spring-forward gap fires when the gap ends; Monrovia's change of 44
minutes 30 seconds in 1972 brought two minutes within 30 seconds).

Bounded by construction, so that neither a request nor the promoter's tick can be made
to spend long here (docs/reference/api.md, "Bounds"):

* ``start_at`` lies in [EARLIEST, LATEST] and no occurrence falls after LATEST, so no
  date arithmetic in any time zone can leave the calendar. A series whose next instant
  would fall after LATEST has run out: it has no next occurrence.
* An interval is at most MAX_INTERVAL_YEARS long, all of it (``within_interval_bound``:
  at most 120 calendar months, and weeks, days and time no longer than the months left
  over last at their shortest); the occurrence after any instant is found from an
  estimate of its index plus a few steps, never by walking from the start.
* A cron expression must match at least once in every CRON_MAX_GAP of wall-clock time
  (checked at validation by probing CRON_PROBE_YEARS year boundaries: a constant
  number of croniter steps); every croniter search is capped at that gap, so a rule
  that fires rarely or never costs the same few steps as any other.
* A ``count`` becomes the series' last instant once: in O(1) for an interval, by
  walking at most MAX_CRON_COUNT occurrences for a cron rule.

Invalid input raises RuleError naming the field at fault (a 400 validation_error in the
API). Computing the next occurrence of a valid rule does not raise: past the calendar, or
past the cron horizon, the series has simply run out.
"""

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter
from dateutil.relativedelta import relativedelta

from common.formats import ISO_DURATION

_DURATION_RE = ISO_DURATION  # the console reads intervals with the same pattern (common/formats.py)
_CALENDAR = ("years", "months", "weeks", "days")
_CLOCK = ("hours", "minutes", "seconds")
_MICROSECOND = timedelta(microseconds=1)

# The calendar a rule may use. Everything a rule computes stays at least a day inside
# what a datetime can hold, in every time zone (offsets are under a day).
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 12, 30, tzinfo=UTC)
# Longer intervals are refused: they are no use for payments and, compounded by a
# count, reach instants past LATEST.
MAX_INTERVAL_YEARS = 10
MAX_INTERVAL_MONTHS = 12 * MAX_INTERVAL_YEARS
# The least a calendar year and a calendar month last (in days), as the bound counts them.
SHORTEST_YEAR_DAYS, SHORTEST_MONTH_DAYS = 365, 28
MAX_INTERVAL_LENGTH = 40
MAX_CRON_LENGTH = 120
MAX_COUNT = 10_000
# A cron rule has no closed form for its n-th occurrence: a count is resolved by walking
# the occurrences, at most this many.
MAX_CRON_COUNT = 1_000
# A cron rule must match at least once in any stretch of wall-clock time this long (a
# yearly rule does, "0 0 29 2 *" does not): the fixed search horizon of every croniter step.
CRON_MAX_GAP = timedelta(days=366)
# Validation probes this many consecutive year boundaries: the calendar's pattern of
# leap years and weekdays repeats every 28 years (a gap longer than CRON_MAX_GAP always
# spans a 1 January, so checking the gap around each one finds it).
CRON_PROBE_YEARS = 29
# A safety net, never reached by a valid rule: the most candidates one step of an
# iteration looks at before it gives up (a clock change drops one or two).
MAX_SKIPPED = 64


class RuleError(ValueError):
    """An interval, cron expression, time zone, start or count that cannot be used;
    ``field`` names the input at fault."""

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
    # Seconds: no two occurrences closer than this (the series' minimum interval), or
    # than the rule's own shortest gap when that is shorter (a setting raised later
    # never silences a series that was valid when it was made).
    min_gap: int = 0

    @property
    def zone(self) -> ZoneInfo:
        return zone(self.timezone)

    @cached_property
    def floor(self) -> timedelta:
        """The least gap between two occurrences this rule lets through."""
        return timedelta(seconds=max(0, min(self.min_gap, shortest_interval_seconds(self))))


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError, OSError) as exc:
        raise RuleError(f"Unknown time zone {name!r}.", field="timezone") from exc


# --- validation --------------------------------------------------------------------------------


def check_start(start_at: datetime, *, field: str = "start_at") -> None:
    if not isinstance(start_at, datetime) or start_at.tzinfo is None or start_at.utcoffset() is None:
        raise RuleError("Must carry an explicit UTC offset.", field=field)
    if not EARLIEST <= start_at <= LATEST:
        raise RuleError(f"Must be between {_rfc3339(EARLIEST)} and {_rfc3339(LATEST)}.", field=field)


def check_rule(rule: Rule, *, min_interval: int = 0) -> None:
    """Everything that makes a rule unusable, as a RuleError naming the field: the start,
    the time zone, the interval or cron expression (including a cron expression that
    fires less than once in CRON_MAX_GAP) and, given ``min_interval`` (seconds), a rule
    whose occurrences can come closer together than that. A constant amount of work."""
    check_start(rule.start_at)
    rule.zone  # noqa: B018 - validates the time zone name
    if bool(rule.interval) == bool(rule.cron):
        raise RuleError("Give exactly one of interval and cron.", field="interval")
    if rule.interval:
        parse_interval(rule.interval)
    else:
        validate_cron(rule.cron)
        _check_cron_fires_regularly(rule)
    if shortest_interval_seconds(rule) < min_interval:
        raise RuleError(
            f"Occurrences must be at least {min_interval} seconds apart.", field="interval" if rule.interval else "cron"
        )


def parse_interval(text: str) -> dict[str, int]:
    """``P1M`` -> ``{"months": 1}``; RuleError when it is not an ISO 8601 duration."""
    match = _DURATION_RE.match(text or "") if isinstance(text, str) and len(text) <= MAX_INTERVAL_LENGTH else None
    if not match:
        raise RuleError("Must be an ISO 8601 duration such as P1D, P1W, P1M or PT1H.", field="interval")
    parts = {k: int(v) for k, v in match.groupdict().items() if v is not None}
    if not any(parts.values()):
        raise RuleError("The interval must be longer than zero.", field="interval")
    if not within_interval_bound(parts):
        raise RuleError(
            f"The interval must be at most {MAX_INTERVAL_YEARS} years (P{MAX_INTERVAL_YEARS}Y, "
            f"P{MAX_INTERVAL_MONTHS}M or P{_shortest_days(MAX_INTERVAL_MONTHS)}D): weeks, days, hours, minutes and "
            f"seconds count against the months that years and months leave, at {SHORTEST_YEAR_DAYS} days a year "
            f"and {SHORTEST_MONTH_DAYS} days a month.",
            field="interval",
        )
    return parts


def within_interval_bound(parts: dict[str, int]) -> bool:
    """Whether a duration is at most MAX_INTERVAL_YEARS long, all of it: years and
    months together at most MAX_INTERVAL_MONTHS, and the fixed part (weeks, days, hours,
    minutes, seconds) at most what the remaining calendar months last at their shortest
    (365 days a year, 28 days a month). Conservative: in UTC an accepted interval never
    takes a start past the same instant MAX_INTERVAL_YEARS later (in another zone, hours
    being elapsed time, by at most a clock change). P10Y, P120M and P3650D are the
    longest of their kinds; P10Y1D, P3651D and PT87601H are refused. Integer arithmetic:
    no size of number overflows it."""
    months = 12 * parts.get("years", 0) + parts.get("months", 0)
    if months > MAX_INTERVAL_MONTHS:
        return False
    fixed_seconds = (
        (7 * parts.get("weeks", 0) + parts.get("days", 0)) * 86400
        + parts.get("hours", 0) * 3600
        + parts.get("minutes", 0) * 60
        + parts.get("seconds", 0)
    )
    return fixed_seconds <= _shortest_days(MAX_INTERVAL_MONTHS - months) * 86400


def _shortest_days(months: int) -> int:
    """A lower bound of how long ``months`` consecutive calendar months last, in days."""
    return SHORTEST_YEAR_DAYS * (months // 12) + SHORTEST_MONTH_DAYS * (months % 12)


def validate_cron(expression: str) -> None:
    if not isinstance(expression, str) or len(expression) > MAX_CRON_LENGTH or len(expression.split()) != 5:
        raise RuleError("Must be a five-field cron expression such as '0 12 * * FRI'.", field="cron")
    _cron(expression, datetime(2000, 1, 1))


def _cron(expression: str, start: datetime) -> croniter:
    """A croniter over naive wall-clock time whose every search gives up past CRON_MAX_GAP."""
    try:
        return croniter(expression, start, max_years_between_matches=1)
    except (CroniterError, ValueError, KeyError, IndexError, TypeError, OverflowError) as exc:
        raise RuleError(f"Invalid cron expression: {exc}", field="cron") from exc


def _cron_step(it: croniter, *, back: bool = False) -> datetime | None:
    """The next (or previous) match, None when there is none within the horizon or the calendar."""
    try:
        return it.get_prev(datetime) if back else it.get_next(datetime)
    except (CroniterError, ValueError, OverflowError):
        return None


def _check_cron_fires_regularly(rule: Rule) -> None:
    """RuleError unless the expression matches at least once in every CRON_MAX_GAP of wall
    time: around each of the next CRON_PROBE_YEARS 1 Januaries, the matches before and
    after it are at most CRON_MAX_GAP apart. Two croniter steps per year, each capped."""
    first_year = rule.start_at.astimezone(rule.zone).year + 1
    for year in range(first_year, min(first_year + CRON_PROBE_YEARS, LATEST.year)):
        boundary = datetime(year, 1, 1)
        before = _cron_step(_cron(rule.cron, boundary), back=True)
        after = _cron_step(_cron(rule.cron, boundary - _MICROSECOND))
        if before is None or after is None or after - before > CRON_MAX_GAP:
            raise RuleError(
                f"The cron expression must match at least once every {CRON_MAX_GAP.days} days.", field="cron"
            )


def shortest_interval_seconds(rule: Rule) -> float:
    """A lower bound of the gap between two occurrences, for the minimum-interval rule.
    No iteration: the interval's parts, or the cron expression's minutes and hours."""
    if rule.interval:
        parts = parse_interval(rule.interval)
        # The shortest month has 28 days and the shortest year 365; a local day can be
        # 23 hours long on a daylight-saving change (occurrences that a larger change
        # brings closer than the series' minimum interval are left out: Rule.floor).
        days = parts.get("years", 0) * 365 + parts.get("months", 0) * 28 + parts.get("weeks", 0) * 7
        days += parts.get("days", 0)
        clock = parts.get("hours", 0) * 3600 + parts.get("minutes", 0) * 60 + parts.get("seconds", 0)
        return days * 86400 - (3600 if days else 0) + clock
    validate_cron(rule.cron)
    expanded = croniter(rule.cron).expanded
    minutes, hours = _values(expanded[0], 60), _values(expanded[1], 24)
    times = [h * 3600 + m * 60 for h in hours for m in minutes]
    # Within a day, and from a day's last time to the next day's first, as if every day
    # matched (a lower bound: the day fields only ever take days away).
    gaps = [b - a for a, b in itertools.pairwise(times)] + [86400 - times[-1] + times[0]]
    return float(min(gaps))


def _values(field: list, size: int) -> list[int]:
    """A croniter minute or hour field as its sorted values; ``*`` anywhere in it (or
    anything else that is not a number) reads as every value, a lower bound either way."""
    if all(type(v) is int for v in field):
        return sorted(set(field))
    return list(range(size))


# --- occurrences -------------------------------------------------------------------------------


def iter_occurrences(rule: Rule, *, after: datetime) -> Iterator[datetime]:
    """Occurrences strictly after ``after`` (the start itself counts when ``after``
    precedes it), in order, until ``end_at``. Each one costs a bounded number of steps
    (RuleError if that bound is ever passed, which no valid rule does)."""
    check_start(rule.start_at)
    if not isinstance(after, datetime) or after.tzinfo is None:
        raise ValueError("after must be an aware datetime")
    after = min(max(after, EARLIEST - _MICROSECOND), LATEST)
    moments = _iter_interval(rule, after) if rule.interval else _iter_cron(rule, after)
    for moment in moments:
        if rule.end_at is not None and moment > rule.end_at:
            return
        yield moment


def next_occurrence(rule: Rule, *, after: datetime) -> datetime | None:
    """The first occurrence strictly after ``after``, or None when the series has ended."""
    return next(iter_occurrences(rule, after=after), None)


def nth_occurrence(rule: Rule, count: int) -> datetime | None:
    """The ``count``-th occurrence from the start (1-based), or None if the series ends first.

    A ``count`` turns into an end instant once, at creation: occurrences skipped while
    paused still use up their place in the series. For an interval this is the rule's
    ``count - 1``-th step, in O(1); a cron rule walks its occurrences, so its count is at
    most MAX_CRON_COUNT.
    """
    if type(count) is not int or not 1 <= count <= MAX_COUNT:
        raise RuleError(f"Must be between 1 and {MAX_COUNT}.", field="count")
    check_start(rule.start_at)
    if rule.interval:
        moment = _interval_at(rule, parse_interval(rule.interval), count - 1)
        if moment is None or (rule.end_at is not None and moment > rule.end_at):
            return None
        return moment
    if count > MAX_CRON_COUNT:
        raise RuleError(
            f"With a cron rule, count is at most {MAX_CRON_COUNT}; give end_at for a longer series.", field="count"
        )
    listed = list(itertools.islice(iter_occurrences(rule, after=rule.start_at - _MICROSECOND), count))
    return listed[-1] if len(listed) == count else None


def occurrences_between(rule: Rule, *, after: datetime, until: datetime, limit: int = 1000) -> list[datetime]:
    """Occurrences in (after, until], at most ``limit`` (for recording skipped ones)."""
    return list(
        itertools.islice(itertools.takewhile(lambda m: m <= until, iter_occurrences(rule, after=after)), limit)
    )


def _kept(rule: Rule, previous: datetime | None, moment: datetime) -> bool:
    """Whether the raw candidate ``moment`` is an occurrence, given the raw candidate
    before it: strictly later, and at least the rule's floor later."""
    return previous is None or (moment > previous and moment - previous >= rule.floor)


def _give_up(rule: Rule) -> RuleError:
    return RuleError("The rule yields no usable occurrence.", field="interval" if rule.interval else "cron")


# --- interval rules ----------------------------------------------------------------------------


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


def _interval_at(rule: Rule, parts: dict[str, int], n: int) -> datetime | None:
    """The rule's n-th step from the start (n = 0 is the start), or None past LATEST."""
    if n == 0:
        return rule.start_at.astimezone(UTC)
    calendar = {k: parts[k] * n for k in _CALENDAR if parts.get(k)}
    try:
        clock = timedelta(**{k: parts[k] * n for k in _CLOCK if parts.get(k)})
        if calendar:
            local = rule.start_at.astimezone(rule.zone).replace(tzinfo=None) + relativedelta(**calendar)
            if local.year > LATEST.year:
                return None
            # A wall time inside a spring-forward gap resolves (fold=0) to the instant after it.
            moment = local.replace(tzinfo=rule.zone).astimezone(UTC)
        else:
            moment = rule.start_at.astimezone(UTC)
        moment += clock
    except (OverflowError, ValueError):
        return None  # past what a datetime holds: past LATEST
    return moment if moment <= LATEST else None


def _first_index(rule: Rule, parts: dict[str, int], after: datetime) -> int:
    """The least n whose step falls strictly after ``after``: an estimate from the mean
    length of the interval, then a few steps either way."""
    if after < rule.start_at:
        return 0
    n = max(int((after - rule.start_at).total_seconds() // _approx_seconds(parts)) - 1, 0)

    def beyond(i: int) -> bool:
        moment = _interval_at(rule, parts, i)
        return moment is None or moment > after

    for _ in range(MAX_SKIPPED):
        if not beyond(n):
            n += 1
        elif n > 0 and beyond(n - 1):
            n -= 1
        else:
            return n
    raise _give_up(rule)


def _iter_interval(rule: Rule, after: datetime) -> Iterator[datetime]:
    parts = parse_interval(rule.interval)
    n = _first_index(rule, parts, after)
    previous = _interval_at(rule, parts, n - 1) if n > 0 else None
    skipped = 0
    while True:
        moment = _interval_at(rule, parts, n)
        if moment is None:
            return  # past LATEST: the series has run out
        if _kept(rule, previous, moment):
            skipped = 0
            yield moment
        else:
            skipped += 1
            if skipped > MAX_SKIPPED:
                raise _give_up(rule)
        previous = moment
        n += 1


# --- cron rules --------------------------------------------------------------------------------


def _wall(moment: datetime, tz: ZoneInfo) -> datetime:
    return moment.astimezone(tz).replace(tzinfo=None)


def _transition(tz: ZoneInfo, before: datetime, at: datetime) -> datetime:
    """The instant in (before, at] at which the offset ``at`` has took effect (``before``
    has another one): bisection over whole seconds, at most 17 steps for a day-long change."""
    offset = at.astimezone(tz).utcoffset()
    low, high = math.floor(before.timestamp()), math.ceil(at.timestamp())
    while high - low > 1:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, UTC).astimezone(tz).utcoffset() == offset:
            high = middle
        else:
            low = middle
    return datetime.fromtimestamp(high, UTC)


def _instant(wall: datetime, tz: ZoneInfo) -> tuple[datetime, datetime | None]:
    """The instant a wall-clock match fires at and, for one inside a spring-forward gap,
    the wall time the gap ends at. A repeated wall time fires the first time round; one
    that does not exist fires when the gap ends (at the transition)."""
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if _wall(first, tz) == wall:
        return first, None
    # In a gap, fold=1 reads the wall time with the offset after the change (an instant
    # before the transition) and fold=0 with the one before it (an instant after).
    transition = _transition(tz, wall.replace(tzinfo=tz, fold=1).astimezone(UTC), first)
    return transition, _wall(transition, tz)


def _cron_from_wall(rule: Rule, base: datetime) -> datetime:
    """The wall time to search from for the matches that fire strictly after ``base``.
    When ``base`` falls in the second pass of a repeated hour, every wall time up to the
    end of that hour fired on the first pass, before ``base``: search from its end."""
    tz = rule.zone
    local = base.astimezone(tz)
    wall = local.replace(tzinfo=None)
    if not local.fold:
        return wall
    first_pass = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    transition = _transition(tz, first_pass, base)
    return _wall(transition, tz) + (base - first_pass) - _MICROSECOND


def _iter_cron_raw(rule: Rule, from_wall: datetime) -> Iterator[tuple[datetime, datetime]]:
    """(instant, wall time) of each match after ``from_wall``, in order. The matches
    inside one spring-forward gap all fire at its end, so only its first is looked at.
    Stops when the next match is more than CRON_MAX_GAP away, or past LATEST."""
    tz = rule.zone
    it = _cron(rule.cron, from_wall)
    previous = from_wall
    while True:
        wall = _cron_step(it)
        if wall is None or wall - previous > CRON_MAX_GAP:
            return
        moment, gap_end = _instant(wall, tz)
        if moment > LATEST:
            return
        yield moment, wall
        previous = wall
        if gap_end is not None and gap_end > wall:
            it = _cron(rule.cron, gap_end - _MICROSECOND)


def _iter_cron(rule: Rule, after: datetime) -> Iterator[datetime]:
    start = rule.start_at
    base = max(after, start - _MICROSECOND)
    raw = _iter_cron_raw(rule, _cron_from_wall(rule, base))
    first = next(raw, None)
    if first is None:
        return
    # The floor compares each match with the one before it: one step back for the first
    # (a match before the start is no occurrence).
    before = _cron_step(_cron(rule.cron, first[1]), back=True)
    previous = _instant(before, rule.zone)[0] if before is not None else None
    if previous is not None and previous < start:
        previous = None
    skipped = 0
    for moment, _wall_time in itertools.chain([first], raw):
        if moment > base and _kept(rule, previous, moment):
            skipped = 0
            yield moment
        else:
            skipped += 1
            if skipped > MAX_SKIPPED:
                raise _give_up(rule)
        if moment >= start:
            previous = moment


def _rfc3339(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")
