"""The scheduled payments' list and page: the change lists, the refresh, the CSV export, ScheduledPaymentAdmin."""

import csv
import re
from collections.abc import Iterator
from datetime import UTC

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import flatten_fieldsets
from django.db.models import OuterRef, Subquery
from django.http import HttpResponseRedirect, StreamingHttpResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from common.admin_tools import (
    ActionPermissionAdminMixin,
    ConfirmedActAdminMixin,
    ConfirmRow,
    LargeTableAdminMixin,
    LimitedChangeList,
    ReadOnlyAdminMixin,
    confirmed_action,
    display_column,
    has_model_permission,
    id_in_url,
    report,
)
from common.authz import ConflictOfInterest, MissingPermission
from common.formats import human
from console.admin_rails import payout_state_badge
from console.dashboard import age_text
from ledger.models import PendingTransfer, StaffAction
from ledger.selectors import search_phrase, transfer_by_key
from ledger.services import PENDING_PREFIX, POST_PREFIX, VOID_PREFIX
from payments.exceptions import (
    PaymentNotCancellable,
    PaymentNotFound,
    PaymentNotInReview,
    PaymentValidationError,
    PayoutOutcomeUnknown,
    PayoutPaidAtRail,
    RailUnavailable,
)
from payments.models import (
    FailureReason,
    PaymentStatus,
    Payout,
    RailState,
    ScheduledPayment,
)
from payments.reasons import failure_reason
from payments.selectors import (
    payment_execute_at_bounds,
    payment_execute_at_condition,
)

from . import display
from .display import (
    account_cell,
    admin_link,
    failure_reason_text,
    from_detail,
    party_cell,
    payment_admin_search_condition,
    payment_link,
    rail_cell,
    reserved_payout_ids,
    review_reason_text,
    search_terms,
    status_badge,
    to_cell,
    to_detail,
)
from .filters import (
    USER_ID_DIGITS,
    AccountFilter,
    AmountFilter,
    DirectionFilter,
    DueFilter,
    DueRangeFilter,
    FailureReasonFilter,
    KindFilter,
    PayeeFilter,
    PayerFilter,
    RailFilter,
    RecurrenceFilter,
    warn_once,
    whole_number,
)
from .review import PAYMENT_ACT, PAYMENT_ACTS, RESERVED_AT_RAIL, PaymentAct, payment_timeline, payout_field, payout_of


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
    amount_col = display_column("amount", human, "amount")

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


def in_review_queue(request) -> bool:
    """Whether the list shows the review queue (status NEEDS_REVIEW): it has columns of its own."""
    return request.GET.get("status__exact") == PaymentStatus.NEEDS_REVIEW


