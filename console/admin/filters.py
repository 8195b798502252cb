"""The payment list's filters: due, kind, rail, payee, failure reason, payer, account,
direction, recurrence, and the amount and due-time ranges."""

import re
from datetime import UTC, datetime, time, timedelta

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.db.models import Q
from django.utils.dateparse import parse_date, parse_datetime

from common.admin_tools import GivenValueFilter
from common.db import database_now
from payments.models import (
    FailureReason,
    PaymentStatus,
    Rail,
)
from payments.selectors import (
    payment_due_next_hour_condition,
    payment_due_today_condition,
    payment_execute_at_condition,
    payment_overdue_condition,
)


class DueFilter(admin.SimpleListFilter):
    """Due date as an operator thinks of it, judged on the database clock."""

    title = "due"
    parameter_name = "due"
    CONDITIONS = {
        "overdue": payment_overdue_condition,
        "next_hour": payment_due_next_hour_condition,
        "today": payment_due_today_condition,
    }

    def lookups(self, request, model_admin):
        return [
            ("overdue", "Overdue (past due, or lease expired)"),
            ("next_hour", "In the next hour"),
            ("today", "Today (UTC)"),
        ]

    def queryset(self, request, queryset):
        condition = self.CONDITIONS.get(self.value())
        if condition is None:
            return queryset
        if self.value() == "today":
            start = database_today()
            known_execute_at_range(request, start, start + timedelta(days=1))
        return queryset.filter(condition())


