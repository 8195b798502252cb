"""The payouts console: payees, payouts at their rail, and the Rails page.

Payees are their owners' (the API creates and deletes them): staff read them, nothing
more. A payout's record at its rail is read here and on its payment's page. The Rails
page shows each rail's circuit breaker and its pending payouts; "Force open", "Force
closed" and "Clear the hold" call ``breaker_force`` behind the confirmation page with a
reason (common/admin_tools.py), with ``payments.force_breaker``. ``breaker_force`` logs
the act; nothing else is recorded.
"""

from dataclasses import dataclass
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import Q
from django.urls import reverse
from django.utils.html import format_html

from common.admin_tools import (
    ActionPermissionAdminMixin,
    ConfirmedAct,
    ConfirmedActAdminMixin,
    ConfirmRow,
    LargeTableAdminMixin,
    ReadOnlyAdminMixin,
    badge,
    confirmed_action,
    display_column,
    id_in_url,
    report,
)
from common.formats import human
from console.dashboard import age_text, breaker_text, breaker_tone
from payments.breaker import breaker_force
from payments.models import BreakerState, Payee, Payout, PayoutState, Rail, RailState
from payments.selectors import RailReading, rail_states

MAX_SEARCH_TERMS = 50

PAYOUT_STATE_TONES = {
    PayoutState.PENDING: "purple",
    PayoutState.PAID: "green",
    PayoutState.DECLINED: "red",
    PayoutState.VOIDED: "grey",
}

FORCE_BREAKER = "payments.force_breaker"


def payout_state_badge(state: str):
    return badge(state, PAYOUT_STATE_TONES.get(state, "grey"))


def breaker_badge(*, breaker: str, forced: str):
    return badge(breaker_text(breaker=breaker, forced=forced), breaker_tone(breaker=breaker, forced=forced))


def payee_url(payee_id: str) -> str:
    return reverse("admin:payments_payee_change", args=[id_in_url(payee_id)])


def payee_cell(payee):
    """The payee's name, linked (its id on hover), then its rail and destination."""
    return format_html(
        '<a href="{}" title="{}">{}</a> <span class="dp-quiet">{} · {}</span>',
        payee_url(payee.pk), payee.pk, payee.name, payee.rail, payee.destination,
    )


def payments_to_payee_url(payee_id: str) -> str:
    return reverse("admin:payments_scheduledpayment_changelist") + "?" + urlencode({"payee": payee_id})


def pending_payouts_url(rail: str) -> str:
    query = urlencode({"rail__exact": rail, "state__exact": PayoutState.PENDING})
    return reverse("admin:payments_payout_changelist") + "?" + query


def _payment_link(payment_id: str):
    url = reverse("admin:payments_scheduledpayment_change", args=[id_in_url(payment_id)])
    return format_html('<a class="dp-mono" href="{}">{}</a>', url, payment_id)


# --- payees ---------------------------------------------------------------------------------


class DeletedFilter(admin.SimpleListFilter):
    title = "deleted"
    parameter_name = "deleted"

    def lookups(self, request, model_admin):
        return [("no", "No (in use)"), ("yes", "Yes (hidden from its owner)")]

    def queryset(self, request, queryset):
        if self.value() in ("yes", "no"):
            return queryset.filter(deleted_at__isnull=self.value() == "no")
        return queryset


