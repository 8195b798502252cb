"""Building blocks shared by the payments and ledger admin consoles.

The admin is a window on money and its audit trail: it reads, and it changes state only
through services (cancel, freeze, deposit). Nothing here edits a row by hand.
"""

import json

from django.contrib import messages
from django.core.paginator import Paginator
from django.utils.functional import cached_property
from django.utils.html import format_html

# Above this many rows (the planner's estimate) the changelist shows the estimate
# instead of running COUNT(*), which reads every matching row of a large table.
EXACT_COUNT_LIMIT = 10_000


def planner_row_estimate(queryset) -> int:
    """PostgreSQL's estimate of how many rows ``queryset`` returns: one EXPLAIN, no scan."""
    plan = json.loads(queryset.order_by().explain(format="json"))
    return int(plan[0]["Plan"]["Plan Rows"])


class EstimatedCountPaginator(Paginator):
    """Exact counts for small results, the planner's estimate for large ones.

    ``estimated`` tells the pagination template to say "about".
    """

    estimated = False

    @cached_property
    def count(self) -> int:
        estimate = planner_row_estimate(self.object_list)
        if estimate > EXACT_COUNT_LIMIT:
            self.estimated = True
            return estimate
        return self.object_list.count()


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


def badge(value: str, tone: str):
    """A coloured pill; the colours live in templates/admin/delaypay_styles.html."""
    return format_html('<span class="dp-badge dp-{}">{}</span>', tone, value)


def report(request, level: int, label: str, items: list[str]) -> None:
    """One admin message per outcome, naming every object it applies to."""
    if items:
        messages.add_message(request, level, f"{label}: {', '.join(items)}.")

