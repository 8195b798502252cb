"""``{% load money %}``: amounts and counts with thousands separators (1,234,567), the
same in every locale, as the API's integers are: ``{{ amount|money }}``."""

from django import template

register = template.Library()


def thousands(value) -> str:
    """1234567 -> "1,234,567"; anything that is not an integer is shown as it is."""
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(value)
        except (TypeError, ValueError):
            return "" if value is None else str(value)
    return f"{value:,}"


register.filter("money", thousands)
