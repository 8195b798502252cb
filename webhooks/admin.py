"""The webhooks console: endpoints (never their secrets), the outbox of events, and the
deliveries with their attempts.

Everything is read-only. The one act is "Resend" on deliveries (a bulk action and the
delivery page's button), through a confirmation page with a reason (common/admin_tools.py,
ConfirmedActAdminMixin); it calls ``delivery_resend``, the service the API's resend uses,
and records the reason with the staff member's user in the admin's history.
"""

import json
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.db.models import Q
from django.urls import reverse
from django.utils.html import format_html

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
    id_in_url,
    report,
)
from common.formats import human

from .models import Delivery, DeliveryAttempt, DeliveryStatus, Endpoint, Event
from .services import delivery_resend

# Who may resend a delivery (the support group has it): Delivery.Meta's resend_delivery.
RESEND_PERMISSION = "resend"

# More search terms than this are ignored (each is an exact id).
MAX_SEARCH_TERMS = 50

DELIVERY_TONES = {DeliveryStatus.PENDING: "amber", DeliveryStatus.SUCCEEDED: "green", DeliveryStatus.FAILED: "red"}


def delivery_status_badge(status: str):
    return badge(status, DELIVERY_TONES.get(status, "grey"))


def admin_link(obj, text=None):
    url = reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[id_in_url(obj.pk)])
    return format_html('<a href="{}">{}</a>', url, text if text is not None else obj.pk)


def subject_link(event: Event):
    """The payment or recurring payment an event is about, linked to its admin page."""
    if event.payment_id:
        url = reverse("admin:payments_scheduledpayment_change", args=[id_in_url(event.payment_id)])
        return format_html('<a href="{}">{}</a>', url, event.payment_id)
    url = reverse("admin:payments_recurringpayment_change", args=[id_in_url(event.recurring_id)])
    return format_html('<a href="{}">{}</a>', url, event.recurring_id)


@admin.register(Endpoint)
class EndpointAdmin(ActionPermissionAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "owner", "url", "events_col", "enabled", "disabled_reason", "failing_since_col", "created_at")
    list_filter = ("enabled",)
    list_select_related = ("owner",)
    ordering = ("-created_at", "-id")
    search_fields = ("id",)
    search_help_text = "Exact endpoint id or owner's username; several separated by spaces."
    # Never the secrets: not even the previous one, whose grace may still run.
    fields = (
        "id",
        "owner",
        "url",
        "events",
        "description",
        "enabled",
        "disabled_reason",
        "failing_since",
        "previous_secret_expires_at",
        "version",
        "created_at",
        "updated_at",
        "deliveries_link",
    )
    readonly_fields = fields

    failing_since_col = display_column("failing_since", human, "failing since (UTC)")

    @admin.display(description="events")
    def events_col(self, obj):
        return ", ".join(obj.events)

    @admin.display(description="deliveries")
    def deliveries_link(self, obj):
        url = reverse("admin:webhooks_delivery_changelist") + "?" + urlencode({"endpoint__id__exact": obj.pk})
        return format_html('<a href="{}">its deliveries</a>', url)

    def get_search_results(self, request, queryset, search_term):
        terms = search_term.split()[:MAX_SEARCH_TERMS]
        if not terms:
            return queryset, False
        return queryset.filter(Q(pk__in=terms) | Q(owner__username__in=terms)), False


