"""Recurring payments: their occurrences and events inline; pause, resume and end, each
through a confirmation page with a reason."""

from django.contrib import admin, messages
from django.db.models import Count, Max
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from common.admin_tools import (
    ActionPermissionAdminMixin,
    ConfirmedAct,
    ConfirmedActAdminMixin,
    ConfirmRow,
    LargeTableAdminMixin,
    LatestRowsInlineFormSet,
    ReadOnlyAdminMixin,
    confirmed_action,
    display_column,
    has_model_permission,
    report,
)
from common.formats import human
from payments.exceptions import (
    RecurringNotFound,
    RecurringStateError,
)
from payments.models import (
    PaymentStatus,
    RecurringEvent,
    RecurringPayment,
    RecurringStatus,
    ScheduledPayment,
)
from payments.selectors import (
    recurring_search_condition,
)
from recurring.services import recurring_end, recurring_pause, recurring_resume

from .display import (
    actor_text,
    admin_link,
    data_text,
    failure_reason_text,
    payment_link,
    status_badge,
    with_actor_username,
)
from .payments import PayerToPayeeAdminMixin

# One request pauses, resumes or ends at most this many recurring payments.
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
    fields = ("payment_col", "occurrence_at", "execute_at", "amount_col", "status_col", "failure_reason_col")
    readonly_fields = fields
    ordering = ("-occurrence_at", "-id")
    extra = 0
    can_delete = False
    payment_col = display_column("id", payment_link, "payment")
    status_col = display_column("status", status_badge, "status")
    amount_col = display_column("amount", human, "amount")
    failure_reason_col = display_column("failure_reason", failure_reason_text, "failure reason")


class RecurringEventInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = RecurringEvent
    formset = LatestRowsInlineFormSet
    verbose_name_plural = f"event history (the latest {LatestRowsInlineFormSet.max_rows}, newest first)"
    fields = ("created_at", "kind", "actor_col", "data_col")
    readonly_fields = fields
    ordering = ("-id",)
    extra = 0
    can_delete = False

    def get_queryset(self, request):
        return with_actor_username(super().get_queryset(request))

    @admin.display(description="actor")
    def actor_col(self, obj):
        return actor_text(obj)

    @admin.display(description="data")
    def data_col(self, obj):
        return data_text(obj.data) if obj.data else "-"


def rule_text(obj) -> str:
    """"every 1 minute" (an ISO 8601 interval, PT1M) or "cron 0 9 * * 1", and its time zone."""
    rule = human(obj.interval, "every") if obj.interval else f"cron {obj.cron}"
    return rule if obj.timezone == "UTC" else f"{rule} ({obj.timezone})"


