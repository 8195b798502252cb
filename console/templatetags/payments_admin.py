"""The date hierarchy for a table of millions of rows.

Django's ``date_hierarchy`` lists the years (months, days) that hold rows with a
``SELECT DISTINCT date_trunc(...)`` over every matching row: a full scan of the table
on each changelist view. This one lists every year (month, day) between the first and
the last matching row instead, from ``min()`` and ``max()`` (read once per page, by the
admin's ``date_hierarchy_bounds`` when it has one: payments answer it from the ends of
three partial indexes, selectors.payment_execute_at_bounds). A listed month may hold no
rows; its page is then empty.
"""

from datetime import UTC, datetime, timedelta
from functools import partial

from django import template
from django.contrib.admin.templatetags.admin_list import date_hierarchy
from django.contrib.admin.templatetags.base import InclusionAdminNode
from django.db.models import Max, Min
from django.utils.functional import cached_property

from common.console_tags import plain_id

register = template.Library()


def aggregate_bounds(queryset, field_name: str) -> dict:
    return queryset.aggregate(first=Min(field_name), last=Max(field_name))


def datetime_span(queryset, field_name: str, kind: str, *, bounds: dict | None = None) -> list[datetime]:
    """Every ``kind`` (year, month, day) from the first to the last value of the field, in UTC."""
    if bounds is None:
        bounds = aggregate_bounds(queryset, field_name)
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
    """What Django's date_hierarchy asks of the queryset: the field's first and last
    value (``aggregate``) and the units between them (``datetimes``), from one read."""

    def __init__(self, queryset, bounds):
        self._queryset = queryset
        self._bounds = bounds

    @cached_property
    def bounds(self) -> dict:
        return self._bounds(self._queryset)

    def aggregate(self, **kwargs):
        return dict(self.bounds)  # Django asks for exactly first=Min(field), last=Max(field)

    def datetimes(self, field_name, kind):
        return datetime_span(self._queryset, field_name, kind, bounds=self.bounds)


class _SpanChangeList:
    """The changelist as Django's date_hierarchy sees it, with the cheap span."""

    def __init__(self, changelist):
        self._changelist = changelist
        bounds = getattr(changelist.model_admin, "date_hierarchy_bounds", None)
        known = getattr(changelist, "date_hierarchy_range", None)
        if known is not None:  # a filter bounds the field already: span its range, read nothing
            start, end = known
            bounds = lambda queryset: {"first": start, "last": end - timedelta(microseconds=1)}  # noqa: E731
        elif bounds is None:
            bounds = partial(aggregate_bounds, field_name=changelist.date_hierarchy)
        self.queryset = _SpanQuerySet(changelist.queryset, bounds)

    def __getattr__(self, name):
        return getattr(self._changelist, name)


def span_date_hierarchy(cl):
    return date_hierarchy(_SpanChangeList(cl))


@register.tag(name="span_date_hierarchy")
def span_date_hierarchy_tag(parser, token):
    return InclusionAdminNode(
        parser, token, func=span_date_hierarchy, template_name="date_hierarchy.html", takes_context=False
    )


# The console's id filter, also here so payments' templates need one {% load %}.
register.filter("plain_id", plain_id)
