"""Strict serializer fields: money and time are not guessed."""

import re
from datetime import UTC, datetime, timedelta

from rest_framework import serializers

# RFC 3339 section 5.6 date-time: full date, "T", full time with seconds, optional
# fraction, and a mandatory offset. Python's fromisoformat also takes week dates, basic
# format and missing seconds; none of those is RFC 3339, so they are not accepted.
_RFC3339 = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})[Tt](?P<time>\d{2}:\d{2}:\d{2})(?:\.(?P<fraction>\d{1,9}))?"
    r"(?:(?P<utc>[Zz])|(?P<sign>[+-])(?P<hours>\d{2}):(?P<minutes>\d{2}))"
)


def parse_rfc3339(value: str) -> datetime:
    """An aware datetime in UTC; ValueError unless ``value`` is an RFC 3339 date-time
    with an offset. Fractions beyond microseconds are truncated; leap seconds refused."""
    match = _RFC3339.fullmatch(value)
    if match is None:
        raise ValueError("not an RFC 3339 date-time with an offset")
    offset = timedelta(0)
    if not match["utc"]:
        hours, minutes = int(match["hours"]), int(match["minutes"])
        if hours > 23 or minutes > 59:
            raise ValueError("offset out of range")
        offset = timedelta(hours=hours, minutes=minutes) * (-1 if match["sign"] == "-" else 1)
    fraction = (match["fraction"] or "").ljust(6, "0")[:6]
    parsed = datetime.fromisoformat(f"{match['date']}T{match['time']}.{fraction}")  # ValueError if impossible
    try:
        return (parsed - offset).replace(tzinfo=UTC)
    except OverflowError:
        raise ValueError("out of range") from None


def format_utc(value):
    """RFC 3339 in UTC with a ``Z``; None stays None."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


class StrictIntegerField(serializers.IntegerField):
    """Accept a JSON integer only: not ``"10"``, ``10.0``, ``1e3``, ``true`` or ``null``.

    DRF's IntegerField coerces strings and integral floats; money must not be coerced.
    """

    default_error_messages = {"invalid": "Must be a JSON integer."}

    def to_internal_value(self, data):
        if type(data) is not int:  # bool is a subclass of int: excluded by the exact type check
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictDateTimeField(serializers.DateTimeField):
    """RFC 3339 with an explicit offset; a naive time is rejected, not assumed UTC.
    Rendered in UTC with a ``Z``."""

    default_error_messages = {
        "invalid": "Must be an RFC 3339 date-time with an offset, e.g. 2030-01-01T12:00:00Z.",
        "naive": "Must carry an explicit UTC offset (Z or +hh:mm).",
    }

    def to_internal_value(self, value):
        if not isinstance(value, str) or len(value) > 64:
            self.fail("invalid")
        try:
            return parse_rfc3339(value)
        except ValueError:
            pass
        naive = re.fullmatch(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?", value)
        self.fail("naive" if naive else "invalid")

    def to_representation(self, value):
        return format_utc(value)


class StrictCharField(serializers.CharField):
    """A JSON string only; DRF's CharField would turn 123 into "123"."""

    default_error_messages = {"invalid": "Must be a string."}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)