# Pause, resume and end: each through a confirmation page asking for a reason, recorded on
# the series' event (paused, resumed, ended) and in the admin's history. ``extra``: the
# status each leads to and the word its report uses.
PAUSE_SERIES = ConfirmedAct(
    name="pause",
    title="Pause",
    explanation="No further occurrence is generated until the series is resumed, and its scheduled occurrence "
    "that has not started is cancelled (a resume before it falls due generates it again). The same as the "
    "API's pause.",
    permission="pause",
    extra={"target": RecurringStatus.PAUSED, "done": "Paused"},
    button="Pause {count}",
)
RESUME_SERIES = ConfirmedAct(
    name="resume",
    title="Resume",
    explanation="The series is active again from now: its next occurrence is the first one after now; the "
    "occurrences missed while it was paused are skipped (listed on the resumed event), not paid in a burst. "
    "The same as the API's resume.",
    permission="pause",
    extra={"target": RecurringStatus.ACTIVE, "done": "Resumed"},
    button="Resume {count}",
)
END_SERIES = ConfirmedAct(
    name="end",
    title="End the series",
    explanation="No further occurrence is generated, for good (an ended series cannot be resumed), and its "
    "scheduled occurrence that has not started is cancelled. Payments of the series that already executed or "
    "failed are left as they are. The same as the API's DELETE of a recurring payment.",
    permission="pause",
    extra={"target": RecurringStatus.ENDED, "done": "Ended"},
    button="End {count}",
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
    confirmed_acts = (PAUSE_SERIES, RESUME_SERIES, END_SERIES)
    max_rows_per_act = MAX_RECURRING_PER_ACTION
    pause_selected = confirmed_action(
        PAUSE_SERIES,
        "Pause selected recurring payments (their scheduled occurrence is cancelled; asks for a reason)",
    )
    resume_selected = confirmed_action(
        RESUME_SERIES,
        "Resume selected recurring payments (from now; missed occurrences are skipped; asks for a reason)",
    )
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
        "next_occurrence_at", human, "occurrence after it (UTC; generated when the next payment falls due)"
    )

    @admin.display(description="next payment due (UTC)", ordering="next_occurrence_at")
    def next_due_col(self, obj):
        """When this series next pays: its scheduled occurrence while that one waits
        (``last_occurrence_at`` ahead of now), else the next one to be generated. Nothing
        while paused or ended."""
        if obj.status != RecurringStatus.ACTIVE:
            return "-"
        if obj.last_occurrence_at is not None and obj.last_occurrence_at > timezone.now():
            return human(obj.last_occurrence_at)
        return human(obj.next_occurrence_at) if obj.next_occurrence_at else "-"
    created_at_col = display_column("created_at", human, "created (UTC)")

    @admin.display(description="rule")
    def rule_col(self, obj):
        return rule_text(obj)

    @admin.display(description="all occurrences")
    def occurrences_col(self, obj):
        url = reverse("admin:payments_scheduledpayment_changelist")
        return format_html('<a href="{}?q={}">every payment of this series</a>', url, obj.pk)

    search_condition = staticmethod(recurring_search_condition)

    # --- pause, resume and end: a confirmation page with a reason, then the service ----------

    def has_pause_permission(self, request, obj=None) -> bool:
        return has_model_permission(self, request, "pause")

    def confirmation_rows(self, request, act: ConfirmedAct, object_ids: list[str]):
        found = {r.pk: r for r in RecurringPayment.objects.filter(pk__in=object_ids)}
        if act.name == "resume":
            last_header = "paused since (UTC)"
            paused_at = dict(
                RecurringEvent.objects.filter(recurring_id__in=object_ids, kind=RecurringEvent.Kind.PAUSED)
                .values("recurring_id").annotate(at=Max("created_at")).values_list("recurring_id", "at")
            )
            last = {pk: human(at) for pk, at in paused_at.items()}
        else:
            last_header = "scheduled occurrence to cancel"
            last = dict(
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
                [admin_link(rec), rule_text(rec), status_badge(rec.status), human(rec.amount),
                 last.get(rec.pk, "-" if act.name == "resume" else 0)],
                left_alone=self.left_alone(act, rec, pending=last.get(rec.pk, 0) if act.name == "end" else 0),
            ))
        return ["recurring payment", "rule", "status", "amount", last_header], rows

    @staticmethod
    def left_alone(act: ConfirmedAct, rec: RecurringPayment, *, pending: int) -> str:
        """Why ``act`` will not change ``rec`` (empty: it will), as its service decides."""
        if act.name == "end":
            return "already ENDED" if rec.status == RecurringStatus.ENDED and not pending else ""
        target = act.extra["target"]
        if rec.status == target:
            return f"already {target}"
        if rec.status == RecurringStatus.ENDED:
            return f"ENDED: cannot be {act.extra['done'].lower()}"
        return ""

    def perform_act(self, request, act: ConfirmedAct, object_ids: list[str], form) -> bool:
        """Run the act's service on each id with the reason (recorded on the series'
        event) and say what happened to each."""
        reason = form.cleaned_data["reason"]
        target, done = act.extra["target"], act.extra["done"]
        service = {"pause": recurring_pause, "resume": recurring_resume, "end": recurring_end}[act.name]
        before = dict(RecurringPayment.objects.filter(pk__in=object_ids).values_list("pk", "status"))
        changed, already, refused, missing = [], [], [], []
        for recurring_id in object_ids:
            try:
                rec = service(recurring_id=recurring_id, actor=request.user, reason=reason)
            except RecurringStateError as exc:
                refused.append(f"{recurring_id} is {exc.status}")
                continue
            except RecurringNotFound:
                missing.append(recurring_id)
                continue
            if before.get(recurring_id) == target:
                already.append(recurring_id)
            else:
                changed.append(recurring_id)
                self.log_change(request, rec, f"{done} from the admin: {reason}")
        report(request, messages.SUCCESS, done, changed)
        report(request, messages.INFO, f"Already {target}", already)
        report(request, messages.WARNING, "Refused", refused)
        report(request, messages.ERROR, "No such recurring payment", missing)
        return True

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        allowed = obj is not None and self.has_pause_permission(request, obj)
        context["can_pause"] = allowed and obj.status == RecurringStatus.ACTIVE
        context["can_resume"] = allowed and obj.status == RecurringStatus.PAUSED
        context["can_end"] = allowed and obj.status != RecurringStatus.ENDED
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)
