"""The payments operations console.

Staff read everything; they change state only through the services the API uses:
"Cancel" (bulk action and the detail page's button) calls ``payment_cancel_by_staff``
(the cancel CAS and a staff action with the reason); the review queue's "Re-drive" and
"Resolve as failed" call ``payment_redrive`` / ``payment_resolve``; each of these goes
through a confirmation page that counts what will change and asks for a reason (common/
admin_tools.py, ConfirmedActAdminMixin). "Pause" and "Resume" on recurring payments call
``recurring_pause`` / ``recurring_resume``. No money field, status or time is editable,
nothing can be added or deleted, and the database triggers would refuse it anyway.
"""

import csv
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import flatten_fieldsets, unquote
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q
from django.http import HttpResponseNotAllowed, HttpResponseRedirect, StreamingHttpResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from django.utils.html import format_html, format_html_join

from common.admin_tools import (
    ActionPermissionAdminMixin,
    ConfirmedAct,
    ConfirmedActAdminMixin,
    ConfirmRow,
    LargeTableAdminMixin,
    LatestRowsInlineFormSet,
    LimitedChangeList,
    ReadOnlyAdminMixin,
    ReasonForm,
    badge,
    change_url,
    confirmed_action,
    display_column,
    has_model_permission,
    id_in_url,
    object_view_url,
    report,
    utc_text,
)
from common.authz import ConflictOfInterest, staff_may_view
from console.admin_rails import payee_cell, payout_state_badge
from console.forms import RedriveForm, ReviewForm
from ledger.models import Account, PendingTransfer, StaffAction
from ledger.selectors import transfer_by_key
from ledger.services import PENDING_PREFIX, POST_PREFIX, VOID_PREFIX
from payments.exceptions import (
    PaymentNotCancellable,
    PaymentNotFound,
    PaymentNotInReview,
    PaymentValidationError,
    PayoutOutcomeUnknown,
    PayoutPaidAtRail,
    RailUnavailable,
    RecurringNotFound,
    RecurringStateError,
)
from payments.models import (
    ArchivedPartition,
    ExecutionAttempt,
    FailureReason,
    PaymentEvent,
    PaymentStatus,
    Payout,
    PayoutState,
    Rail,
    RecurringEvent,
    RecurringPayment,
    RecurringStatus,
    ScheduledPayment,
)
from payments.selectors import (
    payment_due_next_hour_condition,
    payment_due_today_condition,
    payment_execute_at_bounds,
    payment_execute_at_condition,
    payment_overdue_condition,
    payments_matching,
    recurring_search_condition,
)
from payments.services import db_now, payment_cancel_by_staff, payment_redrive, payment_resolve
from recurring.series import recurring_end, recurring_pause, recurring_resume

admin.site.site_header = "delaypay operations"
admin.site.site_title = "delaypay operations"
admin.site.index_title = "Operations console"
admin.site.site_url = None  # no public site to link to
admin.site.enable_nav_sidebar = False  # the payment list is wide; give it the whole page

STATUS_TONES = {
    PaymentStatus.SCHEDULED: "blue",
    PaymentStatus.EXECUTING: "amber",
    PaymentStatus.EXECUTED: "green",
    PaymentStatus.FAILED: "red",
    PaymentStatus.CANCELLED: "grey",
    PaymentStatus.NEEDS_REVIEW: "purple",
    RecurringStatus.ACTIVE: "green",
    RecurringStatus.PAUSED: "amber",
    RecurringStatus.ENDED: "grey",
}

# More search terms than this are ignored (each is an exact id, or a username or account
# name prefix); the list says how many were taken.
MAX_SEARCH_TERMS = 50
# A name prefix ("a") may match many accounts: the search takes at most this many.
MAX_PREFIX_ACCOUNTS = 200
SEARCH_SEPARATORS = re.compile(r"[\s,]+")


def status_badge(status: str):
    return badge(status, STATUS_TONES.get(status, "grey"))


def money(amount) -> str:
    """An amount in minor units with thousands separators (1,234,567)."""
    return f"{amount:,}" if isinstance(amount, int) else "-"


def admin_link(obj, text=None):
    """A link to ``obj``'s admin change page (ids as the API shows them)."""
    return format_html('<a href="{}">{}</a>', change_url(type(obj), obj.pk), text if text is not None else obj.pk)


def payment_link(payment_id: str):
    url = change_url(ScheduledPayment, payment_id)
    return format_html('<a href="{}">{}</a>', url, payment_id)


def account_cell(account):
    """The account's owner, linked to the account (its id on hover): the confirmation
    pages stay narrow; the list and the detail page name the account too (party_cell)."""
    owner = account.owner.username if account.owner_id else account.name
    url = change_url(Account, account.pk)
    return format_html('<a href="{}" title="{}">{}</a>', url, account.pk, owner)


def party_cell(account):
    """Which of its owner's accounts: the account's name linked to it, the owner after it
    ("Savings · alice"); a system account has no owner."""
    url = change_url(Account, account.pk)
    if not account.owner_id:
        return format_html('<a href="{}" title="{}">{}</a>', url, account.pk, account.name)
    return format_html(
        '<a href="{}" title="{}">{}</a> <span class="dp-quiet">· {}</span>',
        url, account.pk, account.name, account.owner.username,
    )


def to_cell(obj):
    """Whom a payment (or recurring payment) pays: an account, or a payee through its rail."""
    return party_cell(obj.to_account) if obj.to_payee_id is None else payee_cell(obj.to_payee)


def to_detail(obj):
    """The detail page's "to": the account with its id, or the payee with its rail and destination."""
    if obj.to_payee_id is None:
        return format_html("{} <span class=\"dp-mono\">{}</span>", party_cell(obj.to_account), obj.to_account_id)
    return format_html("payout: {} <span class=\"dp-mono\">{}</span>", payee_cell(obj.to_payee), obj.to_payee_id)


def from_detail(obj):
    return format_html("{} <span class=\"dp-mono\">{}</span>", party_cell(obj.from_account), obj.from_account_id)


def search_terms(search_term: str) -> tuple[list[str], int]:
    """The terms of a search (separated by spaces or commas, as pasted from a sheet), at
    most MAX_SEARCH_TERMS of them, and how many were given."""
    terms = [t for t in SEARCH_SEPARATORS.split(search_term.strip()) if t]
    return terms[:MAX_SEARCH_TERMS], len(terms)


