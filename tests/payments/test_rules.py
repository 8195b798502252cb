import itertools
from datetime import UTC, datetime

import pytest

from payments.rules import (
    LATEST,
    MAX_CRON_COUNT,
    Rule,
    RuleError,
    check_rule,
    iter_occurrences,
    next_occurrence,
    nth_occurrence,
    occurrences_between,
    parse_interval,
    shortest_interval_seconds,
)

BERLIN = "Europe/Berlin"


def utc(*args):
    return datetime(*args, tzinfo=UTC)


def series(rule, n, after=None):
    out, cursor = [], after or utc(1970, 1, 1)
    for _ in range(n):
        moment = next_occurrence(rule, after=cursor)
        if moment is None:
            break
        out.append(moment)
        cursor = moment
    return out


def test_month_end_lands_on_last_day_and_comes_back():
    rule = Rule(start_at=utc(2027, 1, 31, 9), interval="P1M")
    days = [m.date().isoformat() for m in series(rule, 5)]
    assert days == ["2027-01-31", "2027-02-28", "2027-03-31", "2027-04-30", "2027-05-31"]


def test_leap_year_february():
    rule = Rule(start_at=utc(2028, 1, 31, 9), interval="P1M")
    assert series(rule, 2)[1].date().isoformat() == "2028-02-29"


def test_daily_interval_keeps_local_wall_time_across_dst():
    # 12:00 in Berlin is 11:00 UTC in winter and 10:00 UTC in summer (DST starts 2027-03-28).
    rule = Rule(start_at=datetime(2027, 3, 27, 11, tzinfo=UTC), interval="P1D", timezone=BERLIN)
    assert [m.hour for m in series(rule, 3)] == [11, 10, 10]


def test_hourly_interval_is_elapsed_time_across_dst():
    rule = Rule(start_at=utc(2027, 3, 28, 0, 30), interval="PT1H", timezone=BERLIN)
    moments = series(rule, 3)
    assert [(b - a).total_seconds() for a, b in itertools.pairwise(moments)] == [3600, 3600]


def test_cron_friday_noon_in_berlin_across_dst():
    rule = Rule(start_at=utc(2027, 3, 20), cron="0 12 * * FRI", timezone=BERLIN)
    moments = series(rule, 3)
    assert [m.isoformat() for m in moments] == [
        "2027-03-26T11:00:00+00:00",  # CET
        "2027-04-02T10:00:00+00:00",  # CEST
        "2027-04-09T10:00:00+00:00",
    ]


def test_cron_wall_time_repeated_when_clocks_go_back_fires_once():
    # 2027-10-31 02:30 happens twice in Berlin.
    rule = Rule(start_at=utc(2027, 10, 29), cron="30 2 * * *", timezone=BERLIN)
    days = [m.astimezone().date().isoformat() for m in series(rule, 4)]
    assert len(set(days)) == 4
    assert [m.isoformat() for m in series(rule, 4)][2:] == ["2027-10-31T00:30:00+00:00", "2027-11-01T01:30:00+00:00"]


def test_cron_wall_time_skipped_when_clocks_go_forward_fires_after_the_gap():
    # 2027-03-28 02:30 does not exist in Berlin; it fires at 03:00 CEST (01:00 UTC).
    rule = Rule(start_at=utc(2027, 3, 27), cron="30 2 * * *", timezone=BERLIN)
    assert [m.isoformat() for m in series(rule, 3)] == [
        "2027-03-27T01:30:00+00:00",
        "2027-03-28T01:00:00+00:00",
        "2027-03-29T00:30:00+00:00",
    ]


def test_count_becomes_the_instant_of_the_last_occurrence():
    assert nth_occurrence(Rule(start_at=utc(2027, 1, 31), interval="P1M"), 3) == utc(2027, 3, 31)
    assert nth_occurrence(Rule(start_at=utc(2027, 1, 1), interval="P1D", end_at=utc(2027, 1, 2)), 3) is None
    assert nth_occurrence(Rule(start_at=utc(2027, 1, 1, 0, 5), cron="0 12 * * *"), 1) == utc(2027, 1, 1, 12)


def test_end_at_stops_the_series():
    rule = Rule(start_at=utc(2027, 1, 1), interval="P1D", end_at=utc(2027, 1, 3))
    assert [m.day for m in series(rule, 10)] == [1, 2, 3]


