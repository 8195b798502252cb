"""The date hierarchy for a table of millions of rows.

Django's ``date_hierarchy`` lists the years (months, days) that hold rows with a
``SELECT DISTINCT date_trunc(...)`` over every matching row: a full scan of the table
on each changelist view. This one lists every year (month, day) between the first and
the last matching row instead, from ``min()`` and ``max()``, which the execute_at index
answers without a scan. A listed month may hold no rows; its page is then empty.
"""

from datetime import UTC, datetime, timedelta

from django import template
from django.contrib.admin.templatetags.admin_list import date_hierarchy
from django.contrib.admin.templatetags.base import InclusionAdminNode
from django.db.models import Max, Min

register = template.Library()


def datetime_span(queryset, field_name: str, kind: str) -> list[datetime]:
    """Every ``kind`` (year, month, day) from the first to the last value of the field, in UTC."""
    bounds = queryset.aggregate(first=Min(field_name), last=Max(field_name))
    first, last = bounds["first"], bounds["last"]
    if first is None or last is None:
        return []
    first, last = first.astimezone(UTC), last.astimezone(UTC)
    if kind == "year":
        return [datetime(y, 1, 1, tzinfo=UTC) for y in range(first.year, last.year + 1)]
    if kind == "month":
        months = range(first.year * 12 + first.month - 1, last.year * 12 + last.month)
        return [datetime(m // 12, m % 12 + 1, 1, tzinfo=UTC) for m in months]
    start = datetime(first.year, first.month, first.day, tzinfo=UTC)
    return [start + timedelta(days=d) for d in range((last.date() - first.date()).days + 1)]


class _SpanQuerySet:
    def __init__(self, queryset):
        self._queryset = queryset

    def aggregate(self, **kwargs):
        return self._queryset.aggregate(**kwargs)

    def datetimes(self, field_name, kind):
        return datetime_span(self._queryset, field_name, kind)


class _SpanChangeList:
    """The changelist as Django's date_hierarchy sees it, with the cheap span."""

    def __init__(self, changelist):
        self._changelist = changelist
        self.queryset = _SpanQuerySet(changelist.queryset)

    def __getattr__(self, name):
        return getattr(self._changelist, name)


def span_date_hierarchy(cl):
    return date_hierarchy(_SpanChangeList(cl))


@register.tag(name="span_date_hierarchy")
def span_date_hierarchy_tag(parser, token):
    return InclusionAdminNode(
        parser, token, func=span_date_hierarchy, template_name="date_hierarchy.html", takes_context=False
    )