def accounts_by_prefix(terms: list[str]) -> tuple[list[str], bool]:
    """Ids of the accounts a term names: by id, by a prefix of the owner's username (the
    unique index on auth_user.username, varchar_pattern_ops copy, serves LIKE 'x%'), or
    by a prefix of the account's name (no index: a read of the accounts table, bounded by
    MAX_PREFIX_ACCOUNTS rows, never of the payments). True when more matched than taken."""
    if not terms:
        return [], False
    by_name = Q()
    for term in terms:
        by_name |= Q(owner__username__startswith=term) | Q(name__istartswith=term)
    exact = list(Account.objects.filter(pk__in=terms).values_list("pk", flat=True))
    prefixed = list(
        Account.objects.filter(by_name).order_by().values_list("pk", flat=True)[: MAX_PREFIX_ACCOUNTS + 1]
    )
    more = len(prefixed) > MAX_PREFIX_ACCOUNTS
    return sorted({*exact, *prefixed[:MAX_PREFIX_ACCOUNTS]}), more


def payment_admin_search_condition(*, terms: list[str]) -> tuple[Q, bool]:
    """What the payment list's search matches (any term): a payment id, a recurring id
    (its occurrences), an account id, or a prefix of an account's name or its owner's
    username, either side. Accounts are resolved first so the payments are read through
    the lookup table's account indexes; ids through its primary key, occurrences through
    payments_recurring_idx (selectors.payments_matching)."""
    account_ids, more = accounts_by_prefix(terms)
    condition = payments_matching(ids=terms, account_ids=account_ids,
                                  recurring_ids=[t for t in terms if t.startswith("rec_")])
    return condition, more


def reserved_payout_ids(payment_ids) -> set[str]:
    """Which of these payments are payouts whose funds are reserved at their rail."""
    return set(
        Payout.objects.filter(payment_id__in=payment_ids, state=PayoutState.PENDING).values_list("pk", flat=True)
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


class GivenValueFilter(admin.SimpleListFilter):
    """A filter on one id given in the URL (as linked from another page): listing every
    choice would not scale, so the choice is offered only once given."""

    def lookups(self, request, model_admin):
        return [(self.value(), self.value())] if self.value() else []

    def has_output(self) -> bool:
        return bool(self.value())


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
    return db_now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


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


def payout_of(payment) -> Payout | None:
    """A payout's record at its rail (none until its funds are reserved), read once per page."""
    if not hasattr(payment, "_payout_record"):
        payment._payout_record = Payout.objects.filter(pk=payment.pk).first()
    return payment._payout_record


def payout_field(attr: str, description: str, render=str):
    """A row of the payment page's "At the rail" section: ``attr`` of its payout record."""

    @admin.display(description=description)
    def field(model_admin, obj):
        payout = payout_of(obj)
        value = getattr(payout, attr) if payout is not None else None
        return render(value) if value not in (None, "") else "-"

    return field


@dataclass(frozen=True, kw_only=True)
class PaymentAct(ConfirmedAct):
    """Cancel, re-drive or resolve: the confirmation page's words and the service, run on
    each payment. ``run`` returns (the payment, whether this call changed it)."""

    eligible: tuple[str, ...]  # the statuses it changes; the page marks the rest "left alone"
    ineligible: str  # what the rest are called on the page
    done: str
    already: str
    refused: str  # the report of a payment in another status ("Too late to cancel: pay_... is EXECUTED")
    run: Callable[..., tuple[ScheduledPayment, bool]]  # (payment_id=, actor=, data=form.cleaned_data)


# The confirmation page's reason for leaving a payout with reserved funds out of a cancel.
RESERVED_AT_RAIL = "funds reserved at the rail, outcome unknown: resolve it instead"


def _cancel(*, payment_id: str, actor, data: dict) -> tuple[ScheduledPayment, bool]:
    outcome = payment_cancel_by_staff(payment_id=payment_id, actor=actor, reason=data["reason"])
    return outcome.payment, outcome.cancelled_now


def _redrive(*, payment_id: str, actor, data: dict) -> tuple[ScheduledPayment, bool]:
    outcome = payment_redrive(
        payment_id=payment_id, actor=actor, reason=data["reason"], execute_at=data.get("execute_at")
    )
    return outcome.payment, outcome.changed_now


def _resolve(*, payment_id: str, actor, data: dict) -> tuple[ScheduledPayment, bool]:
    outcome = payment_resolve(payment_id=payment_id, actor=actor, outcome="failed", reason=data["reason"])
    return outcome.payment, outcome.changed_now


PAYMENT_ACTS = (
    PaymentAct(
        name="cancel",
        title="Cancel",
        explanation="Each payment that is SCHEDULED or in review ends CANCELLED: the same compare-and-set as "
        "DELETE /api/v1/payments/{id}, so it races a worker's claim and exactly one wins. No money moves. The "
        "cancel is recorded in the payment's event history and in the ledger's staff actions, with your reason. "
        "A payout whose funds are reserved at its rail is refused (the rail may have paid it): resolve it instead.",
        permission="cancel",
        form=ReasonForm,
        eligible=(PaymentStatus.SCHEDULED, PaymentStatus.NEEDS_REVIEW),
        ineligible="already claimed, finished or cancelled",
        done="Cancelled",
        already="Already cancelled",
        refused="Too late to cancel",
        run=_cancel,
    ),
    PaymentAct(
        name="redrive",
        title="Re-drive",
        explanation="Each payment in review goes back to SCHEDULED with a fresh retry budget, due at once or at "
        "the time given, and executes like any other payment.",
        permission="redrive",
        form=RedriveForm,
        eligible=(PaymentStatus.NEEDS_REVIEW,),
        ineligible="not in review",
        done="Re-driven",
        already="Already re-driven",
        refused="Not in review",
        run=_redrive,
    ),
    PaymentAct(
        name="resolve",
        title="Resolve as failed",
        explanation="Each payment in review ends FAILED with failure_reason resolved_by_staff. No money moves. "
        "For a payout whose funds are reserved, its rail is asked first: nothing there (or declined), the reserve is "
        "voided and the money goes back to the payer; paid there, the resolve is refused (re-drive it: it is then "
        "recorded as executed); no answer, it is refused (try again later).",
        permission="redrive",
        form=ReviewForm,
        eligible=(PaymentStatus.NEEDS_REVIEW,),
        ineligible="not in review",
        done="Resolved as failed",
        already="Already resolved as failed",
        refused="Not in review",
        run=_resolve,
    ),
)
PAYMENT_ACT = {act.name: act for act in PAYMENT_ACTS}


# A payment's timeline shows at most this many attempts and events (a payment has a few;
# a re-driven one a few dozen).
MAX_TIMELINE_ROWS = 500


@dataclass(frozen=True)
class TimelineEntry:
    at: datetime
    what: object  # text or safe HTML
    actor: str
    detail: str

    @property
    def when(self) -> str:
        return self.at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:23]