class WebhookAuditAdmin(ActionPermissionAdminMixin, LargeTableAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Append-only, large tables: newest first, no full count, searched by exact ids."""

    ordering = ("-id",)
    search_fields = ("id",)  # shows the box; get_search_results does the matching


def _event_pk(term: str) -> int | None:
    digits = term.removeprefix("evt_")
    return int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 18 else None


@admin.register(Event)
class EventAdmin(WebhookAuditAdmin):
    """The outbox: one row per change a webhook tells of, written by the database in the
    change's own transaction."""

    list_display = ("public_id", "created_at", "type", "subject_col", "owner", "version", "fanned_out_at")
    list_filter = ("type",)
    list_select_related = ("owner",)
    search_help_text = "Exact event id (evt_...), payment id or recurring payment id; several separated by spaces."
    fields = (
        "public_id",
        "type",
        "owner",
        "subject_col",
        "version",
        "created_at",
        "fanned_out_at",
        "snapshot_col",
    )
    readonly_fields = fields

    @admin.display(description="id", ordering="id")
    def public_id(self, obj):
        return obj.public_id

    @admin.display(description="about")
    def subject_col(self, obj):
        return subject_link(obj)

    @admin.display(description="snapshot")
    def snapshot_col(self, obj):
        if obj.snapshot is None:
            return "none: a terminal event; the payment's row, frozen since, is what its deliveries carry"
        return format_html("<pre>{}</pre>", json.dumps(obj.snapshot, indent=2, sort_keys=True))

    def get_search_results(self, request, queryset, search_term):
        terms = search_term.split()[:MAX_SEARCH_TERMS]
        if not terms:
            return queryset, False
        ids = [pk for pk in map(_event_pk, terms) if pk is not None]
        condition = Q(payment_id__in=terms) | Q(recurring_id__in=terms)
        return queryset.filter(condition | Q(pk__in=ids)), False


class DeliveryAttemptInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = DeliveryAttempt
    formset = LatestRowsInlineFormSet
    verbose_name_plural = "attempts (newest first, at most 50)"
    fields = ("attempt", "started_at", "latency_ms", "status_code", "response_body", "error")
    readonly_fields = fields
    ordering = ("-id",)
    extra = 0
    can_delete = False


RESEND = ConfirmedAct(
    name="resend",
    title="Resend",
    explanation="Each delivery goes out again within seconds, whatever its status, with a fresh retry ladder and "
    "the same webhook-id (receivers deduplicate on it). Its endpoint must be enabled for it to be sent. Your user "
    "and reason are recorded in the delivery's history.",
    permission="resend",
    form=ReasonForm,
)


@admin.register(Delivery)
class DeliveryAdmin(ConfirmedActAdminMixin, WebhookAuditAdmin):
    list_display = (
        "id",
        "created_at",
        "event_col",
        "type_col",
        "endpoint_col",
        "status_col",
        "attempts",
        "next_attempt_at",
        "last_status_code",
        "short_error",
    )
    list_filter = ("status",)
    list_select_related = ("event", "endpoint__owner")
    search_help_text = "Exact delivery id, event id (evt_...) or endpoint id; several separated by spaces."
    fields = (
        "id",
        "event_col",
        "type_col",
        "endpoint_col",
        "status_col",
        "attempts",
        "next_attempt_at",
        "lease_until",
        "last_status_code",
        "last_error",
        "created_at",
        "updated_at",
    )
    readonly_fields = fields
    inlines = [DeliveryAttemptInline]
    actions = ["resend_selected"]

    status_col = display_column("status", delivery_status_badge, "status")

    @admin.display(description="event", ordering="event")
    def event_col(self, obj):
        return admin_link(obj.event, obj.event.public_id)

    @admin.display(description="type")
    def type_col(self, obj):
        return obj.event.type

    @admin.display(description="endpoint")
    def endpoint_col(self, obj):
        return admin_link(obj.endpoint, f"{obj.endpoint.owner.get_username()}: {obj.endpoint.url[:60]}")

    @admin.display(description="last error")
    def short_error(self, obj):
        return obj.last_error[:80]

    def get_search_results(self, request, queryset, search_term):
        terms = search_term.split()[:MAX_SEARCH_TERMS]
        if not terms:
            return queryset, False
        ids = [int(t) for t in terms if t.isascii() and t.isdigit() and len(t) <= 18]
        events = [_event_pk(t) for t in terms if t.startswith("evt_") and _event_pk(t) is not None]
        condition = Q(pk__in=ids) | Q(event_id__in=events)
        return queryset.filter(condition | Q(endpoint_id__in=terms)), False

    # --- resend: a confirmation page, then the service on each -------------------------------

    confirmed_acts = (RESEND,)
    resend_selected = confirmed_action(RESEND, "Resend selected deliveries (asks for a reason)")

    def has_resend_permission(self, request, obj=None) -> bool:
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.{RESEND_PERMISSION}_{opts.model_name}")

    def confirmation_rows(self, request, act, object_ids):
        ids = [int(pk) for pk in object_ids if str(pk).isdigit()]
        deliveries = {
            str(d.pk): d for d in Delivery.objects.filter(pk__in=ids).select_related("event", "endpoint__owner")
        }
        headers = ["delivery", "event", "type", "endpoint", "status", "tries", "last status", "last error"]
        rows = []
        for pk in sorted(object_ids, key=lambda pk: (pk not in deliveries, pk)):
            d = deliveries.get(pk)
            if d is None:
                rows.append(ConfirmRow([pk, *["-"] * 7], left_alone="no such delivery"))
                continue
            rows.append(
                ConfirmRow(
                    [
                        admin_link(d),
                        d.event.public_id,
                        d.event.type,
                        self.endpoint_col(d),
                        delivery_status_badge(d.status),
                        d.attempts,
                        d.last_status_code or "-",
                        d.last_error[:80] or "-",
                    ]
                )
            )
        return headers, rows

    def perform_act(self, request, act, object_ids, form) -> bool:
        reason = form.cleaned_data["reason"]
        done, missing = [], []
        ids = [int(pk) for pk in object_ids if str(pk).isdigit()]
        found = {d.pk: d for d in Delivery.objects.filter(pk__in=ids)}
        for pk in object_ids:
            delivery = found.get(int(pk)) if str(pk).isdigit() else None
            if delivery is None:
                missing.append(str(pk))
                continue
            delivery_resend(delivery_id=delivery.pk, actor=request.user)
            self.log_change(request, delivery, f"Resent from the admin: {reason}")
            done.append(str(pk))
        report(request, messages.SUCCESS, "Resent", done)
        report(request, messages.ERROR, "No such delivery", missing)
        return True
