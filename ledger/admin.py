"""The ledger console: accounts (read-only balance; freeze, unfreeze and deposit
through services) and the append-only transfers."""

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from common.admin_tools import (
    LargeTableAdminMixin,
    ReadOnlyAdminMixin,
    badge,
    display_column,
    has_model_permission,
    object_view_url,
    report,
    utc_text,
)

from .forms import DepositForm
from .models import ISSUANCE_ACCOUNT_ID, Account, Transfer
from .selectors import transfers_for_account
from .services import (
    AccountStateError,
    DepositRefused,
    account_deposit,
    account_deposit_check,
    account_set_status,
)

ACCOUNT_STATUS_TONES = {
    Account.Status.ACTIVE: "green",
    Account.Status.FROZEN: "amber",
    Account.Status.CLOSED: "grey",
}

MAX_ACCOUNTS_PER_ACTION = 500
MAX_SEARCH_TERMS = 50


def account_status_badge(status: str):
    return badge(status, ACCOUNT_STATUS_TONES.get(status, "grey"))


def account_url(account_id: str) -> str:
    return reverse("admin:ledger_account_change", args=[quote(account_id)])


def account_transfers_url(account_id: str) -> str:
    return reverse("admin:ledger_transfer_changelist") + f"?account={quote(account_id)}"


def account_id_link(account_id: str):
    return format_html('<a class="dp-mono" href="{}">{}</a>', account_url(account_id), account_id)


@admin.register(Account)
class AccountAdmin(LargeTableAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "name", "owner", "kind", "status_col", "balance", "created_at", "transfers_col")
    list_select_related = ("owner",)
    list_filter = ("kind", "status")
    ordering = ("-id",)  # ids are time-ordered (ULIDs): newest first, by the primary key
    search_fields = ("id",)  # shows the box; get_search_results does the matching
    search_help_text = "Exact account id or owner's username; several separated by spaces."
    actions = ["freeze_selected", "unfreeze_selected"]
    fields = ("id", "owner", "name", "kind", "status_col", "balance", "transfers_col", "created_at", "updated_at")
    readonly_fields = fields

    status_col = display_column("status", account_status_badge, "status")

    @admin.display(description="transfers")
    def transfers_col(self, obj):
        return format_html('<a href="{}">transfers</a>', account_transfers_url(obj.pk))

    def get_search_results(self, request, queryset, search_term):
        terms = search_term.split()[:MAX_SEARCH_TERMS]
        if not terms:
            return queryset, False
        return queryset.filter(pk__in=terms) | queryset.filter(owner__username__in=terms), False

    # --- freeze / unfreeze ----------------------------------------------------------

    def has_freeze_permission(self, request, obj=None) -> bool:
        return has_model_permission(self, request, "freeze")

    @admin.action(
        description="Freeze selected accounts (their payments fail as account_frozen)", permissions=["freeze"]
    )
    def freeze_selected(self, request, queryset):
        self.set_status_and_report(request, queryset, Account.Status.FROZEN)

    @admin.action(description="Unfreeze selected accounts", permissions=["freeze"])
    def unfreeze_selected(self, request, queryset):
        self.set_status_and_report(request, queryset, Account.Status.ACTIVE)

    def set_status_and_report(self, request, queryset, status: str) -> None:
        rows = list(queryset.order_by("id").values_list("id", "kind", "status")[: MAX_ACCOUNTS_PER_ACTION + 1])
        if len(rows) > MAX_ACCOUNTS_PER_ACTION:
            self.message_user(
                request, f"Select at most {MAX_ACCOUNTS_PER_ACTION} accounts; nothing changed.", messages.ERROR
            )
            return
        changed, unchanged, refused = [], [], []
        for account_id, kind, before in rows:
            if kind != Account.Kind.USER:
                refused.append(f"{account_id} is a system account")
                continue
            try:
                account = account_set_status(account_id=account_id, status=status)
            except AccountStateError as exc:
                refused.append(f"{account_id}: {exc}")
                continue
            if before == status:
                unchanged.append(account_id)
            else:
                changed.append(account_id)
                self.log_change(request, account, f"Status {before} -> {status} from the admin.")
        verb = "Frozen" if status == Account.Status.FROZEN else "Unfrozen"
        report(request, messages.SUCCESS, verb, changed)
        report(request, messages.INFO, f"Already {status}", unchanged)
        report(request, messages.ERROR, "Refused", refused)
        if changed and status == Account.Status.FROZEN:
            self.message_user(
                request,
                "Scheduled payments from a frozen account fail when due (failure_reason account_frozen);"
                " nothing moves. The account still receives.",
                messages.WARNING,
            )

    # --- deposit --------------------------------------------------------------------

    def has_deposit_permission(self, request, obj=None) -> bool:
        return has_model_permission(self, request, "deposit")

    def get_urls(self):
        return [object_view_url(self, "deposit", self.deposit_view), *super().get_urls()]

    def deposit_view(self, request, object_id):
        """Form, then ``account_deposit`` with the key the form carries, then back to the account."""
        if not self.has_deposit_permission(request):
            raise PermissionDenied
        account = self.get_object(request, unquote(object_id))
        if account is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        back = HttpResponseRedirect(account_url(account.pk))
        try:
            account_deposit_check(account=account)
        except DepositRefused as exc:
            self.message_user(request, exc.detail, messages.ERROR)
            return back
        form = DepositForm(request.POST if request.method == "POST" else None, account_id=account.pk)
        if form.is_valid():
            amount, key = form.cleaned_data["amount"], form.cleaned_data["token"]
            try:
                deposit = account_deposit(account_id=account.pk, amount=amount, key=key)
            except DepositRefused as exc:
                self.message_user(request, f"Deposit refused: {exc.reason}. Nothing moved.", messages.ERROR)
                return back
            if deposit.replayed:
                self.message_user(
                    request,
                    f"This deposit form was already submitted: {deposit.amount} was deposited into"
                    f" {deposit.account_id} at {deposit.posted_at.isoformat()} (ledger key {key})."
                    " Nothing more moved.",
                    messages.WARNING,
                )
            else:
                self.message_user(
                    request, f"Deposited {amount} into {account.pk} (ledger key {key}).", messages.SUCCESS
                )
                self.log_change(request, account, f"Deposit of {amount} (ledger key {key}).")
            return back
        context = {
            **self.admin_site.each_context(request),
            "title": f"Deposit into {account.pk}",
            "subtitle": None,
            "opts": self.opts,
            "original": account,
            "form": form,
            "issuance_account_id": ISSUANCE_ACCOUNT_ID,
            "has_view_permission": self.has_view_permission(request, account),
        }
        return TemplateResponse(request, "admin/ledger/account/deposit.html", context)

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        context["can_deposit"] = (
            obj is not None and obj.kind == Account.Kind.USER and self.has_deposit_permission(request, obj)
        )
        context["transfers_url"] = account_transfers_url(obj.pk) if obj is not None else ""
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)