def _event_detail(event: PaymentEvent) -> str:
    parts = [f"attempt {event.attempt}"] if event.attempt else []
    parts += [f"{key}: {value}" for key, value in (event.data or {}).items()]
    return "; ".join(parts)


def _attempt_entry(attempt: ExecutionAttempt) -> TimelineEntry:
    took = (attempt.finished_at - attempt.started_at).total_seconds() * 1000
    detail = "; ".join(part for part in (attempt.error, f"took {took:,.0f} ms") if part)
    outcome = badge(attempt.outcome, ATTEMPT_TONES.get(attempt.outcome, "grey"))
    return TimelineEntry(attempt.started_at, format_html("attempt {}: {}", attempt.attempt, outcome),
                         attempt.worker or "-", detail)


CLAIM_KINDS = (PaymentEvent.Kind.CLAIMED, PaymentEvent.Kind.RECLAIMED)


@dataclass(frozen=True)
class FirstClaim:
    """When a payment's first attempt was claimed, and where that time is read from."""

    at: datetime
    source: str


def first_claim(payment, events: list[PaymentEvent]) -> FirstClaim | None:
    """When the payment's first attempt was claimed, where no event says it: a first claim
    writes none (decision record 0010). The row's claimed_at while attempt 1 is its latest
    claim; afterwards the second attempt's "reclaimed" event keeps it. None when it was
    never claimed, or when a "claimed" event of its own says when (a payment claimed
    before that change)."""
    if payment.attempt < 1 or any(e.kind == PaymentEvent.Kind.CLAIMED for e in events):
        return None
    if payment.attempt == 1:
        return FirstClaim(payment.claimed_at, "the payment's claimed_at") if payment.claimed_at else None
    second = next((e for e in events if e.kind == PaymentEvent.Kind.RECLAIMED and e.attempt == 2), None)
    previous = (second.data or {}).get("previous_claimed_at") if second else None
    at = parse_datetime(previous) if isinstance(previous, str) else None
    return FirstClaim(at, "the second claim's previous_claimed_at") if at else None


def _first_claim_entries(claim: FirstClaim, attempts: dict[int, ExecutionAttempt]) -> list[TimelineEntry]:
    """The first claim (from first_claim) and, right after it, the attempt it started."""
    entries = [TimelineEntry(claim.at, "claimed SCHEDULED → EXECUTING", "promoter",
                             f"attempt 1; a first claim writes no event: the time is {claim.source}")]
    if 1 in attempts:
        entries.append(_attempt_entry(attempts.pop(1)))
    return entries


def payment_timeline(*, user, payment) -> tuple[list[TimelineEntry], list[str]]:
    """The payment's events (in the order they were written) with each attempt right after
    the claim that started it, and what the user may not see of it (events and attempts
    each need their view permission, as the admin's lists of them). An attempt without its
    claim among the events goes where its start time puts it."""
    hidden = []
    events, attempts = [], {}
    if staff_may_view(user, PaymentEvent):
        events = list(
            PaymentEvent.objects.filter(payment_id=payment.pk).select_related("actor_user").order_by("id")[
                :MAX_TIMELINE_ROWS
            ]
        )
    else:
        hidden.append("events")
    if staff_may_view(user, ExecutionAttempt):
        rows = ExecutionAttempt.objects.filter(payment_id=payment.pk).order_by("attempt")[:MAX_TIMELINE_ROWS]
        attempts = {attempt.attempt: attempt for attempt in rows}
    else:
        hidden.append("attempts")
    entries = []
    pending_claim = first_claim(payment, events) if "events" not in hidden else None
    for event in events:
        if pending_claim and event.created_at >= pending_claim.at and event.kind != PaymentEvent.Kind.CREATED:
            entries += _first_claim_entries(pending_claim, attempts)
            pending_claim = None
        what = [event.kind]
        if event.from_status != event.to_status:
            what += [event.from_status, "→", event.to_status] if event.from_status else ["→", event.to_status]
        actor = event.actor_user.get_username() if event.actor_user_id else event.actor
        entries.append(TimelineEntry(event.created_at, " ".join(what), actor, _event_detail(event)))
        if event.kind in CLAIM_KINDS and event.attempt in attempts:
            entries.append(_attempt_entry(attempts.pop(event.attempt)))
    if pending_claim:
        entries += _first_claim_entries(pending_claim, attempts)
    for attempt in attempts.values():  # their claim is not among the events shown
        later = next((i for i, entry in enumerate(entries) if entry.at > attempt.started_at), len(entries))
        entries.insert(later, _attempt_entry(attempt))
    return entries, hidden


ATTEMPT_TONES = {
    ExecutionAttempt.Outcome.EXECUTED: "green",
    ExecutionAttempt.Outcome.ALREADY_APPLIED: "green",
    ExecutionAttempt.Outcome.FAILED: "red",
    ExecutionAttempt.Outcome.ERROR: "amber",
    ExecutionAttempt.Outcome.UNKNOWN: "amber",
    ExecutionAttempt.Outcome.PARKED: "purple",
    ExecutionAttempt.Outcome.STALE: "grey",
}


class PlainIdChangeList(LimitedChangeList):
    """A changelist whose rows link to ``<id>/change/`` with the id as the API shows it,
    and that leaves the live refresh's ``refresh`` parameter to the page, not the filters."""

    def get_filters_params(self, params=None):
        lookup_params = super().get_filters_params(params)
        lookup_params.pop(REFRESH_PARAMETER, None)
        return lookup_params


class ExportChangeList(PlainIdChangeList):
    """The changelist's filtered, ordered queryset without its page: the CSV export reads
    the rows itself, so no count and no page query before the first byte."""

    def get_results(self, request):
        self.result_count = self.full_result_count = 0
        self.result_list = []
        self.can_show_all = self.multi_page = self.show_all = False
        self.paginator = None


# ``?refresh=<seconds>`` reloads the list every so often (a meta refresh: no script).
REFRESH_PARAMETER = "refresh"
REFRESH_CHOICES = (10, 30, 60)
MIN_REFRESH_SECONDS = 5

