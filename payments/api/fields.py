"""Strict serializer fields: money and time are not guessed."""

from datetime import UTC

from django.utils.dateparse import parse_datetime
from rest_framework import serializers


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
            parsed = parse_datetime(value.strip())
        except (ValueError, OverflowError):
            parsed = None
        if parsed is None or "T" not in value.upper():
            self.fail("invalid")
        if parsed.tzinfo is None or parsed.utcoffset() is None:
            self.fail("naive")
        return parsed

    def to_representation(self, value):
        return format_utc(value)


def format_utc(value):
    """ISO 8601 in UTC with a ``Z``; None stays None."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


class StrictCharField(serializers.CharField):
    """A JSON string only; DRF's CharField would turn 123 into "123"."""

    default_error_messages = {"invalid": "Must be a string."}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)
