"""The admin's "Per-user limits" page: each user's usage against the limits of
payments/limits.py, users at or near a limit first. Read-only; the numbers are the ones
the checks compute (limits.payer_usage)."""

from dataclasses import dataclass

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.template.response import TemplateResponse

from common.authz import MissingPermission
from payments import limits

# A usage at or above this share of its cap is "near" it (amber); at the cap, red.
NEAR = 0.8
CANDIDATES_PER_LIMIT = 25
MAX_LOOKUP_TERMS = 20


@dataclass(frozen=True)
class Cell:
    used: int
    cap: int  # 0: no limit
    ratio: float | None

    @property
    def tone(self) -> str:
        if self.ratio is None or self.ratio < NEAR:
            return ""
        return "red" if self.ratio >= 1 else "amber"

    @property
    def percent(self) -> str:
        return "" if self.ratio is None else f"{self.ratio:.0%}"


@dataclass(frozen=True)
class Row:
    usage: limits.Usage
    pending: Cell
    series: Cell
    outflow: Cell

    @property
    def tone(self) -> str:
        tones = {self.pending.tone, self.series.tone, self.outflow.tone}
        return "red" if "red" in tones else "amber" if "amber" in tones else ""


def row(usage: limits.Usage) -> Row:
    caps = usage.caps
    return Row(
        usage=usage,
        pending=Cell(usage.pending_payments, caps.pending_payments, usage.pending_ratio),
        series=Cell(usage.active_series, caps.active_series, usage.series_ratio),
        outflow=Cell(usage.busiest_outflow, caps.daily_outflow, usage.outflow_ratio),
    )


def limits_view(request):
    """Staff with view access to payments (as the dashboard); ``?q=`` looks up usernames."""
    if not request.user.has_perm("payments.view_scheduledpayment"):
        raise MissingPermission("payments.view_scheduledpayment")
    query = request.GET.get("q", "").strip()
    if query:
        names = query.split()[:MAX_LOOKUP_TERMS]
        users = get_user_model().objects.filter(username__in=names).order_by("username")
        usages = limits.payer_usages(list(users))
        missing = sorted(set(names) - {u.username for u in usages})
    else:
        usages = limits.users_nearest_limits(candidates_per_limit=CANDIDATES_PER_LIMIT)
        missing = []
    rows = [row(u) for u in usages]
    context = {
        **admin.site.each_context(request),
        "title": "Per-user limits",
        "caps": limits.caps(),
        "rows": rows,
        "query": query,
        "missing": missing,
        "at_cap": sum(1 for r in rows if r.tone == "red"),
        "near_cap": sum(1 for r in rows if r.tone == "amber"),
        "near_percent": f"{NEAR:.0%}",
        "candidates": CANDIDATES_PER_LIMIT,
    }
    return TemplateResponse(request, "admin/payments/limits.html", context)