def test_next_occurrence_from_an_arbitrary_instant():
    rule = Rule(start_at=utc(2027, 1, 31), interval="P1M")
    assert next_occurrence(rule, after=utc(2027, 6, 15)) == utc(2027, 6, 30)
    assert next_occurrence(rule, after=utc(2027, 6, 30)) == utc(2027, 7, 31)
    assert next_occurrence(rule, after=utc(2026, 1, 1)) == utc(2027, 1, 31)


def test_occurrences_between_lists_the_missed_ones():
    rule = Rule(start_at=utc(2027, 1, 1), interval="P1D")
    missed = occurrences_between(rule, after=utc(2027, 1, 1), until=utc(2027, 1, 4, 12))
    assert [m.day for m in missed] == [2, 3, 4]


@pytest.mark.parametrize("text", ["", "P", "PT", "1D", "P1.5D", "P0D", "P1H", "PT1D", "-P1D"])
def test_bad_intervals(text):
    with pytest.raises(RuleError):
        parse_interval(text)


def test_shortest_interval():
    assert shortest_interval_seconds(Rule(start_at=utc(2027, 1, 1), interval="PT90S")) == 90
    assert shortest_interval_seconds(Rule(start_at=utc(2027, 1, 1), cron="*/5 * * * *")) == 300
    assert shortest_interval_seconds(Rule(start_at=utc(2027, 1, 1), interval="P1D")) == 23 * 3600


# --- rules that used to crash (500 on create; an exception in every promoter tick) -----


@pytest.mark.parametrize("cron", ["0 0 30 2 *", "0 0 31 4 *"])
def test_a_cron_that_matches_no_date_is_a_rule_error(cron):
    with pytest.raises(RuleError) as err:
        check_rule(Rule(start_at=utc(2027, 1, 1), cron=cron))
    assert err.value.field == "cron"
    assert next_occurrence(Rule(start_at=utc(2027, 1, 1), cron=cron), after=utc(2027, 1, 1)) is None


@pytest.mark.parametrize(
    "text",
    [
        "P11Y", "P99999999999999999999D", "PT999999999999S", "P1000000Y",
        # The bound is on the whole duration, not only its years and months (issue 33).
        "P121M", "P10Y1D", "P10YT1S", "P9Y12M1D", "P9Y11M29D", "P3651D", "P3660D", "P522W", "PT87700H",
        "PT87601H", "PT5256001M", "PT315360001S", "P1Y3286D",
    ],
)
def test_intervals_longer_than_ten_years_are_refused(text):
    with pytest.raises(RuleError, match="at most 10 years") as err:
        parse_interval(text)
    assert err.value.field == "interval"


@pytest.mark.parametrize(
    "text", ["P10Y", "P120M", "P9Y12M", "P9Y11M28D", "P3650D", "P521W3D", "PT87600H", "PT315360000S", "P1Y3285D"]
)
def test_intervals_of_at_most_ten_years_are_accepted(text):
    assert parse_interval(text)


@pytest.mark.parametrize(
    "rule",
    [
        Rule(start_at=utc(9995, 1, 1), interval="P2Y"),
        Rule(start_at=utc(9999, 12, 28), interval="PT23H"),
        Rule(start_at=utc(9995, 1, 1), cron="0 0 1 1 *"),
    ],
    ids=["calendar", "clock", "cron"],
)
def test_a_series_ends_at_the_last_representable_instant_instead_of_raising(rule):
    moments = series(rule, 10)
    assert 1 <= len(moments) < 10
    assert moments[-1] <= LATEST
    assert next_occurrence(rule, after=moments[-1]) is None


def test_a_count_reaching_past_year_9999_does_not_raise():
    assert nth_occurrence(Rule(start_at=utc(2027, 1, 1), interval="P1Y"), 10_000) is None
    assert nth_occurrence(Rule(start_at=utc(9500, 1, 1), cron="0 0 1 1 *"), MAX_CRON_COUNT) is None


# --- the bounds (issue 14): the calendar, rare cron rules, counts ---------------------------