class PayerToPayeeAdminMixin:
    """What payments and recurring payments show alike: who pays whom (owners linked to
    their accounts), a status badge, and every field of the fieldsets read-only."""

    list_select_related = ("from_account__owner", "to_account__owner", "to_payee")
    from_col = display_column("from_account", party_cell, "from")
    status_col = display_column("status", status_badge, "status")
    amount_col = display_column("amount", money, "amount")

    @admin.display(description="from")
    def from_detail_col(self, obj):
        return from_detail(obj)

    @admin.display(description="payer")
    def payer_col(self, obj):
        """Whoever created it, linked to everything they created (not to their user page)."""
        url = reverse("admin:payments_scheduledpayment_changelist")
        return format_html('<a href="{}?payer={}">{}</a>', url, obj.payer_id, obj.payer.get_username())

    def get_changelist(self, request, **kwargs):
        return ExportChangeList if getattr(request, "_dp_export", False) else PlainIdChangeList

    @admin.display(description="to")
    def to_col(self, obj):
        return to_cell(obj)

    @admin.display(description="to")
    def to_detail_col(self, obj):
        return to_detail(obj)

    def get_readonly_fields(self, request, obj=None):
        return flatten_fieldsets(self.get_fieldsets(request, obj))

    @staticmethod
    def search_condition(*, terms: list[str]):
        raise NotImplementedError

    def get_search_results(self, request, queryset, search_term):
        terms, given = search_terms(search_term)
        if not terms:
            return queryset, False
        if given > len(terms):
            warn_once(request, f"{given} ids or names pasted, the first {len(terms)} searched.")
        return queryset.filter(self.search_condition(terms=terms)), False

    def selected_ids(self, request, queryset, *, limit: int, refusal: str) -> list[str] | None:
        """The selection's ids, or None (saying ``refusal``) when it is over ``limit``: a
        "select all 1,000,000" must not become a request that runs for an hour."""
        ids = sorted(queryset.order_by().values_list("pk", flat=True)[: limit + 1])
        if len(ids) > limit:
            self.message_user(request, refusal, messages.ERROR)
            return None
        return ids


# The CSV export stops after this many rows and says so in its last row.
MAX_EXPORT_ROWS = 100_000
EXPORT_HEADER = (
    "payment_id", "status", "amount", "from_account", "from_account_name", "from_owner", "to_account",
    "to_account_name", "to_owner", "to_payee", "rail", "execute_at", "executed_at", "failure_reason",
    "review_reason", "tries", "next_attempt_at", "recurring_id", "created_at",
)
# Parameters that do not choose rows, left out of the export's file name.
NOT_FILTERS = ("p", "o", "e", REFRESH_PARAMETER)


def api_time(value) -> str:
    """A time as the API renders it: RFC 3339 in UTC with a Z."""
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z") if value else ""


def spreadsheet_safe(text: str) -> str:
    """A cell a spreadsheet will not run as a formula (names and usernames are user input)."""
    return f"'{text}" if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def payment_export_rows(queryset, *, cap: int) -> Iterator[list]:
    """The CSV's header and a row per payment of ``queryset`` (ids as the API shows them),
    at most ``cap``; one more row says the export was cut there."""
    yield list(EXPORT_HEADER)
    rows = queryset.select_related("from_account__owner", "to_account__owner")[: cap + 1]
    for count, p in enumerate(rows.iterator(chunk_size=2000), start=1):
        if count > cap:
            yield [f"# cut at {cap:,} rows: narrow the filter to export the rest"]
            return
        to = p.to_account
        yield [
            p.pk, p.status, p.amount, p.from_account_id, spreadsheet_safe(p.from_account.name),
            spreadsheet_safe(p.from_account.owner.username if p.from_account.owner_id else ""),
            p.to_account_id or "", spreadsheet_safe(to.name if to else ""),
            spreadsheet_safe(to.owner.username if to and to.owner_id else ""), p.to_payee_id or "", p.rail,
            api_time(p.execute_at), api_time(p.executed_at), p.failure_reason, p.review_reason, p.tries,
            api_time(p.next_attempt_at), p.recurring_id or "", api_time(p.created_at),
        ]


class _Line:
    """csv.writer's file: hands back each line instead of keeping it."""

    def write(self, line: str) -> str:
        return line


def csv_lines(rows) -> Iterator[str]:
    writer = csv.writer(_Line())
    for row in rows:
        yield writer.writerow(row)


def export_filename(params, *, today) -> str:
    """``payments_<filters>_<date>.csv``: each filter as name-value ("status-FAILED"),
    reduced to characters safe in a file name."""
    parts = []
    for key, value in sorted(params.items()):
        if key in NOT_FILTERS or not value:
            continue
        part = re.sub(r"[^A-Za-z0-9.-]+", "-", f"{key.removesuffix('__exact')}-{value}").strip("-")
        parts.append(part)
    name = "_".join(["payments", *parts])[:150]
    return f"{name}_{today.isoformat()}.csv"