class KindFilter(admin.SimpleListFilter):
    """Internal transfers (to an account) or payouts (to a payee, through a rail)."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request, model_admin):
        return [("internal", "Internal (to an account)"), ("payout", "Payout (to a payee, through a rail)")]

    def queryset(self, request, queryset):
        if self.value() in ("internal", "payout"):
            # to_payee, not rail: payments_payee_idx holds exactly the payouts.
            return queryset.filter(to_payee__isnull=self.value() == "internal")
        return queryset


class RailFilter(admin.SimpleListFilter):
    """Payouts through one rail (fixed choices: no SELECT DISTINCT over the table)."""

    title = "rail"
    parameter_name = "rail"

    def lookups(self, request, model_admin):
        return Rail.choices

    def queryset(self, request, queryset):
        if self.value() in Rail.values:
            return queryset.filter(to_payee__isnull=False, rail=self.value())
        return queryset


class PayeeFilter(admin.SimpleListFilter):
    """Payouts to one payee (``?payee=<id>``, as linked from a payee's page): listing every
    payee here would not scale, so the choice is offered only once given."""

    title = "payee"
    parameter_name = "payee"

    def lookups(self, request, model_admin):
        return [(self.value(), self.value())] if self.value() else []

    def has_output(self) -> bool:
        return bool(self.value())

    def queryset(self, request, queryset):
        return queryset.filter(to_payee_id=self.value()) if self.value() else queryset


class FailureReasonFilter(admin.SimpleListFilter):
    """Fixed choices: Django's default would run SELECT DISTINCT over the whole table."""

    title = "failure reason"
    parameter_name = "failure_reason"

    def lookups(self, request, model_admin):
        return FailureReason.choices

    def queryset(self, request, queryset):
        if self.value() in FailureReason.values:
            # Only FAILED rows carry a reason; saying so lets payments_failed_idx serve it.
            return queryset.filter(status=PaymentStatus.FAILED, failure_reason=self.value())
        return queryset


def whole_number(text: str, *, digits: int) -> int | None:
    """``text`` as a non-negative integer of at most ``digits`` ASCII digits, else None
    (str.isdigit would take "²", and a longer number would overflow its column)."""
    return int(text) if re.fullmatch(rf"[0-9]{{1,{digits}}}", text) else None


USER_ID_DIGITS = 9  # auth_user.id is an integer


def warn_once(request, text: str) -> None:
    """An admin message about the list's query, said once per request (the changelist
    may build its queryset more than once; the CSV export says nothing)."""
    said = request.__dict__.setdefault("_dp_said", set())
    if text not in said and not getattr(request, "_dp_export", False):
        said.add(text)
        messages.warning(request, text)


class PayerFilter(GivenValueFilter):
    """Payments one user created (``?payer=<user id>``): the payment page's "payer" links
    here. Served by the lookup table's payments_lookup_payer_idx (payer, execute_at, payment),
    walked in order (get_ordering: latest due first)."""

    title = "payer"
    parameter_name = "payer"

    def lookups(self, request, model_admin):
        value = self.value() or ""
        if not value:
            return []
        user_id = whole_number(value, digits=USER_ID_DIGITS)
        user = get_user_model().objects.filter(pk=user_id).first() if user_id is not None else None
        return [(value, user.get_username() if user else f"user #{value}")]

    def queryset(self, request, queryset):
        if not self.value():
            return queryset
        user_id = whole_number(self.value(), digits=USER_ID_DIGITS)
        if user_id is None:
            warn_once(request, f"payer={self.value()!r} is not a user id (a number): the payer filter is ignored.")
            return queryset
        return queryset.filter(lookup__payer_id=user_id)


class AccountFilter(GivenValueFilter):
    """Payments out of or into one account (``?account=<id>``, with ``direction=out|in``;
    both when no direction). Read through the lookup table (decision 0011): out,
    payments_lookup_from_idx walked in order (get_ordering); in, payments_lookup_to_idx;
    both, a bitmap over the two."""

    title = "account"
    parameter_name = "account"

    def queryset(self, request, queryset):
        account = self.value()
        if not account:
            return queryset
        direction = request.GET.get(DirectionFilter.parameter_name, "")
        if direction == "out":
            return queryset.filter(lookup__from_account_id=account)
        if direction == "in":
            return queryset.filter(lookup__to_account_id=account)
        return queryset.filter(Q(lookup__from_account_id=account) | Q(lookup__to_account_id=account))


class DirectionFilter(admin.SimpleListFilter):
    """Which side of the account given by ``?account=``: applied by AccountFilter."""

    title = "direction (of the account)"
    parameter_name = "direction"

    def lookups(self, request, model_admin):
        return [("out", "Out of the account (it pays)"), ("in", "Into the account (it is paid)")]

    def has_output(self) -> bool:
        return bool(self._account or self.value())

    def __init__(self, request, params, model, model_admin):
        self._account = request.GET.get(AccountFilter.parameter_name, "")
        super().__init__(request, params, model, model_admin)

    def queryset(self, request, queryset):
        if self.value() and self.value() not in ("out", "in"):
            warn_once(request, f"direction={self.value()!r}: use out or in; both directions are listed.")
        elif self.value() and not self._account:
            warn_once(request, "direction needs an account (?account=<id>&direction=out|in): it is ignored.")
        return queryset


class RecurrenceFilter(admin.SimpleListFilter):
    """One-off payments or occurrences of a series. Occurrences: payments_recurring_idx
    (partial, recurring_id IS NOT NULL); one-off: its complement, which no index holds:
    the list walks the primary key newest first and stops at a page of rows (one-off
    payments are most of the table); combined with a narrower filter it reads that one's
    rows."""

    title = "one-off or recurring"
    parameter_name = "recurrence"

    def lookups(self, request, model_admin):
        return [("one_off", "One-off"), ("recurring", "Occurrence of a recurring payment")]

    def queryset(self, request, queryset):
        if self.value() == "one_off":
            return queryset.filter(recurring__isnull=True)
        if self.value() == "recurring":
            return queryset.filter(recurring__isnull=False)
        return queryset


def parse_amount(value: str) -> int | None:
    text = value.replace(",", "").replace("_", "").strip()
    return whole_number(text, digits=18)  # amounts are bigint


def parse_due(value: str, *, end: bool) -> datetime | None:
    """A due-date bound: a date (the whole day: ``to`` takes its end) or a date and time,
    in UTC unless an offset is given; None when it is neither."""
    text = value.strip()
    try:
        if "T" in text or " " in text:
            moment = parse_datetime(text.replace(" ", "T", 1))
            return None if moment is None else moment if moment.tzinfo else moment.replace(tzinfo=UTC)
        day = parse_date(text)
        if day is None:
            return None
        start = datetime.combine(day, time.min, tzinfo=UTC)
        return start + timedelta(days=1) if end else start
    except (ValueError, OverflowError):  # 2026-02-30; the day after 9999-12-31
        return None


class RangeFilter(admin.ListFilter):
    """Two bounds given in the URL (``<name>_min``/``<name>_max``, ``due_from``/``due_to``),
    shown as a small form in the filter sidebar. A bound that does not parse is named in a
    message and ignored: the list still renders."""

    template = "admin/payments/scheduledpayment/range_filter.html"
    low: str
    high: str
    low_label = "from"
    high_label = "to"
    help_text = ""

    def __init__(self, request, params, model, model_admin):
        super().__init__(request, params, model, model_admin)
        self.values = {}
        for name in (self.low, self.high):
            if name in params:
                self.values[name] = params.pop(name)[-1]
        self.other_params = [(k, v) for k, v in request.GET.items() if k not in (self.low, self.high, "p")]

    def has_output(self) -> bool:
        return True

    def expected_parameters(self):
        return [self.low, self.high]

    def choices(self, changelist):
        yield {
            "low": self.low, "high": self.high, "low_value": self.values.get(self.low, ""),
            "high_value": self.values.get(self.high, ""), "low_label": self.low_label,
            "high_label": self.high_label, "help": self.help_text, "other_params": self.other_params,
            "clear_url": changelist.get_query_string(remove=[self.low, self.high, "p"]),
            "selected": bool(self.values),
        }


NARROWING_PARAMETERS = ("q", "account", "payer", "payee", "due", "failure_reason", "due_from", "due_to")


class AmountFilter(RangeFilter):
    """An amount range (minor units, both ends included). No index holds amounts, so it
    narrows a list that another filter already bounds (an account, a payer, a payee, a
    search, a due-date filter or range, a failure reason, the review queue): alone it
    would read every payment, and it says so instead."""

    title = "amount"
    low, high = "amount_min", "amount_max"
    low_label, high_label = "min", "max"
    help_text = "minor units, both included"

    def queryset(self, request, queryset):
        lookups = {}
        for name, lookup in ((self.low, "amount__gte"), (self.high, "amount__lte")):
            if self.values.get(name, "").strip():
                amount = parse_amount(self.values[name])
                if amount is None:
                    warn_once(request, f"{name}={self.values[name]!r} is not an amount (a whole number): ignored.")
                else:
                    lookups[lookup] = amount
        if not lookups:
            return queryset
        narrowed = any(request.GET.get(name, "").strip() for name in NARROWING_PARAMETERS) or request.GET.get(
            "status__exact"
        ) in (PaymentStatus.NEEDS_REVIEW, PaymentStatus.EXECUTING)
        if not narrowed:
            warn_once(
                request,
                "The amount range narrows a list another filter bounds (an account, a payer, a search, a due-date "
                "range, ...): on its own it would read every payment. It is not applied.",
            )
            return queryset
        return queryset.filter(**lookups)


def known_execute_at_range(request, start, end) -> None:
    """A filter bounds the list's due times to [start, end): the date drill-down spans that
    range instead of reading its rows' first and last due times (two to four index reads
    of 15-20 ms each at 1M payments). A listed day may then hold no rows."""
    request._dp_execute_at_range = (start, end)


def database_today() -> datetime:
    """The start of the current UTC day on the database clock (what "due today" means)."""
    return database_now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


class DueRangeFilter(RangeFilter):
    """A due-date range (execute_at; a date is the whole UTC day, ``to`` included), over
    every status: read through the three partial indexes on execute_at, as the date
    drill-down (selectors.payment_execute_at_condition)."""

    title = "due date range"
    low, high = "due_from", "due_to"
    help_text = "UTC: 2026-12-01 or 2026-12-01 14:00"

    def queryset(self, request, queryset):
        lookups = {}
        for name, lookup, end in ((self.low, "execute_at__gte", False), (self.high, "execute_at__lt", True)):
            if self.values.get(name, "").strip():
                moment = parse_due(self.values[name], end=end)
                if moment is None:
                    warn_once(request, f"{name}={self.values[name]!r} is not a date (2026-12-01) or time: ignored.")
                else:
                    lookups[lookup] = moment
        if not lookups:
            return queryset
        if lookups.get("execute_at__gte") and lookups.get("execute_at__lt") and (
            lookups["execute_at__gte"] >= lookups["execute_at__lt"]
        ):
            warn_once(request, "The due-date range ends before it starts: nothing is due in it.")
        elif lookups.get("execute_at__gte") and lookups.get("execute_at__lt"):
            known_execute_at_range(request, lookups["execute_at__gte"], lookups["execute_at__lt"])
        return queryset.filter(payment_execute_at_condition(**lookups))
