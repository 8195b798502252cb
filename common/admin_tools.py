"""Building blocks shared by the payments and ledger admin consoles.

The admin is a window on money and its audit trail: it reads, and it changes state only
through services (cancel, freeze, deposit). Nothing here edits a row by hand.
"""

import json

from django.contrib import admin, messages
from django.contrib.admin import ShowFacets
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import get_permission_codename
from django.core.paginator import Paginator
from django.forms.models import BaseInlineFormSet
from django.urls import path
from django.utils.functional import cached_property
from django.utils.html import format_html

# Changelists count at most this many rows exactly; past it they show the planner's
# estimate, so no page of a large table waits on a COUNT(*) that reads every row.
EXACT_COUNT_LIMIT = 10_000


def planner_row_estimate(queryset) -> int:
    """PostgreSQL's estimate of how many rows ``queryset`` returns: one EXPLAIN, no scan."""
    plan = json.loads(queryset.order_by().explain(format="json"))
    return int(plan[0]["Plan"]["Plan Rows"])


class EstimatedCountPaginator(Paginator):
    """Exact counts up to EXACT_COUNT_LIMIT (a COUNT over a LIMITed subquery, so it
    stops reading there); above it, the planner's estimate, and ``estimated`` tells the
    pagination template to say "about"."""

    estimated = False

    @cached_property
    def count(self) -> int:
        bounded = self.object_list.order_by()[: EXACT_COUNT_LIMIT + 1].count()
        if bounded <= EXACT_COUNT_LIMIT:
            return bounded
        self.estimated = True
        return max(planner_row_estimate(self.object_list), bounded)


class LimitedChangeList(ChangeList):
    """A changelist whose row query always carries a LIMIT.

    Django drops the LIMIT when everything fits on one page. On a filter whose row
    estimate is far too high (``execute_at <= now()`` and a status are correlated, the
    planner assumes they are not) that turns a few index lookups into a sort of the
    whole table; with the LIMIT the planner keeps to the indexes.
    """

    def get_filters(self, request):
        """The date drill-down's range (``<field>__gte``/``__lt``, set by Django from
        ``<field>__year`` ...) goes through the admin's ``date_hierarchy_condition`` when
        it has one: a range over every row may need a shape the indexes can serve."""
        specs, has_filters, params, may_have_duplicates, has_active = super().get_filters(request)
        self.date_range = {}
        if self.date_hierarchy and hasattr(self.model_admin, "date_hierarchy_condition"):
            for key in (f"{self.date_hierarchy}__gte", f"{self.date_hierarchy}__lt"):
                if key in params:
                    self.date_range[key] = params.pop(key)[-1]
        return specs, has_filters, params, may_have_duplicates, has_active

    def get_queryset(self, request, exclude_parameters=None):
        queryset = super().get_queryset(request, exclude_parameters)
        if self.date_range:
            queryset = queryset.filter(self.model_admin.date_hierarchy_condition(**self.date_range))
        return queryset

    def get_results(self, request):
        super().get_results(request)
        if not self.multi_page or (self.show_all and self.can_show_all):
            limit = self.list_max_show_all if self.show_all else self.list_per_page
            self.result_list = self.queryset[:limit]


class ReadOnlyAdminMixin:
    """No add, no change, no delete: rows change only through services (actions and
    buttons that call them). Works for ModelAdmin and inlines alike."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class LargeTableAdminMixin:
    """Changelist settings for tables of millions of rows: no full COUNT(*)."""

    paginator = EstimatedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    list_max_show_all = 500
    show_facets = ShowFacets.NEVER  # "Show counts" would COUNT every filter choice over the table

    def get_changelist(self, request, **kwargs):
        return LimitedChangeList


class LatestRowsInlineFormSet(BaseInlineFormSet):
    """An inline that shows only the first ``max_rows`` rows in the inline's ordering
    (newest first): a recurring payment's occurrences and events grow without bound."""

    max_rows = 50

    def get_queryset(self):
        if not hasattr(self, "_latest_rows"):
            self._latest_rows = super().get_queryset()[: self.max_rows]
        return self._latest_rows


def has_model_permission(model_admin, request, action: str) -> bool:
    """Whether the user holds ``<app>.<action>_<model>`` (a Meta permission such as cancel)."""
    opts = model_admin.opts
    return request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")


def object_view_url(model_admin, name: str, view):
    """``<object_id>/<name>/`` under the model's admin, behind the admin's login and CSRF
    checks, reversible as ``admin:<app>_<model>_<name>``."""
    opts = model_admin.opts
    return path(
        f"<path:object_id>/{name}/",
        model_admin.admin_site.admin_view(view),
        name=f"{opts.app_label}_{opts.model_name}_{name}",
    )


def display_column(attr: str, render, description: str, ordering: str | None = None):
    """A column (list or detail page) showing ``render(obj.<attr>)``, sortable by
    ``ordering`` (``attr`` by default)."""

    @admin.display(description=description, ordering=ordering or attr)
    def column(model_admin, obj):
        return render(getattr(obj, attr))

    return column


def badge(value: str, tone: str):
    """A coloured pill; the colours live in templates/admin/delaypay_styles.html."""
    return format_html('<span class="dp-badge dp-{}">{}</span>', tone, value)


def utc_text(value) -> str:
    """A timestamp for a narrow list column (the header says UTC)."""
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def report(request, level: int, label: str, items: list[str]) -> None:
    """One admin message per outcome, naming every object it applies to."""
    if items:
        messages.add_message(request, level, f"{label}: {', '.join(items)}.")

