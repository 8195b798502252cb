"""Human formats for the console: the one helper every admin display calls and the one
template filter (``{{ value|human }}``, ``{% load console %}``) every console template
uses, so a number, a time, a rule or a reason reads the same on every page.

* integers (money is integer minor units) with thousands separators: 1,000,000;
* datetimes in UTC to the second, saying so: 2026-12-05 01:02:03 UTC;
* ISO 8601 durations (a recurring rule's interval) in words: PT1M -> "1 minute",
  ``human("PT1M", "every")`` -> "every 1 minute"; a timedelta likewise;
* a user as their username, never their id;
* a reason code as a plain sentence with the code after it (``Coded``, built where the
  codes are defined: payments/reasons.py).

The API keeps its machine formats (RFC 3339, codes); this is for staff reading a page.
"""

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

# An ISO 8601 duration as recurring rules take it (payments/rules.py parses rules with it).
ISO_DURATION = re.compile(
    r"^P(?!$)(?:(?P<years>\d+)Y)?(?:(?P<months>\d+)M)?(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?:T(?=\d)(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+)S)?)?$"
)
DURATION_UNITS = ("years", "months", "weeks", "days", "hours", "minutes", "seconds")

# What an empty value reads as.
NOTHING = "-"


@dataclass(frozen=True)
class Coded:
    """A code the product records (a failure or review reason) and its sentence for staff."""

    code: str
    sentence: str

    def __str__(self) -> str:
        return f"{self.sentence} ({self.code})" if self.sentence else self.code

    @property
    def headline(self) -> str:
        """The sentence's words before its colon, for a narrow list column: "Insufficient funds"."""
        return self.sentence.split(":", 1)[0]


def utc_time(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration_words(parts: dict[str, int]) -> str:
    """{"hours": 1, "minutes": 30} -> "1 hour 30 minutes"."""
    words = [f"{parts[unit]:,} {unit[:-1] if parts[unit] == 1 else unit}" for unit in DURATION_UNITS
             if parts.get(unit)]
    return " ".join(words) or "0 seconds"


def iso_duration_words(text: str) -> str:
    """"PT1M" -> "1 minute"; text that is not an ISO 8601 duration is shown as it is."""
    match = ISO_DURATION.match(text)
    if not match:
        return text
    return duration_words({unit: int(n) for unit, n in match.groupdict().items() if n is not None})


def timedelta_words(value: timedelta) -> str:
    seconds = int(value.total_seconds())
    days, rest = divmod(abs(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds_left = divmod(rest, 60)
    words = duration_words({"days": days, "hours": hours, "minutes": minutes, "seconds": seconds_left})
    return f"-{words}" if seconds < 0 else words


def human(value, kind: str = "") -> str:
    """``value`` as staff read it (see the module's docstring). ``kind`` says what a string
    is when its type cannot: "duration" (an ISO 8601 duration) or "every" (a recurring
    rule's interval); "headline" shortens a reason to its sentence's first words (a list
    column; the whole sentence is on the object's page). Anything else is shown as it is;
    nothing at all as "-"."""
    if value is None or value == "":
        return NOTHING
    if kind in ("duration", "every") and isinstance(value, str | timedelta):
        words = iso_duration_words(value) if isinstance(value, str) else timedelta_words(value)
        return f"every {words}" if kind == "every" else words
    if isinstance(value, Coded):
        return f"{value.headline} ({value.code})" if kind == "headline" and value.sentence else str(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, datetime):
        return utc_time(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return timedelta_words(value)
    if hasattr(value, "get_username"):
        return value.get_username()
    return str(value)
