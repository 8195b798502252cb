"""Strict serializer fields: money and time are not guessed."""

import re
from datetime import UTC, datetime, timedelta

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from common.text import validate_display_text
from payments.rules import RuleError, parse_interval

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


class DisplayTextField(StrictCharField):
    """Text a person gives for people to read (a name, a description, a reason): no
    control, format (bidirectional, zero-width), private-use, surrogate or separator
    characters (common/text.py, the rule the admin's forms use too)."""

    def __init__(self, **kwargs):
        help_text = kwargs.pop("help_text", "")
        super().__init__(help_text=f"{help_text} {DISPLAY_TEXT_HELP}".strip(), **kwargs)
        self.validators.append(validate_display_text)


DISPLAY_TEXT_HELP = (
    "No control, format (bidirectional, zero-width), private-use or line/paragraph separator characters "
    "(400 validation_error)."
)



def format_duration(value: timedelta | None) -> str | None:
    """ISO 8601 in days, hours, minutes and seconds (``P1DT2H``, ``PT30M``); None stays None."""
    if value is None:
        return None
    days, rest = value.days, int(value.total_seconds()) - value.days * 86400
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    clock = "".join(f"{n}{unit}" for n, unit in ((hours, "H"), (minutes, "M"), (seconds, "S")) if n)
    text = "P" + (f"{days}D" if days else "") + (f"T{clock}" if clock else "")
    return text if text != "P" else "PT0S"


_DURATION_TIME = r"T(?:\d+H(?:\d+M)?(?:\d+S)?|\d+M(?:\d+S)?|\d+S)"
DURATION_PATTERN = rf"^P(?:\d+W(?:\d+D)?(?:{_DURATION_TIME})?|\d+D(?:{_DURATION_TIME})?|{_DURATION_TIME})$"


@extend_schema_field({"type": "string", "pattern": DURATION_PATTERN, "maxLength": 40, "example": "PT30M"})
class StrictDurationField(serializers.Field):
    """An ISO 8601 duration of whole weeks, days, hours, minutes and seconds (``PT30M``,
    ``P1DT12H``, ``P2W``). Years and months are refused: their length varies, and an
    expiry must be a fixed span. Rendered back in days, hours, minutes and seconds."""

    default_error_messages = {
        "invalid": "Must be an ISO 8601 duration in weeks, days, hours, minutes and whole seconds, e.g. PT30M.",
        "calendar": "Years and months are not allowed here (their length varies); use days, e.g. P30D.",
    }

    def to_internal_value(self, data):
        if not isinstance(data, str) or len(data) > 40:
            self.fail("invalid")
        try:
            parts = parse_interval(data)
        except RuleError:
            self.fail("invalid")
        if parts.get("years") or parts.get("months"):
            self.fail("calendar")
        return timedelta(**parts)

    def to_representation(self, value):
        return format_duration(value)
