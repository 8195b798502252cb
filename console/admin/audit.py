"""The append-only audit tables (payment events, execution attempts, recurring events) and
the archived partitions, read-only."""

from django.contrib import admin

from common.admin_tools import (
    ActionPermissionAdminMixin,
    LargeTableAdminMixin,
    ReadOnlyAdminMixin,
    display_column,
)
from common.formats import human
from payments.models import (
    ArchivedPartition,
    ExecutionAttempt,
    PaymentEvent,
    RecurringEvent,
)

from . import display
from .display import actor_text, payment_link, with_actor_username


class PaymentAuditAdmin(ActionPermissionAdminMixin, LargeTableAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """The append-only tables beside a payment, newest first, searched by payment id."""

    ordering = ("-id",)
    search_fields = ("payment__id",)  # shows the box; get_search_results does the matching
    search_help_text = "Exact payment id; several separated by spaces."
    search_by = "payment_id"
    names_actors = False  # the table has an actor column ("user:<id>" shown as the username)
    payment_col = display_column("payment_id", payment_link, "payment", ordering="payment")

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        return with_actor_username(queryset) if self.names_actors else queryset

    @admin.display(description="actor", ordering="actor")
    def actor_col(self, obj):
        return actor_text(obj)

    def get_search_results(self, request, queryset, search_term):
        terms = search_term.split()[: display.MAX_SEARCH_TERMS]
        return (queryset.filter(**{f"{self.search_by}__in": terms}) if terms else queryset), False


@admin.register(PaymentEvent)
class PaymentEventAdmin(PaymentAuditAdmin):
    """The audit trail on its own: who cancelled what, and when."""

    list_display = ("id", "created_at", "payment_col", "kind", "from_status", "to_status", "attempt", "actor_col")
    list_filter = ("kind",)
    names_actors = True


@admin.register(ExecutionAttempt)
class ExecutionAttemptAdmin(PaymentAuditAdmin):
    list_display = ("id", "payment_col", "attempt", "outcome", "started_at", "finished_at", "worker")
    list_filter = ("outcome",)


@admin.register(RecurringEvent)
class RecurringEventAdmin(PaymentAuditAdmin):
    """A recurring payment's audit trail on its own, including the skipped occurrences."""

    list_display = ("id", "created_at", "recurring", "kind", "actor_col")
    list_filter = ("kind",)
    names_actors = True
    search_fields = ("recurring__id",)
    search_help_text = "Exact recurring payment id; several separated by spaces."
    search_by = "recurring_id"


@admin.register(ArchivedPartition)
class ArchivedPartitionAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The months of the schedule that left the database (payments/partitions.py): where
    their files are, what they held, and the totals reconciliation checks the ledger
    against. A payment id in one of these ranges answers 410 payment_archived."""

    list_display = ("month", "payments_col", "executed_count_col", "executed_amount_col", "location", "archived_at")
    fields = ("month", "id_low", "id_high", "payments_col", "executed_count_col", "executed_amount_col", "location",
              "manifest", "archived_at")
    readonly_fields = ("payments_col", "executed_count_col", "executed_amount_col")

    payments_col = display_column("payments", human, "payments")
    executed_count_col = display_column("executed_count", human, "executed count")
    executed_amount_col = display_column("executed_amount", human, "executed amount")