class TransferAccountFilter(admin.SimpleListFilter):
    """Transfers that debit or credit one account (``?account=<id>``, as linked from an
    account). Listing every account here would not scale; the issuance account (every
    deposit) is always offered."""

    title = "account"
    parameter_name = "account"

    def lookups(self, request, model_admin):
        choices = [(ISSUANCE_ACCOUNT_ID, "issuance (deposits)")]
        value = self.value()
        if value and value != ISSUANCE_ACCOUNT_ID:
            choices.append((value, value))
        return choices

    def queryset(self, request, queryset):
        if self.value():
            return queryset & transfers_for_account(account_id=self.value())
        return queryset


@admin.register(Transfer)
class TransferAdmin(LargeTableAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "key", "debit_col", "credit_col", "amount", "created_at_col")
    list_filter = (TransferAccountFilter, "created_at")
    ordering = ("-id",)
    search_fields = ("key",)  # shows the box; get_search_results does the matching
    search_help_text = "Exact transfer key (a payment's id for a payment) or account id; several separated by spaces."
    fields = ("id", "key", "debit_col", "credit_col", "amount", "created_at")
    readonly_fields = fields

    debit_col = display_column("debit_account_id", account_id_link, "debit", ordering="debit_account")
    credit_col = display_column("credit_account_id", account_id_link, "credit", ordering="credit_account")
    created_at_col = display_column("created_at", utc_text, "created at (UTC)")

    def get_search_results(self, request, queryset, search_term):
        terms = search_term.split()[:MAX_SEARCH_TERMS]
        if not terms:
            return queryset, False
        matching = (
            queryset.filter(key__in=terms)
            | queryset.filter(debit_account_id__in=terms)
            | queryset.filter(credit_account_id__in=terms)
        )
        return matching, False