@admin.register(ScheduledPayment)
class ScheduledPaymentAdmin(
    ActionPermissionAdminMixin,
    ConfirmedActAdminMixin,
    PayerToPayeeAdminMixin,
    LargeTableAdminMixin,
    ReadOnlyAdminMixin,
    admin.ModelAdmin,
):
    list_display = (
        "id",
        "from_col",
        "to_col",
        "amount_col",
        "execute_at_col",
        "status_col",
        "attempt",
        "executed_at_col",
        "failure_reason",
    )
    list_filter = (
        "status", DueFilter, FailureReasonFilter, KindFilter, RailFilter, PayeeFilter, PayerFilter, AccountFilter,
        DirectionFilter, RecurrenceFilter, AmountFilter, DueRangeFilter,
    )
    date_hierarchy = "execute_at"
    # Newest first by id (a ULID: creation order), served by the primary key. Ordering by
    # due time would need a plain (execute_at, id) index, which the claim must not have
    # (payments/models.py); the execute_at column still sorts on a click.
    ordering = ("-id",)
    # The drill-down reads execute_at over every status through three partial indexes.
    date_hierarchy_condition = staticmethod(payment_execute_at_condition)
    date_hierarchy_bounds = staticmethod(payment_execute_at_bounds)

    def get_ordering(self, request):
        """Newest first, except where the operator looks at due times: a due filter lists
        the oldest due first and a failure reason the latest failures first. Those orders
        are also what their indexes serve; newest-first by id there would walk the primary
        key past every row the filter does not hold. A payer's or an account's outgoing
        payments: latest due first, as the lookup table's payer and from-account indexes hold
        them (the due time is the lookup row's, which is the payment's: the planner walks the
        index only when the order names its column)."""
        if request.GET.get(DueFilter.parameter_name) in DueFilter.CONDITIONS:
            return ("execute_at", "id")
        if request.GET.get(FailureReasonFilter.parameter_name) in FailureReason.values:
            return ("-execute_at", "-id")
        if request.GET.get("status__exact") == PaymentStatus.NEEDS_REVIEW:
            return ("updated_at", "id")  # the review queue: longest waiting first (payments_review_idx)
        if whole_number(request.GET.get(PayerFilter.parameter_name, ""), digits=USER_ID_DIGITS) is not None or (
            request.GET.get(AccountFilter.parameter_name) and request.GET.get(DirectionFilter.parameter_name) == "out"
        ):
            return ("-lookup__execute_at", "-id")
        if request.GET.get(DueRangeFilter.low) or request.GET.get(DueRangeFilter.high):
            return ("execute_at", "id")
        return super().get_ordering(request)

    search_fields = ("id",)  # shows the box; get_search_results does the matching
    search_help_text = (
        "Exact payment, recurring or account ids, or the start of a username or account name; several separated by "
        f"spaces or commas (at most {MAX_SEARCH_TERMS})."
    )
    actions = ["cancel_selected", "redrive_selected", "resolve_selected"]
    # Attempts and events: one timeline under the first section (change_form.html), not inlines.
    inlines = []
    fieldsets = (
        (
            "What happened",
            {
                "fields": (
                    "status_col", "amount_col", "from_detail_col", "to_detail_col", "payer_col", "execute_at_detail",
                    "executed_at_detail", "failure_reason", "review_reason", "next_attempt_at_detail",
                )
            },
        ),
        (
            "Schedule",
            {"fields": ("requested_execute_at", "jitter_seconds", "expires_after", "recurring_col", "occurrence_at")},
        ),
        (
            "State",
            {"fields": ("attempt", "tries", "lease_until", "claimed_at", "cancelled_at", "version")},
        ),
        ("Ledger", {"fields": ("ledger_transfer", "staff_actions")}),
        ("Record", {"fields": ("created_at", "updated_at")}),
    )

    execute_at_detail = display_column("execute_at", utc_text, "due (UTC)")
    executed_at_detail = display_column("executed_at", utc_text, "executed (UTC)")
    next_attempt_at_detail = display_column("next_attempt_at", utc_text, "next attempt (UTC)")

    @admin.display(description="recurring payment")
    def recurring_col(self, obj):
        return admin_link(obj.recurring) if obj.recurring_id else "-"

    def get_search_results(self, request, queryset, search_term):
        terms, given = search_terms(search_term)
        if not terms:
            return queryset, False
        if given > len(terms):
            warn_once(request, f"{given} ids or names pasted, the first {len(terms)} searched.")
        condition, more = payment_admin_search_condition(terms=terms)
        if more:
            warn_once(
                request,
                f"The names given start more than {MAX_PREFIX_ACCOUNTS} accounts' names or usernames: the first "
                f"{MAX_PREFIX_ACCOUNTS} accounts are searched. Type more of the name.",
            )
        return queryset.filter(condition), False

    # --- the list: saved views, "as of", live refresh, CSV export --------------------------

    def saved_views(self) -> list[tuple[str, str]]:
        url = reverse("admin:payments_scheduledpayment_changelist")
        return [
            ("Failed, due today", f"{url}?status__exact={PaymentStatus.FAILED}&due=today"),
            ("Parked (needs review)", f"{url}?status__exact={PaymentStatus.NEEDS_REVIEW}"),
            ("Overdue", f"{url}?due=overdue"),
            ("Due in the next hour", f"{url}?due=next_hour"),
        ]

    def refuse_nul(self, request):
        """A query parameter with a NUL byte: PostgreSQL text cannot hold one (psycopg
        would raise), so the list is shown without the parameters, saying why."""
        if any("\x00" in text for key, values in request.GET.lists() for text in (key, *values)):
            messages.error(request, "A query parameter held a NUL character; the list is shown unfiltered.")
            return HttpResponseRedirect(reverse("admin:payments_scheduledpayment_changelist"))
        return None

    def changelist_view(self, request, extra_context=None):
        refused = self.refuse_nul(request)
        if refused is not None:
            return refused
        refresh_text = request.GET.get(REFRESH_PARAMETER, "")
        refresh = whole_number(refresh_text, digits=4) or 0
        if refresh_text and not MIN_REFRESH_SECONDS <= refresh <= 3600:
            warn_once(request, f"refresh={refresh_text!r}: give seconds from {MIN_REFRESH_SECONDS} to 3600. "
                               "The list is not refreshed.")
            refresh = 0
        kept = request.GET.copy()
        for name in ("p", REFRESH_PARAMETER, "e"):
            kept.pop(name, None)
        query = kept.urlencode()
        here = request.path
        context = {
            "as_of": timezone.now().astimezone(UTC).strftime("%H:%M:%S"),
            "refresh": refresh,
            "refresh_links": [
                (seconds, f"{here}?{query}&{REFRESH_PARAMETER}={seconds}" if query else
                 f"{here}?{REFRESH_PARAMETER}={seconds}")
                for seconds in REFRESH_CHOICES
            ],
            "refresh_off_url": f"{here}?{query}" if query else here,
            "saved_views": self.saved_views(),
            "export_url": reverse("admin:payments_scheduledpayment_export") + (f"?{query}" if query else ""),
            "export_cap": MAX_EXPORT_ROWS,
            **(extra_context or {}),
        }
        return super().changelist_view(request, context)

    def get_urls(self):
        export = path(
            "export/", self.admin_site.admin_view(self.export_view), name="payments_scheduledpayment_export"
        )
        return [export, *super().get_urls()]

    def export_view(self, request):
        """The list as CSV: the rows of the filtered, ordered changelist (the same query
        string), streamed, at most MAX_EXPORT_ROWS (a last row says where it was cut)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        refused = self.refuse_nul(request)
        if refused is not None:
            return refused
        request._dp_export = True
        changelist_url = reverse("admin:payments_scheduledpayment_changelist")
        try:
            changelist = self.get_changelist_instance(request)
        except IncorrectLookupParameters:
            messages.error(request, "The export's filters are not ones the list knows; nothing was exported.")
            return HttpResponseRedirect(changelist_url)
        queryset = changelist.queryset
        response = StreamingHttpResponse(
            csv_lines(payment_export_rows(queryset, cap=MAX_EXPORT_ROWS)), content_type="text/csv; charset=utf-8"
        )
        filename = export_filename(request.GET, today=timezone.now().astimezone(UTC).date())
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
        response["X-Row-Cap"] = str(MAX_EXPORT_ROWS)
        response["Cache-Control"] = "no-store"
        return response

    # A payout's record at its rail and its reserve: only on a payout's page.
    rail_fieldset = (
        "At the rail",
        {
            "fields": (
                "payout_state", "payout_reference", "payout_paid_at", "payout_decline_code", "payout_submissions",
                "payout_lookups", "payout_last_error", "reserve",
            )
        },
    )

    execute_at_col = display_column("execute_at", utc_text, "execute at (UTC)")
    executed_at_col = display_column("executed_at", utc_text, "executed at (UTC)")

    def get_fieldsets(self, request, obj=None):
        fieldsets = super().get_fieldsets(request, obj)
        if obj is not None and obj.is_payout:
            fieldsets = (*fieldsets[:2], self.rail_fieldset, *fieldsets[2:])
        return fieldsets

    @admin.display(description="ledger transfer")
    def ledger_transfer(self, obj):
        if obj.is_payout:  # two-phase: reserve, then post or void, each its own keyed transfer
            keys = [prefix + obj.pk for prefix in (PENDING_PREFIX, POST_PREFIX, VOID_PREFIX)]
            transfers = [t for t in (transfer_by_key(key=key) for key in keys) if t is not None]
        else:
            transfers = [t for t in [transfer_by_key(key=obj.pk)] if t is not None]
        if not transfers:
            return "none: no money moved for this payment"
        return format_html_join(
            "", "<div>{} · {} · {} → {} · {} at {}</div>",
            (
                (admin_link(t, f"transfer #{t.pk}"), t.key, t.debit_account_id, t.credit_account_id, t.amount,
                 t.created_at.isoformat())
                for t in transfers
            ),
        )

    @admin.display(description="payout")
    def payout_state(self, obj):
        payout = payout_of(obj)
        if payout is None:
            return "not at the rail yet: its funds are reserved when it is first submitted"
        return format_html(
            "{} · {} to {} on {}", payout_state_badge(payout.state), payout.amount, payout.destination, payout.rail
        )

    payout_reference = payout_field("reference", "rail's reference")
    payout_paid_at = payout_field("paid_at", "paid at (the rail's time)", lambda value: value.isoformat())
    payout_decline_code = payout_field("decline_code", "decline code")
    payout_submissions = payout_field("submissions", "submissions")
    payout_lookups = payout_field("lookups", "lookups")
    payout_last_error = payout_field("last_error", "last error")

    @admin.display(description="reserve (pending transfer)")
    def reserve(self, obj):
        pending = PendingTransfer.objects.filter(key=obj.pk).first()
        if pending is None:
            return "none: no funds reserved"
        url = reverse("admin:ledger_pendingtransfer_change", args=[id_in_url(pending.pk)])
        resolved = f", {pending.state} at {pending.resolved_at.isoformat()}" if pending.resolved_at else ""
        return format_html(
            '<a href="{}">{}</a> · {} from {} held in {} for {} · reserved at {}{}',
            url, pending.state, pending.amount, pending.debit_account_id, pending.clearing_account_id,
            pending.credit_account_id, pending.created_at.isoformat(), resolved,
        )


    # --- cancel, re-drive, resolve: a confirmation page, then the service on each --------

    confirmed_acts = PAYMENT_ACTS
    cancel_selected = confirmed_action(PAYMENT_ACT["cancel"], "Cancel selected payments (asks for a reason)")
    redrive_selected = confirmed_action(
        PAYMENT_ACT["redrive"], "Re-drive selected payments in review (asks for a reason)"
    )
    resolve_selected = confirmed_action(
        PAYMENT_ACT["resolve"], "Resolve selected payments in review as failed (asks for a reason)"
    )

    def has_cancel_permission(self, request, obj=None) -> bool:
        return has_model_permission(self, request, "cancel")

    def has_redrive_permission(self, request, obj=None) -> bool:
        return has_model_permission(self, request, "redrive")

    def confirmation_rows(self, request, act: PaymentAct, object_ids: list[str]):
        payments = {
            p.pk: p
            for p in ScheduledPayment.objects.filter(pk__in=object_ids).select_related(
                "from_account__owner", "to_account__owner", "to_payee"
            )
        }
        reserved = reserved_payout_ids(object_ids) if act.name == "cancel" else set()
        headers = ["payment", "status", "amount", "from", "to", "due (UTC)", "tries", "review reason", "since (UTC)"]
        rows = []
        for payment_id in sorted(object_ids, key=lambda pk: (pk not in payments, pk)):
            p = payments.get(payment_id)
            if p is None:
                rows.append(ConfirmRow([payment_id, *["-"] * 8], left_alone="no such payment"))
                continue
            if p.status not in act.eligible:
                left_alone = act.ineligible
            elif p.pk in reserved:
                left_alone = RESERVED_AT_RAIL
            else:
                left_alone = ""
            rows.append(ConfirmRow(
                [
                    payment_link(p.pk), status_badge(p.status), p.amount, account_cell(p.from_account),
                    to_cell(p), utc_text(p.execute_at), p.tries, p.review_reason or "-",
                    utc_text(p.updated_at),
                ],
                left_alone=left_alone,
            ))
        return headers, rows

    def perform_act(self, request, act: PaymentAct, object_ids: list[str], form) -> bool:
        """Run ``act`` on each payment through its service and say what happened to each.
        False, with the errors on the form, when the service refused the input itself
        (an execute_at in the past). A payout's rail may refuse it too: funds reserved with
        the outcome unknown (cancel), paid at the rail or no answer from it (resolve)."""
        done, already, refused, missing, at_rail, rail_silent, own = [], [], [], [], [], [], []
        reason = form.cleaned_data["reason"]
        for payment_id in object_ids:
            try:
                payment, changed = act.run(payment_id=payment_id, actor=request.user, data=form.cleaned_data)
            except PaymentValidationError as exc:
                for field, errors in exc.fields.items():
                    form.add_error(field if field in form.fields else None, errors)
                break
            except (PaymentNotCancellable, PaymentNotInReview) as exc:
                refused.append(f"{payment_id} is {exc.status}")
                continue
            except (PayoutOutcomeUnknown, PayoutPaidAtRail) as exc:
                at_rail.append(f"{payment_id} ({exc.detail.rstrip('.')})")
                continue
            except RailUnavailable:
                rail_silent.append(payment_id)
                continue
            except ConflictOfInterest:
                own.append(payment_id)
                continue
            except PaymentNotFound:
                missing.append(payment_id)
                continue
            if changed:
                done.append(payment_id)
                self.log_change(request, payment, f"{act.done} from the admin: {reason}")
            else:
                already.append(payment_id)
        report(request, messages.SUCCESS, act.done, done)
        report(request, messages.INFO, act.already, already)
        report(request, messages.WARNING, act.refused, refused)
        not_done = f"Not {act.done.lower()}"
        report(request, messages.WARNING, f"{not_done}, because of the payout at its rail", at_rail)
        report(request, messages.ERROR, f"{not_done}: the rail did not answer, try again later", rail_silent)
        report(request, messages.ERROR, f"{not_done}: you created it or are a party to it (another staff member "
               "must do it)", own)
        report(request, messages.ERROR, "No such payment", missing)
        return not form.errors

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            can_cancel = (
                obj.status in PAYMENT_ACT["cancel"].eligible
                and self.has_cancel_permission(request, obj)
                and not (obj.is_payout and reserved_payout_ids([obj.pk]))
            )
            can_review = obj.status == PaymentStatus.NEEDS_REVIEW and self.has_redrive_permission(request, obj)
            allowed = ["cancel"] * can_cancel + ["redrive", "resolve"] * can_review
            context["act_urls"] = {
                name: reverse(f"admin:payments_scheduledpayment_{name}", args=[id_in_url(obj.pk)]) for name in allowed
            }
            context["history_url"] = reverse("admin:payments_scheduledpayment_history", args=[id_in_url(obj.pk)])
            context["timeline"], context["timeline_hidden"] = payment_timeline(user=request.user, payment=obj)
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)

    @admin.display(description="staff actions")
    def staff_actions(self, obj):
        """Who cancelled this payment as staff, and why (the ledger's staff actions)."""
        actions = StaffAction.objects.filter(payment_id=obj.pk).select_related("actor").order_by("id")
        if not actions:
            return "-"
        return format_html_join(
            "", "<div>{} · {} by {}: {}</div>",
            ((utc_text(a.created_at), a.action, a.actor.get_username(), a.reason) for a in actions),
        )


# --- recurring payments -------------------------------------------------------------------

# One request pauses or resumes at most this many recurring payments.
MAX_RECURRING_PER_ACTION = 500


class OccurrenceInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = ScheduledPayment
    fk_name = "recurring"
    formset = LatestRowsInlineFormSet
    verbose_name = "occurrence"
    verbose_name_plural = (
        f"occurrences (the latest {LatestRowsInlineFormSet.max_rows}; search the payments for the recurring id "
        "to see them all)"
    )
    fields = ("payment_col", "occurrence_at", "execute_at", "amount", "status_col", "failure_reason")
    readonly_fields = fields
    ordering = ("-occurrence_at", "-id")
    extra = 0
    can_delete = False
    payment_col = display_column("id", payment_link, "payment")
    status_col = display_column("status", status_badge, "status")


class RecurringEventInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = RecurringEvent
    formset = LatestRowsInlineFormSet
    verbose_name_plural = f"event history (the latest {LatestRowsInlineFormSet.max_rows}, newest first)"
    fields = ("created_at", "kind", "actor", "actor_user", "data")
    readonly_fields = fields
    ordering = ("-id",)
    extra = 0
    can_delete = False

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("actor_user")


def rule_text(obj) -> str:
    rule = obj.interval or f"cron {obj.cron}"
    return rule if obj.timezone == "UTC" else f"{rule} ({obj.timezone})"


END_SERIES = ConfirmedAct(
    name="end",
    title="End the series",
    explanation="No further occurrence is generated, for good (an ended series cannot be resumed), and its "
    "scheduled occurrence that has not started is cancelled. Payments of the series that already executed or "
    "failed are left as they are. The same as the API's DELETE of a recurring payment.",
    permission="pause",
)


@admin.register(RecurringPayment)
class RecurringPaymentAdmin(
    ActionPermissionAdminMixin,
    ConfirmedActAdminMixin,
    PayerToPayeeAdminMixin,
    LargeTableAdminMixin,
    ReadOnlyAdminMixin,
    admin.ModelAdmin,
):
    list_display = (
        "id", "from_col", "to_col", "amount_col", "rule_col", "status_col", "next_due_col", "created_at_col"
    )
    list_filter = ("status",)
    ordering = ("-created_at", "-id")
    search_fields = ("id",)  # shows the box; get_search_results does the matching
    search_help_text = (
        "Exact recurring payment id, account id or account owner's username; several separated by spaces."
    )
    actions = ["pause_selected", "resume_selected", "end_selected"]
    inlines = [OccurrenceInline, RecurringEventInline]
    confirmed_acts = (END_SERIES,)
    max_rows_per_act = MAX_RECURRING_PER_ACTION
    end_selected = confirmed_action(
        END_SERIES,
        "End selected recurring payments for good (their scheduled occurrence is cancelled; asks for a reason)",
    )
    fieldsets = (
        (
            "Recurring payment",
            {"fields": ("id", "status_col", "payer_col", "from_detail_col", "to_detail_col", "amount_col")},
        ),
        ("Rule", {"fields": ("start_at", "rule_col", "end_at", "count", "last_at")}),
        ("State", {"fields": ("next_due_col", "next_occurrence_at_col", "last_occurrence_at", "version",
                              "occurrences_col")}),
        ("Record", {"fields": ("created_at", "updated_at")}),
    )

    next_occurrence_at_col = display_column(
        "next_occurrence_at", utc_text, "occurrence after it (UTC; generated when the next payment falls due)"
    )

    @admin.display(description="next payment due (UTC)", ordering="next_occurrence_at")
    def next_due_col(self, obj):
        """When this series next pays: its scheduled occurrence while that one waits
        (``last_occurrence_at`` ahead of now), else the next one to be generated. Nothing
        while paused or ended."""
        if obj.status != RecurringStatus.ACTIVE:
            return "-"
        if obj.last_occurrence_at is not None and obj.last_occurrence_at > timezone.now():
            return utc_text(obj.last_occurrence_at)
        return utc_text(obj.next_occurrence_at) if obj.next_occurrence_at else "-"
    created_at_col = display_column("created_at", utc_text, "created (UTC)")

    @admin.display(description="rule")
    def rule_col(self, obj):
        return rule_text(obj)

    @admin.display(description="all occurrences")
    def occurrences_col(self, obj):
        url = reverse("admin:payments_scheduledpayment_changelist")
        return format_html('<a href="{}?q={}">every payment of this series</a>', url, obj.pk)

    search_condition = staticmethod(recurring_search_condition)

    # --- pause / resume: the list actions and the detail page's buttons -------------

    def has_pause_permission(self, request, obj=None) -> bool:
        return has_model_permission(self, request, "pause")

    @admin.action(description="Pause selected recurring payments (their scheduled occurrence is cancelled)",
                  permissions=["pause"])
    def pause_selected(self, request, queryset):
        self.transition_selected(request, queryset, RecurringStatus.PAUSED)

    @admin.action(description="Resume selected recurring payments (from now; missed occurrences are skipped)",
                  permissions=["pause"])
    def resume_selected(self, request, queryset):
        self.transition_selected(request, queryset, RecurringStatus.ACTIVE)

    def transition_selected(self, request, queryset, status: str) -> None:
        refusal = f"Select at most {MAX_RECURRING_PER_ACTION} recurring payments; nothing changed."
        ids = self.selected_ids(request, queryset, limit=MAX_RECURRING_PER_ACTION, refusal=refusal)
        if ids is not None:
            self.transition_and_report(request, ids, status)

    def transition_and_report(self, request, recurring_ids: list[str], status: str) -> None:
        """Pause or resume each through the service and say what happened to each."""
        service, verb = (
            (recurring_pause, "Paused") if status == RecurringStatus.PAUSED else (recurring_resume, "Resumed")
        )
        before = dict(RecurringPayment.objects.filter(pk__in=recurring_ids).values_list("pk", "status"))
        changed, already, refused, missing = [], [], [], []
        for recurring_id in recurring_ids:
            try:
                rec = service(recurring_id=recurring_id, actor=request.user)
            except RecurringStateError as exc:
                refused.append(f"{recurring_id} is {exc.status}")
                continue
            except RecurringNotFound:
                missing.append(recurring_id)
                continue
            if before.get(recurring_id) == status:
                already.append(recurring_id)
            else:
                changed.append(recurring_id)
                self.log_change(request, rec, f"{verb} from the admin.")
        report(request, messages.SUCCESS, verb, changed)
        report(request, messages.INFO, f"Already {status}", already)
        report(request, messages.WARNING, "Refused", refused)
        report(request, messages.ERROR, "No such recurring payment", missing)

    def get_urls(self):
        return [
            object_view_url(self, "pause", self.pause_view),
            object_view_url(self, "resume", self.resume_view),
            *super().get_urls(),
        ]

    def pause_view(self, request, object_id):
        return self.transition_view(request, object_id, RecurringStatus.PAUSED)

    def resume_view(self, request, object_id):
        return self.transition_view(request, object_id, RecurringStatus.ACTIVE)

    def transition_view(self, request, object_id, status: str):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_pause_permission(request):
            raise PermissionDenied
        self.transition_and_report(request, [unquote(object_id)], status)
        return HttpResponseRedirect(reverse("admin:payments_recurringpayment_change", args=[object_id]))

    # --- end: a confirmation page with a reason, then recurring_end -------------------------

    def confirmation_rows(self, request, act: ConfirmedAct, object_ids: list[str]):
        found = {r.pk: r for r in RecurringPayment.objects.filter(pk__in=object_ids)}
        pending = dict(
            ScheduledPayment.objects.filter(recurring_id__in=object_ids, status=PaymentStatus.SCHEDULED)
            .values("recurring_id").annotate(n=Count("id")).values_list("recurring_id", "n")
        )
        rows = []
        for recurring_id in sorted(object_ids, key=lambda pk: (pk not in found, pk)):
            rec = found.get(recurring_id)
            if rec is None:
                rows.append(ConfirmRow([recurring_id, "-", "-", "-", "-"], left_alone="no such recurring payment"))
                continue
            rows.append(ConfirmRow(
                [admin_link(rec), rule_text(rec), status_badge(rec.status), money(rec.amount),
                 pending.get(rec.pk, 0)],
                left_alone="already ENDED" if rec.status == RecurringStatus.ENDED and not pending.get(rec.pk) else "",
            ))
        return ["recurring payment", "rule", "status", "amount", "scheduled occurrence to cancel"], rows

    def perform_act(self, request, act: ConfirmedAct, object_ids: list[str], form) -> bool:
        reason = form.cleaned_data["reason"]
        before = dict(RecurringPayment.objects.filter(pk__in=object_ids).values_list("pk", "status"))
        ended, already, missing = [], [], []
        for recurring_id in object_ids:
            try:
                rec = recurring_end(recurring_id=recurring_id, actor=request.user, reason=reason)
            except RecurringNotFound:
                missing.append(recurring_id)
                continue
            if before.get(recurring_id) == RecurringStatus.ENDED:
                already.append(recurring_id)
            else:
                ended.append(recurring_id)
                self.log_change(request, rec, f"Ended from the admin: {reason}")
        report(request, messages.SUCCESS, "Ended", ended)
        report(request, messages.INFO, "Already ENDED", already)
        report(request, messages.ERROR, "No such recurring payment", missing)
        return True

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        allowed = obj is not None and self.has_pause_permission(request, obj)
        context["can_pause"] = allowed and obj.status == RecurringStatus.ACTIVE
        context["can_resume"] = allowed and obj.status == RecurringStatus.PAUSED
        context["can_end"] = allowed and obj.status != RecurringStatus.ENDED
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)