@admin.register(Payee)
class PayeeAdmin(ActionPermissionAdminMixin, LargeTableAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Read-only: a payee is its owner's (POST and DELETE /api/v1/payees)."""

    list_display = ("id", "name", "owner", "rail", "destination", "created_at_col", "deleted")
    list_select_related = ("owner",)
    list_filter = ("rail", DeletedFilter)
    ordering = ("-id",)  # ids are time-ordered (ULIDs): newest first, by the primary key
    search_fields = ("id",)  # shows the box; get_search_results does the matching
    search_help_text = (
        "Exact payee id, owner's username or destination (several separated by spaces), or part of a name."
    )
    fields = ("id", "name", "owner", "rail", "destination", "created_at", "deleted_at", "payments_col")
    readonly_fields = fields

    created_at_col = display_column("created_at", human, "created (UTC)")

    @admin.display(description="deleted", boolean=True, ordering="deleted_at")
    def deleted(self, obj) -> bool:
        return obj.deleted_at is not None

    @admin.display(description="payouts")
    def payments_col(self, obj):
        return format_html('<a href="{}">every payout to this payee</a>', payments_to_payee_url(obj.pk))

    def get_search_results(self, request, queryset, search_term):
        terms = search_term.split()[:MAX_SEARCH_TERMS]
        if not terms:
            return queryset, False
        matching = (
            Q(pk__in=terms)
            | Q(owner__username__in=terms)
            | Q(destination__in=terms)
            | Q(name__icontains=search_term.strip())
        )
        return queryset.filter(matching), False


# --- payouts at their rail ----------------------------------------------------------------------


@admin.register(Payout)
class PayoutAdmin(ActionPermissionAdminMixin, LargeTableAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Each payout whose funds were reserved, as its rail knows it."""

    list_display = (
        "payment_col", "rail", "destination", "amount_col", "state_col", "reference", "paid_at_col", "decline_code",
        "submissions", "lookups", "created_at_col",
    )
    list_filter = ("rail", "state")
    ordering = ("-payment",)  # payment ids are time-ordered: newest first, by the primary key
    search_fields = ("payment__id",)  # shows the box; get_search_results does the matching
    search_help_text = "Exact payment id or the rail's reference; several separated by spaces."
    fields = (
        "payment_col", "rail", "destination", "amount_col", "state_col", "reference", "paid_at", "decline_code",
        "submissions", "lookups", "last_error", "created_at", "updated_at",
    )
    readonly_fields = fields

    payment_col = display_column("payment_id", _payment_link, "payment", ordering="payment")
    amount_col = display_column("amount", human, "amount")
    state_col = display_column("state", payout_state_badge, "state")
    paid_at_col = display_column("paid_at", human, "paid at (UTC)")
    created_at_col = display_column("created_at", human, "reserved (UTC)")

    def get_search_results(self, request, queryset, search_term):
        terms = search_term.split()[:MAX_SEARCH_TERMS]
        if not terms:
            return queryset, False
        return queryset.filter(Q(payment_id__in=terms) | Q(reference__in=terms)), False


# --- the Rails page -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RailAct(ConfirmedAct):
    forced: str  # what breaker_force is given: "open", "closed" or "" (clear)
    done: str
    already: str


RAIL_ACTS = (
    RailAct(
        name="force_open",
        title="Force open",
        explanation="The rail's breaker is held OPEN until the hold is cleared: none of its payouts is claimed "
        "(they wait, SCHEDULED, their retry budget untouched). Payouts already at the rail still get their answers "
        "looked up. Your user and reason are logged.",
        permission="force_breaker",
        forced=BreakerState.OPEN,
        done="Forced open",
        already="Already forced open",
    ),
    RailAct(
        name="force_closed",
        title="Force closed",
        explanation="The rail's breaker is held CLOSED until the hold is cleared: its payouts are claimed at the "
        "paced rate whatever the rail answers, failures included. Your user and reason are logged.",
        permission="force_breaker",
        forced=BreakerState.CLOSED,
        done="Forced closed",
        already="Already forced closed",
    ),
    RailAct(
        name="clear_hold",
        title="Clear the hold",
        explanation="The staff hold is cleared and the breaker starts again from CLOSED, counting failures from "
        "zero. Rails without a hold are left alone. Your user and reason are logged.",
        permission="force_breaker",
        forced="",
        button="Clear the hold on {count}",
        done="Hold cleared",
        already="No hold to clear",
    ),
)
RAIL_ACT = {act.name: act for act in RAIL_ACTS}


class RailChangeList(ChangeList):
    """The changelist with each rail's pending payouts (``rail_states()``) beside its row."""

    def get_results(self, request):
        super().get_results(request)
        readings = {reading.rail: reading for reading in rail_states()}
        self.result_list = list(self.result_list)
        for state in self.result_list:
            state.reading = readings.get(state.rail)


def reading_of(state: RailState) -> RailReading | None:
    if not hasattr(state, "reading"):
        state.reading = next((r for r in rail_states() if r.rail == state.rail), None)
    return state.reading


@admin.register(RailState)
class RailStateAdmin(ActionPermissionAdminMixin, ConfirmedActAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """The Rails page: one row per rail."""

    act_permissions = {"force_breaker": FORCE_BREAKER}  # the 403 page names it (common/admin_tools.py)

    list_display = (
        "rail", "effective_col", "forced_col", "forced_by", "opened_at_col", "consecutive_failures",
        "window_calls", "window_failures", "pending_col", "oldest_pending_col",
    )
    list_display_links = ("rail",)
    ordering = ("rail",)
    actions = ["force_open_selected", "force_closed_selected", "clear_hold_selected"]
    fields = (
        "rail", "effective_col", "breaker", "forced_col", "forced_by", "forced_reason", "opened_at",
        "consecutive_failures", "window_started_at", "window_calls", "window_failures", "probes_claimed",
        "tokens", "refilled_at", "updated_at", "pending_col", "oldest_pending_col",
    )
    readonly_fields = fields

    def get_changelist(self, request, **kwargs):
        return RailChangeList

    def changelist_view(self, request, extra_context=None):
        title = "Rails: circuit breakers and pending payouts"
        return super().changelist_view(request, {"title": title, **(extra_context or {})})

    @admin.display(description="state (what the claim obeys)")
    def effective_col(self, obj):
        return breaker_badge(breaker=obj.breaker, forced=obj.forced)

    @admin.display(description="staff hold", ordering="forced")
    def forced_col(self, obj):
        return obj.forced or "-"

    opened_at_col = display_column("opened_at", human, "opened at (UTC)")

    @admin.display(description="pending payouts")
    def pending_col(self, obj):
        reading = reading_of(obj)
        if reading is None:
            return "-"
        return format_html('<a href="{}">{}</a>', pending_payouts_url(obj.rail), human(reading.pending))

    @admin.display(description="oldest pending")
    def oldest_pending_col(self, obj):
        reading = reading_of(obj)
        return age_text(reading.pending_oldest_age_seconds) if reading and reading.pending else "-"

    # --- force open / force closed / clear the hold ---------------------------------------

    confirmed_acts = RAIL_ACTS
    force_open_selected = confirmed_action(
        RAIL_ACT["force_open"], "Force the selected rails' breakers open (asks for a reason)"
    )
    force_closed_selected = confirmed_action(
        RAIL_ACT["force_closed"], "Force the selected rails' breakers closed (asks for a reason)"
    )
    clear_hold_selected = confirmed_action(
        RAIL_ACT["clear_hold"], "Clear the staff hold on the selected rails (asks for a reason)"
    )

    def has_force_breaker_permission(self, request, obj=None) -> bool:
        return request.user.has_perm(FORCE_BREAKER)

    def confirmation_rows(self, request, act: RailAct, object_ids: list[str]):
        states = {s.rail: s for s in RailState.objects.filter(rail__in=object_ids)}
        readings = {r.rail: r for r in rail_states()}
        rows = []
        for rail in sorted(object_ids, key=lambda pk: (pk not in states, pk)):
            state = states.get(rail)
            if state is None:
                rows.append(ConfirmRow([rail, *["-"] * 4], left_alone="no such rail"))
                continue
            reading = readings.get(rail)
            rows.append(ConfirmRow(
                [rail, breaker_badge(breaker=state.breaker, forced=state.forced), state.forced_by or "-",
                 state.forced_reason or "-", human(reading.pending) if reading else "-"],
                left_alone=act.already.lower() if state.forced == act.forced else "",
            ))
        return ["rail", "state", "held by", "hold's reason", "pending payouts"], rows

    def perform_act(self, request, act: RailAct, object_ids: list[str], form) -> bool:
        """``breaker_force`` on each rail not already where the act puts it."""
        done, already, missing = [], [], []
        reason = form.cleaned_data["reason"]
        for rail in object_ids:
            state = RailState.objects.filter(rail=rail).first()
            if state is None or rail not in Rail.values:
                missing.append(rail)
            elif state.forced == act.forced:
                already.append(rail)
            else:
                breaker_force(rail=rail, forced=act.forced, actor=request.user, reason=reason)
                done.append(rail)
        report(request, messages.SUCCESS, act.done, done)
        report(request, messages.INFO, act.already, already)
        report(request, messages.ERROR, "No such rail", missing)
        return True

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        allowed = obj is not None and self.has_force_breaker_permission(request, obj)
        context["can_force_open"] = allowed and obj.forced != BreakerState.OPEN
        context["can_force_closed"] = allowed and obj.forced != BreakerState.CLOSED
        context["can_clear_hold"] = allowed and obj.forced != ""
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)