@pytest.mark.parametrize(
    "rule",
    [
        Rule(start_at=datetime.min.replace(tzinfo=UTC), interval="P1D"),
        Rule(start_at=utc(1969, 12, 31, 23, 59, 59), cron="0 0 * * *"),
        Rule(start_at=utc(9999, 12, 31, 23), cron="0 0 * * *", timezone="Pacific/Kiritimati"),
        Rule(start_at=datetime.max.replace(tzinfo=UTC), interval="PT1H"),
    ],
    ids=["year-1", "before-1970", "9999-kiritimati", "max"],
)
def test_a_start_outside_the_calendar_is_a_start_at_error_everywhere(rule):
    with pytest.raises(RuleError) as err:
        check_rule(rule)
    assert err.value.field == "start_at"
    for call in (lambda: next_occurrence(rule, after=utc(2027, 1, 1)), lambda: nth_occurrence(rule, 3)):
        with pytest.raises(RuleError) as err:
            call()
        assert err.value.field == "start_at"


@pytest.mark.parametrize("cron", ["0 0 29 2 *", "0 0 * 2 1#5", "0 0 31 2,4 *"])
def test_a_cron_that_fires_less_than_once_a_year_is_refused(cron):
    with pytest.raises(RuleError) as err:
        check_rule(Rule(start_at=utc(2027, 1, 1), cron=cron))
    assert err.value.field == "cron"
    assert "366 days" in str(err.value)


def test_a_yearly_cron_and_one_whose_day_fields_are_ored_are_accepted():
    check_rule(Rule(start_at=utc(2027, 1, 1), cron="0 0 1 1 *"))
    check_rule(Rule(start_at=utc(2027, 1, 1), cron="0 0 29 2 1"))  # Feb 29 or any Monday in February


def test_a_cron_count_is_capped_and_an_interval_count_is_not():
    with pytest.raises(RuleError) as err:
        nth_occurrence(Rule(start_at=utc(2027, 1, 1), cron="0 0 29 2 1"), MAX_CRON_COUNT + 1)
    assert err.value.field == "count"
    assert nth_occurrence(Rule(start_at=utc(2027, 1, 1), interval="P1D"), 10_000) == utc(2054, 5, 18)


def test_a_day_a_time_zone_skipped_pays_once():
    # Samoa skipped 2011-12-30: noon on the 30th and noon on the 31st are the same instant.
    rule = Rule(start_at=datetime(2011, 12, 28, 22, tzinfo=UTC), interval="P1D", timezone="Pacific/Apia")
    assert [m.isoformat() for m in series(rule, 4, after=utc(2011, 12, 1))] == [
        "2011-12-28T22:00:00+00:00",
        "2011-12-29T22:00:00+00:00",
        "2011-12-30T22:00:00+00:00",
        "2011-12-31T22:00:00+00:00",
    ]


def test_a_clock_change_never_brings_two_occurrences_closer_than_the_minimum():
    # Monrovia moved from -00:44:30 to UTC on 1972-01-07: every minute of wall clock, but
    # 00:45 would fire 30 s after the instant the gap ends at. Left out.
    rule = Rule(start_at=utc(1972, 1, 6), cron="* * * * *", timezone="Africa/Monrovia", min_gap=60)
    moments = list(itertools.islice(iter_occurrences(rule, after=utc(1972, 1, 7, 0, 42)), 4))
    assert [m.isoformat() for m in moments] == [
        "1972-01-07T00:42:30+00:00",
        "1972-01-07T00:43:30+00:00",
        "1972-01-07T00:44:30+00:00",
        "1972-01-07T00:46:00+00:00",
    ]


def test_a_repeated_hour_fires_once_also_when_asked_from_its_second_pass():
    # Berlin, 2027-10-31: 02:00-03:00 happens twice (00:00-01:00 and 01:00-02:00 UTC).
    rule = Rule(start_at=utc(2027, 10, 30), cron="*/20 * * * *", timezone=BERLIN)
    first_pass = list(itertools.islice(iter_occurrences(rule, after=utc(2027, 10, 31, 0, 30)), 3))
    assert [m.isoformat() for m in first_pass] == [
        "2027-10-31T00:40:00+00:00", "2027-10-31T02:00:00+00:00", "2027-10-31T02:20:00+00:00",
    ]
    assert next_occurrence(rule, after=utc(2027, 10, 31, 1, 10)) == utc(2027, 10, 31, 2)