# The review queue's columns: what staff triage on (why it waits, since when, the rail),
# instead of the due and executed times and the failure reason, which a parked payment
# does not have.
REVIEW_LIST_DISPLAY = (
    "id", "from_col", "to_col", "amount_col", "review_reason_col", "parked_since_col", "tries", "at_rail_col",
)


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
        "failure_reason_col",
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
        "Exact payment, recurring or account ids, or the start of a username, several separated by spaces or commas "
        f"(at most {display.MAX_SEARCH_TERMS}); or an account's name, the words as one phrase (holiday fund)."
    )
    actions = ["cancel_selected", "redrive_selected", "resolve_selected"]

    # --- the review queue's columns --------------------------------------------------------

    def get_list_display(self, request):
        return REVIEW_LIST_DISPLAY if in_review_queue(request) else super().get_list_display(request)

    def get_queryset(self, request):
        """In the review queue each row carries its rail's breaker and its payout's state
        (one subquery each over a few rows: the rail table has a row per rail)."""
        queryset = super().get_queryset(request)
        if in_review_queue(request):
            rail = RailState.objects.filter(rail=OuterRef("rail"))
            queryset = queryset.annotate(
                rail_breaker=Subquery(rail.values("breaker")[:1]),
                rail_forced=Subquery(rail.values("forced")[:1]),
                payout_state=Subquery(Payout.objects.filter(pk=OuterRef("pk")).values("state")[:1]),
            )
        return queryset

    @admin.display(description="why it waits", ordering="review_reason")
    def review_reason_col(self, obj):
        return review_reason_text(obj.review_reason)

    @admin.display(description="failure reason", ordering="failure_reason")
    def failure_reason_col(self, obj):
        """Narrow in the list: the reason's first words and its code, the sentence on hover."""
        if not obj.failure_reason:
            return "-"
        reason = failure_reason(obj.failure_reason)
        return format_html('<span title="{}">{}</span>', human(reason), human(reason, "headline"))

    @admin.display(description="failure reason")
    def failure_reason_detail(self, obj):
        return failure_reason_text(obj.failure_reason) if obj.failure_reason else "-"

    @admin.display(description="review reason", ordering="review_reason")
    def review_reason_detail(self, obj):
        return review_reason_text(obj.review_reason) if obj.review_reason else "-"

    expires_after_col = display_column("expires_after", human, "expires after")

    @admin.display(description="parked since (UTC)", ordering="updated_at")
    def parked_since_col(self, obj):
        """A payment in review is not updated until staff act: updated_at is when it was
        parked (payments_review_idx, the dashboard's queue age)."""
        age = max((timezone.now() - obj.updated_at).total_seconds(), 0)
        return format_html('{}<br><span class="dp-quiet">{} ago</span>', human(obj.updated_at), age_text(age))

    @admin.display(description="at the rail")
    def at_rail_col(self, obj):
        if not obj.rail:
            return "-"
        state = getattr(obj, "payout_state", None)
        return format_html(
            "{}<br>{}", rail_cell(obj.rail, breaker=getattr(obj, "rail_breaker", None),
                                  forced=getattr(obj, "rail_forced", "") or ""),
            format_html("payout {}", payout_state_badge(state)) if state else "payout not submitted yet",
        )

    # Attempts and events: one timeline under the first section (change_form.html), not inlines.
    inlines = []
    fieldsets = (
        (
            "What happened",
            {
                "fields": (
                    "status_col", "amount_col", "from_detail_col", "to_detail_col", "payer_col", "execute_at_detail",
                    "executed_at_detail", "failure_reason_detail", "review_reason_detail", "next_attempt_at_detail",
                )
            },
        ),
        (
            "Schedule",
            {"fields": (
                "requested_execute_at", "jitter_seconds", "expires_after_col", "recurring_col", "occurrence_at",
            )},
        ),
        (
            "State",
            {"fields": ("attempt", "tries", "lease_until", "claimed_at", "cancelled_at", "version")},
        ),
        ("Ledger", {"fields": ("ledger_transfer", "staff_actions")}),
        ("Record", {"fields": ("created_at", "updated_at")}),
    )

    execute_at_detail = display_column("execute_at", human, "due (UTC)")
    executed_at_detail = display_column("executed_at", human, "executed (UTC)")
    next_attempt_at_detail = display_column("next_attempt_at", human, "next attempt (UTC)")

    @admin.display(description="recurring payment")
    def recurring_col(self, obj):
        return admin_link(obj.recurring) if obj.recurring_id else "-"

    def get_search_results(self, request, queryset, search_term):
        terms, given = search_terms(search_term)
        if not terms:
            return queryset, False
        if given > len(terms):
            warn_once(request, f"{given} ids or names pasted, the first {len(terms)} searched.")
        condition, more = payment_admin_search_condition(terms=terms, phrase=search_phrase(search_term))
        if more:
            warn_once(
                request,
                f"The names given start more than {display.MAX_PREFIX_ACCOUNTS} accounts' names or usernames: the "
                f"first {display.MAX_PREFIX_ACCOUNTS} accounts are searched. Type more of the name.",
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
            raise MissingPermission("payments.view_scheduledpayment")
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

    execute_at_col = display_column("execute_at", human, "execute at (UTC)")
    executed_at_col = display_column("executed_at", human, "executed at (UTC)")

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
                (admin_link(t, f"transfer #{t.pk}"), t.key, t.debit_account_id, t.credit_account_id, human(t.amount),
                 human(t.created_at))
                for t in transfers
            ),
        )

    @admin.display(description="payout")
    def payout_state(self, obj):
        payout = payout_of(obj)
        if payout is None:
            return "not at the rail yet: its funds are reserved when it is first submitted"
        return format_html(
            "{} · {} to {} on {}", payout_state_badge(payout.state), human(payout.amount), payout.destination,
            payout.rail,
        )

    payout_reference = payout_field("reference", "rail's reference")
    payout_paid_at = payout_field("paid_at", "paid at (the rail's time)", human)
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
        resolved = f", {pending.state} at {human(pending.resolved_at)}" if pending.resolved_at else ""
        return format_html(
            '<a href="{}">{}</a> · {} from {} held in {} for {} · reserved at {}{}',
            url, pending.state, human(pending.amount), pending.debit_account_id, pending.clearing_account_id,
            pending.credit_account_id, human(pending.created_at), resolved,
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
        rails = RailState.objects.in_bulk({p.rail for p in payments.values() if p.rail})
        headers = ["payment", "status", "amount", "from", "to", "due (UTC)", "tries", "review reason", "since (UTC)",
                   "rail now"]
        rows = []
        for payment_id in sorted(object_ids, key=lambda pk: (pk not in payments, pk)):
            p = payments.get(payment_id)
            if p is None:
                rows.append(ConfirmRow([payment_id, *["-"] * 9], left_alone="no such payment"))
                continue
            if p.status not in act.eligible:
                left_alone = act.ineligible
            elif p.pk in reserved:
                left_alone = RESERVED_AT_RAIL
            else:
                left_alone = ""
            rows.append(ConfirmRow(
                [
                    payment_link(p.pk), status_badge(p.status), human(p.amount), account_cell(p.from_account),
                    to_cell(p), human(p.execute_at), p.tries, review_reason_text(p.review_reason),
                    human(p.updated_at), self.rail_now(p, rails),
                ],
                left_alone=left_alone,
            ))
        return headers, rows

    @staticmethod
    def rail_now(payment, rails: dict[str, RailState]):
        """A payout's rail and its breaker as the confirmation page is shown: re-driving
        payouts into an open breaker only queues them."""
        state = rails.get(payment.rail)
        return rail_cell(payment.rail, breaker=state.breaker if state else None, forced=state.forced if state else "")

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
            ((human(a.created_at), a.action, a.actor.get_username(), a.reason) for a in actions),
        )