class PaymentAuditAdmin(ActionPermissionAdminMixin, LargeTableAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """The append-only tables beside a payment, newest first, searched by payment id."""

    ordering = ("-id",)
    search_fields = ("payment__id",)  # shows the box; get_search_results does the matching
    search_help_text = "Exact payment id; several separated by spaces."
    search_by = "payment_id"
    payment_col = display_column("payment_id", payment_link, "payment", ordering="payment")

    def get_search_results(self, request, queryset, search_term):
        terms = search_term.split()[:MAX_SEARCH_TERMS]
        return (queryset.filter(**{f"{self.search_by}__in": terms}) if terms else queryset), False


@admin.register(PaymentEvent)
class PaymentEventAdmin(PaymentAuditAdmin):
    """The audit trail on its own: who cancelled what, and when."""

    list_display = ("id", "created_at", "payment_col", "kind", "from_status", "to_status", "attempt", "actor")
    list_filter = ("kind",)


@admin.register(ExecutionAttempt)
class ExecutionAttemptAdmin(PaymentAuditAdmin):
    list_display = ("id", "payment_col", "attempt", "outcome", "started_at", "finished_at", "worker")
    list_filter = ("outcome",)


@admin.register(RecurringEvent)
class RecurringEventAdmin(PaymentAuditAdmin):
    """A recurring payment's audit trail on its own, including the skipped occurrences."""

    list_display = ("id", "created_at", "recurring", "kind", "actor")
    list_filter = ("kind",)
    search_fields = ("recurring__id",)
    search_help_text = "Exact recurring payment id; several separated by spaces."
    search_by = "recurring_id"


@admin.register(ArchivedPartition)
class ArchivedPartitionAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The months of the schedule that left the database (payments/partitions.py): where
    their files are, what they held, and the totals reconciliation checks the ledger
    against. A payment id in one of these ranges answers 410 payment_archived."""

    list_display = ("month", "payments", "executed_count", "executed_amount", "location", "archived_at")
    fields = ("month", "id_low", "id_high", "payments", "executed_count", "executed_amount", "location",
              "manifest", "archived_at")

