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

from collections.abc import Callable
from dataclasses import dataclass

from django.contrib import admin, messages
from django.contrib.admin.utils import flatten_fieldsets, quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from common.admin_tools import (
    ActionPermissionAdminMixin,
    ConfirmedAct,
    ConfirmedActAdminMixin,
    ConfirmRow,
    LargeTableAdminMixin,
    LatestRowsInlineFormSet,
    ReadOnlyAdminMixin,
    ReasonForm,
    badge,
    confirmed_action,
    display_column,
    has_model_permission,
    object_view_url,
    report,
    utc_text,
)
from ledger.models import PendingTransfer, StaffAction
from ledger.selectors import transfer_by_key
from ledger.services import PENDING_PREFIX, POST_PREFIX, VOID_PREFIX

from .admin_rails import payee_cell, payout_state_badge
from .exceptions import (
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
from .forms import RedriveForm, ReviewForm
from .models import (
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
from .selectors import (
    payment_due_next_hour_condition,
    payment_due_today_condition,
    payment_execute_at_bounds,
    payment_execute_at_condition,
    payment_overdue_condition,
    payment_search_condition,
    recurring_search_condition,
)
from .series import recurring_pause, recurring_resume
from .services import payment_cancel_by_staff, payment_redrive, payment_resolve

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

# More search terms than this are ignored (each is an exact id or username).
MAX_SEARCH_TERMS = 50


def status_badge(status: str):
    return badge(status, STATUS_TONES.get(status, "grey"))


def admin_link(obj, text=None):
    """A link to ``obj``'s admin change page (primary keys quoted as the admin does)."""
    url = reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[quote(obj.pk)])
    return format_html('<a href="{}">{}</a>', url, text if text is not None else obj.pk)


def payment_link(payment_id: str):
    url = reverse("admin:payments_scheduledpayment_change", args=[quote(payment_id)])
    return format_html('<a href="{}">{}</a>', url, payment_id)


def account_cell(account):
    """The account's owner, linked to the account (its id on hover): the list stays
    narrow enough to show every column; the detail page has the full ids."""
    owner = account.owner.username if account.owner_id else account.name
    url = reverse("admin:ledger_account_change", args=[quote(account.pk)])
    return format_html('<a href="{}" title="{}">{}</a>', url, account.pk, owner)


def to_cell(obj):
    """Whom a payment (or recurring payment) pays: an account, or a payee through its rail."""
    return account_cell(obj.to_account) if obj.to_payee_id is None else payee_cell(obj.to_payee)


def to_detail(obj):
    """The detail page's "to": the account with its id, or the payee with its rail and destination."""
    if obj.to_payee_id is None:
        return format_html("{} <span class=\"dp-mono\">{}</span>", account_cell(obj.to_account), obj.to_account_id)
    return format_html("payout: {} <span class=\"dp-mono\">{}</span>", payee_cell(obj.to_payee), obj.to_payee_id)


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
        return queryset if condition is None else queryset.filter(condition())


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


class ExecutionAttemptInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = ExecutionAttempt
    fields = ("attempt", "outcome", "started_at", "finished_at", "worker", "error")
    readonly_fields = fields
    ordering = ("attempt",)
    extra = 0
    can_delete = False


class PaymentEventInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = PaymentEvent
    verbose_name_plural = "event history"
    fields = ("created_at", "kind", "from_status", "to_status", "attempt", "actor", "actor_user", "data")
    readonly_fields = fields
    ordering = ("id",)
    extra = 0
    can_delete = False

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("actor_user")


class PayerToPayeeAdminMixin:
    """What payments and recurring payments show alike: who pays whom (owners linked to
    their accounts), a status badge, and every field of the fieldsets read-only."""

    list_select_related = ("from_account__owner", "to_account__owner", "to_payee")
    from_col = display_column("from_account", account_cell, "from")
    status_col = display_column("status", status_badge, "status")

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
        terms = search_term.split()[:MAX_SEARCH_TERMS]
        if not terms:
            return queryset, False
        return queryset.filter(self.search_condition(terms=terms)), False

    def selected_ids(self, request, queryset, *, limit: int, refusal: str) -> list[str] | None:
        """The selection's ids, or None (saying ``refusal``) when it is over ``limit``: a
        "select all 1,000,000" must not become a request that runs for an hour."""
        ids = sorted(queryset.order_by().values_list("pk", flat=True)[: limit + 1])
        if len(ids) > limit:
            self.message_user(request, refusal, messages.ERROR)
            return None
        return ids


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
        "amount",
        "execute_at_col",
        "status_col",
        "attempt",
        "executed_at_col",
        "failure_reason",
    )
    list_filter = ("status", DueFilter, FailureReasonFilter, KindFilter, RailFilter, PayeeFilter)
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
        key past every row the filter does not hold."""
        if request.GET.get(DueFilter.parameter_name) in DueFilter.CONDITIONS:
            return ("execute_at", "id")
        if request.GET.get(FailureReasonFilter.parameter_name) in FailureReason.values:
            return ("-execute_at", "-id")
        if request.GET.get("status__exact") == PaymentStatus.NEEDS_REVIEW:
            return ("updated_at", "id")  # the review queue: longest waiting first (payments_review_idx)
        return super().get_ordering(request)
    search_fields = ("id",)  # shows the box; get_search_results does the matching
    search_help_text = "Exact payment id, account id or account owner's username; several separated by spaces."
    actions = ["cancel_selected", "redrive_selected", "resolve_selected"]
    inlines = [ExecutionAttemptInline, PaymentEventInline]
    fieldsets = (
        ("Payment", {"fields": ("id", "payer", "from_account", "to_detail_col", "amount", "execute_at")}),
        (
            "Schedule",
            {"fields": ("requested_execute_at", "jitter_seconds", "expires_after", "recurring", "occurrence_at")},
        ),
        (
            "State",
            {
                "fields": (
                    "status_col",
                    "failure_reason",
                    "review_reason",
                    "attempt",
                    "tries",
                    "next_attempt_at",
                    "lease_until",
                    "claimed_at",
                    "executed_at",
                    "cancelled_at",
                    "version",
                )
            },
        ),
        ("Ledger", {"fields": ("ledger_transfer", "staff_actions")}),
        ("Record", {"fields": ("created_at", "updated_at")}),
    )

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
        url = reverse("admin:ledger_pendingtransfer_change", args=[quote(pending.pk)])
        resolved = f", {pending.state} at {pending.resolved_at.isoformat()}" if pending.resolved_at else ""
        return format_html(
            '<a href="{}">{}</a> · {} from {} held in {} for {} · reserved at {}{}',
            url, pending.state, pending.amount, pending.debit_account_id, pending.clearing_account_id,
            pending.credit_account_id, pending.created_at.isoformat(), resolved,
        )

    search_condition = staticmethod(payment_search_condition)

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
        done, already, refused, missing, at_rail, rail_silent = [], [], [], [], [], []
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
        report(request, messages.ERROR, "No such payment", missing)
        return not form.errors

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        context["can_cancel"] = (
            obj is not None
            and obj.status in PAYMENT_ACT["cancel"].eligible
            and self.has_cancel_permission(request, obj)
            and not (obj.is_payout and reserved_payout_ids([obj.pk]))
        )
        context["can_review"] = (
            obj is not None and obj.status == PaymentStatus.NEEDS_REVIEW and self.has_redrive_permission(request, obj)
        )
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


@admin.register(RecurringPayment)
class RecurringPaymentAdmin(
    ActionPermissionAdminMixin, PayerToPayeeAdminMixin, LargeTableAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin
):
    list_display = (
        "id", "from_col", "to_col", "amount", "rule_col", "status_col", "next_occurrence_at_col", "created_at_col"
    )
    list_filter = ("status",)
    ordering = ("-created_at", "-id")
    search_fields = ("id",)  # shows the box; get_search_results does the matching
    search_help_text = (
        "Exact recurring payment id, account id or account owner's username; several separated by spaces."
    )
    actions = ["pause_selected", "resume_selected"]
    inlines = [OccurrenceInline, RecurringEventInline]
    fieldsets = (
        ("Recurring payment", {"fields": ("id", "payer", "from_account", "to_detail_col", "amount")}),
        ("Rule", {"fields": ("start_at", "rule_col", "end_at", "count", "last_at")}),
        ("State", {"fields": ("status_col", "next_occurrence_at", "last_occurrence_at", "version", "occurrences_col")}),
        ("Record", {"fields": ("created_at", "updated_at")}),
    )

    next_occurrence_at_col = display_column("next_occurrence_at", utc_text, "next occurrence (UTC)")
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

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        allowed = obj is not None and self.has_pause_permission(request, obj)
        context["can_pause"] = allowed and obj.status == RecurringStatus.ACTIVE
        context["can_resume"] = allowed and obj.status == RecurringStatus.PAUSED
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
