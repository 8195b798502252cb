"""The ledger console: accounts (read-only balance; freeze, unfreeze and deposit through
services, each with a reason), deposit requests (approved or rejected by a second staff
member), the append-only staff actions and transfers, and the two-phase transfers that
reserve a payout's funds (read-only: only the payout's outcome posts or voids one).

Cross-links: an account's page links to its payments, transfers and staff history; a
user's page (Django's user admin, re-registered here) to their accounts and payments.
Amounts, times and users are shown through common.formats.human (1,234,567)."""

from dataclasses import dataclass
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from common.admin_tools import (
    ActionPermissionAdminMixin,
    ConfirmedAct,
    ConfirmedActAdminMixin,
    ConfirmRow,
    GivenValueFilter,
    LargeTableAdminMixin,
    LatestRowsInlineFormSet,
    ReadOnlyAdminMixin,
    badge,
    confirmed_action,
    display_column,
    has_model_permission,
    id_in_url,
    object_view_url,
    report,
)
from common.authz import ConflictOfInterest, MissingPermission
from common.formats import human

from .forms import DepositForm
from .models import ISSUANCE_ACCOUNT_ID, Account, DepositRequest, PendingTransfer, StaffAction, Transfer
from .selectors import account_search_condition, search_phrase, transfers_for_account
from .services import (
    PENDING_PREFIX,
    POST_PREFIX,
    VOID_PREFIX,
    AccountStateError,
    DepositFormInvalid,
    DepositRefused,
    DepositRequestNotFound,
    DepositRequestNotPending,
    SelfApprovalForbidden,
    UnknownAccount,
    account_deposit_check,
    account_freeze,
    deposit_form_open,
    deposit_form_result,
    deposit_form_submit,
    deposit_form_token,
    deposit_request_approve,
    deposit_request_reject,
)

ACCOUNT_STATUS_TONES = {
    Account.Status.ACTIVE: "green",
    Account.Status.FROZEN: "amber",
    Account.Status.CLOSED: "grey",
}
PENDING_STATE_TONES = {
    PendingTransfer.State.PENDING: "purple",
    PendingTransfer.State.POSTED: "green",
    PendingTransfer.State.VOIDED: "grey",
}
REQUEST_STATUS_TONES = {
    DepositRequest.Status.PENDING: "purple",
    DepositRequest.Status.APPROVED: "green",
    DepositRequest.Status.REJECTED: "grey",
}

MAX_SEARCH_TERMS = 50

# The deposit form page's query parameter: the token of the opened form.
DEPOSIT_FORM_PARAM = "form"


def account_status_badge(status: str):
    return badge(status, ACCOUNT_STATUS_TONES.get(status, "grey"))


def request_status_badge(status: str):
    return badge(status, REQUEST_STATUS_TONES.get(status, "grey"))


def account_url(account_id: str) -> str:
    return reverse("admin:ledger_account_change", args=[id_in_url(account_id)])


def account_transfers_url(account_id: str) -> str:
    return reverse("admin:ledger_transfer_changelist") + "?" + urlencode({"account": account_id})


def account_payments_url(account_id: str) -> str:
    """The payments out of or into the account (the payment list's account filter: both
    directions when none is given; served by the from_account and to_account indexes)."""
    return reverse("admin:payments_scheduledpayment_changelist") + "?" + urlencode({"account": account_id})


def account_staff_actions_url(account_id: str) -> str:
    return reverse("admin:ledger_staffaction_changelist") + "?" + urlencode({"account": account_id})


def user_accounts_url(user_id) -> str:
    return reverse("admin:ledger_account_changelist") + "?" + urlencode({"owner__id__exact": user_id})


def user_payments_url(user_id) -> str:
    """The payments the user created, as their payer (the payment list's payer filter)."""
    return reverse("admin:payments_scheduledpayment_changelist") + "?" + urlencode({"payer": user_id})


def pending_requests_url(account_id: str) -> str:
    query = urlencode({"account__exact": account_id, "status__exact": DepositRequest.Status.PENDING})
    return reverse("admin:ledger_depositrequest_changelist") + "?" + query


def deposit_request_url(request_id: str) -> str:
    return reverse("admin:ledger_depositrequest_change", args=[id_in_url(request_id)])


def account_id_link(account_id: str):
    return format_html('<a class="dp-mono" href="{}">{}</a>', account_url(account_id), account_id)


def account_named_cell(account):
    """An account's id, linked, with its name and its owner after it: "acc_01… Savings · alice"
    (a system account has no owner). The account and its owner come with the row."""
    owner = format_html(' <span class="dp-quiet">· {}</span>', account.owner.get_username()) if account.owner_id else ""
    return format_html("{} {}{}", account_id_link(account.pk), account.name, owner)


def deposit_request_link(request_id: str):
    return format_html('<a class="dp-mono" href="{}">{}</a>', deposit_request_url(request_id), request_id)


def username(user) -> str:
    return user.get_username() if user is not None else "-"


@dataclass(frozen=True, kw_only=True)
class FreezeAct(ConfirmedAct):
    frozen: bool
    done: str
    target: str  # the status it sets


FREEZE_ACTS = (
    FreezeAct(
        name="freeze",
        title="Freeze",
        explanation="A frozen account may receive but not send: its scheduled payments fail when due with "
        "failure_reason account_frozen and nothing moves. System and closed accounts are refused.",
        permission="freeze",
        frozen=True,
        done="Frozen",
        target=Account.Status.FROZEN,
    ),
    FreezeAct(
        name="unfreeze",
        title="Unfreeze",
        explanation="The account sends again: its payments due from now on execute as usual (those that already "
        "failed as account_frozen stay failed).",
        permission="freeze",
        frozen=False,
        done="Unfrozen",
        target=Account.Status.ACTIVE,
    ),
)


class StaffActionInline(ReadOnlyAdminMixin, admin.TabularInline):
    """The account's staff history: who deposited, requested, approved, froze or cancelled, and why."""

    model = StaffAction
    fk_name = "account"
    formset = LatestRowsInlineFormSet
    verbose_name = "staff action"
    verbose_name_plural = f"staff actions (the latest {LatestRowsInlineFormSet.max_rows}, newest first)"
    fields = (
        "created_at", "action", "actor", "amount_col", "reason", "payment_id", "deposit_request", "transfer_key"
    )
    readonly_fields = fields
    amount_col = display_column("amount", human, "amount")
    ordering = ("-id",)
    extra = 0
    can_delete = False

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("actor")


@admin.register(Account)
class AccountAdmin(
    ActionPermissionAdminMixin, ConfirmedActAdminMixin, LargeTableAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin
):
    list_display = ("id", "name", "owner", "kind", "status_col", "balance_col", "created_at", "transfers_col")
    list_select_related = ("owner",)
    list_filter = ("kind", "status")
    ordering = ("-id",)  # ids are time-ordered (ULIDs): newest first, by the primary key
    search_fields = ("id",)  # shows the box; get_search_results does the matching
    search_help_text = (
        "An account's name, or words in it as one phrase (holiday fund finds \"Holiday fund 2026\"); or exact "
        "account ids or owners' usernames, several separated by spaces."
    )
    actions = ["freeze_selected", "unfreeze_selected"]
    # Its payments, transfers and staff acts: the page's buttons (change_form.html).
    fields = ("id", "owner", "name", "kind", "status_col", "balance_col", "created_at", "updated_at")
    readonly_fields = fields
    inlines = [StaffActionInline]

    status_col = display_column("status", account_status_badge, "status")
    balance_col = display_column("balance", human, "balance")

    @admin.display(description="transfers")
    def transfers_col(self, obj):
        return format_html('<a href="{}">transfers</a>', account_transfers_url(obj.pk))

    def get_search_results(self, request, queryset, search_term):
        phrase = search_phrase(search_term)
        terms = phrase.split()[:MAX_SEARCH_TERMS]
        if not terms:
            return queryset, False
        return queryset.filter(account_search_condition(terms=terms, phrase=phrase)), False

    # --- freeze / unfreeze: a confirmation page with a reason, then account_freeze -------

    confirmed_acts = FREEZE_ACTS
    freeze_selected = confirmed_action(
        FREEZE_ACTS[0], "Freeze selected accounts (their payments fail as account_frozen; asks for a reason)"
    )
    unfreeze_selected = confirmed_action(FREEZE_ACTS[1], "Unfreeze selected accounts (asks for a reason)")

    def has_freeze_permission(self, request, obj=None) -> bool:
        return has_model_permission(self, request, "freeze")

    def confirmation_rows(self, request, act: FreezeAct, object_ids: list[str]):
        accounts = {a.pk: a for a in Account.objects.filter(pk__in=object_ids).select_related("owner")}
        rows = []
        for account_id in sorted(object_ids, key=lambda pk: (pk not in accounts, pk)):
            account = accounts.get(account_id)
            if account is None:
                rows.append(ConfirmRow([account_id, "-", "-", "-", "-"], left_alone="no such account"))
                continue
            if account.kind != Account.Kind.USER:
                left_alone = "a system account"
            elif account.status == Account.Status.CLOSED:
                left_alone = "closed"
            elif account.owner_id == request.user.pk:
                left_alone = "your own account"
            elif account.status == act.target:
                left_alone = f"already {act.target}"
            else:
                left_alone = ""
            rows.append(ConfirmRow(
                [account_id_link(account.pk), username(account.owner), account.kind,
                 account_status_badge(account.status), human(account.balance)],
                left_alone=left_alone,
            ))
        return ["account", "owner", "kind", "status", "balance"], rows

    def perform_act(self, request, act: FreezeAct, object_ids: list[str], form) -> bool:
        changed, unchanged, refused = [], [], []
        reason = form.cleaned_data["reason"]
        for account_id in object_ids:
            try:
                outcome = account_freeze(account_id=account_id, frozen=act.frozen, actor=request.user, reason=reason)
            except AccountStateError as exc:
                refused.append(f"{account_id}: {exc}")
                continue
            except ConflictOfInterest:
                refused.append(f"{account_id}: your own account (another staff member must do it)")
                continue
            except UnknownAccount:
                refused.append(f"{account_id}: no such account")
                continue
            if outcome.changed_now:
                changed.append(account_id)
                self.log_change(request, outcome.account, f"{act.done} from the admin: {reason}")
            else:
                unchanged.append(account_id)
        report(request, messages.SUCCESS, act.done, changed)
        report(request, messages.INFO, f"Already {act.target}", unchanged)
        report(request, messages.ERROR, "Refused", refused)
        if changed and act.frozen:
            self.message_user(
                request,
                "Scheduled payments from a frozen account fail when due (failure_reason account_frozen);"
                " nothing moves. The account still receives.",
                messages.WARNING,
            )
        return True

    # --- deposit: one opened form, one deposit (or one request above the threshold) ---------

    def has_deposit_permission(self, request, obj=None) -> bool:
        return has_model_permission(self, request, "deposit")

    def get_urls(self):
        return [object_view_url(self, "deposit", self.deposit_view), *super().get_urls()]

    def deposit_view(self, request, object_id):
        """The deposit form. Opening it (no ``?form=``) issues a one-time token and
        redirects to the page that carries it; submitting consumes the token in the
        deposit's transaction. Back or a reload returns to that same page, which then
        says the form was submitted instead of offering it again."""
        if not self.has_deposit_permission(request):
            raise MissingPermission("ledger.deposit_account")
        account = self.get_object(request, unquote(object_id))
        if account is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        back = HttpResponseRedirect(account_url(account.pk))
        try:
            account_deposit_check(account=account)
        except DepositRefused as exc:
            self.message_user(request, exc.detail, messages.ERROR)
            return back
        form_url = reverse("admin:ledger_account_deposit", args=[id_in_url(account.pk)])
        token = request.GET.get(DEPOSIT_FORM_PARAM, "")
        try:
            row = deposit_form_token(token=token, account_id=account.pk, actor=request.user) if token else None
        except DepositFormInvalid as exc:
            self.message_user(request, str(exc), messages.ERROR)
            row = None
            if request.method == "POST":
                return HttpResponseRedirect(form_url)
        if row is None:  # open a new form
            token = deposit_form_open(account_id=account.pk, actor=request.user)
            return HttpResponseRedirect(f"{form_url}?{DEPOSIT_FORM_PARAM}={token}")

        if row.consumed_at is not None and request.method == "POST":  # Back and submit again
            self.deposit_already_submitted(request, deposit_form_result(token=row))
            return back
        form = None
        if row.consumed_at is None:
            form = DepositForm(request.POST if request.method == "POST" else None)
            if form.is_valid():
                self.deposit_submit(request, account, token, form)
                return back
        context = {
            **self.admin_site.each_context(request),
            "title": f"Deposit into {account.pk}",
            "subtitle": None,
            "opts": self.opts,
            "original": account,
            "form": form,
            "submitted": None if form is not None else self.deposit_text(deposit_form_result(token=row)),
            "new_form_url": form_url,
            "threshold": settings.DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD,
            "issuance_account_id": ISSUANCE_ACCOUNT_ID,
            "has_view_permission": self.has_view_permission(request, account),
        }
        return TemplateResponse(request, "admin/ledger/account/deposit.html", context)

    @staticmethod
    def deposit_text(submission) -> str:
        if submission.request is not None:
            req = submission.request
            return (
                f"a deposit of {human(req.amount)} into {req.account_id} was requested as {req.id} (now {req.status});"
                " it moves money once another staff member approves it"
            )
        dep = submission.deposit
        return (f"{human(dep.amount)} was deposited into {dep.account_id} at {human(dep.posted_at)} "
                f"(ledger key {dep.key})")

    def deposit_already_submitted(self, request, submission) -> None:
        self.message_user(
            request,
            f"This deposit form was already submitted: {self.deposit_text(submission)}. Nothing more moved.",
            messages.WARNING,
        )

    def deposit_submit(self, request, account, token: str, form) -> None:
        """Run the submit and report it."""
        amount, reason = form.cleaned_data["amount"], form.cleaned_data["reason"]
        try:
            result = deposit_form_submit(
                token=token, account_id=account.pk, actor=request.user, amount=amount, reason=reason
            )
        except DepositRefused as exc:
            self.message_user(request, f"Deposit refused: {exc.reason}. Nothing moved.", messages.ERROR)
            return
        if result.already:
            self.deposit_already_submitted(request, result.submission)
            return
        if result.submission.request is not None:
            req = result.submission.request
            self.message_user(
                request,
                format_html(
                    "{} is above the approval threshold ({}): requested as {}. Another staff member with "
                    "ledger.approve_deposit must approve it; nothing moved yet.",
                    human(amount), human(settings.DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD), deposit_request_link(req.id),
                ),
                messages.SUCCESS,
            )
            self.log_change(request, account, f"Deposit of {amount} requested ({req.id}): {reason}")
            return
        self.message_user(
            request, f"Deposited {human(amount)} into {account.pk} (ledger key {token}).", messages.SUCCESS
        )
        self.log_change(request, account, f"Deposit of {amount} (ledger key {token}): {reason}")

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        is_user_account = obj is not None and obj.kind == Account.Kind.USER
        context["can_deposit"] = is_user_account and self.has_deposit_permission(request, obj)
        may_freeze = is_user_account and self.has_freeze_permission(request, obj)
        context["can_freeze"] = may_freeze and obj.status == Account.Status.ACTIVE
        context["can_unfreeze"] = may_freeze and obj.status == Account.Status.FROZEN
        context["transfers_url"] = account_transfers_url(obj.pk) if obj is not None else ""
        context["payments_url"] = account_payments_url(obj.pk) if obj is not None else ""
        context["staff_actions_url"] = account_staff_actions_url(obj.pk) if obj is not None else ""
        if obj is not None:
            context["pending_requests"] = DepositRequest.objects.filter(
                account=obj, status=DepositRequest.Status.PENDING
            ).count()
            context["pending_requests_url"] = pending_requests_url(obj.pk)
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)


# --- deposit requests: four eyes ---------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DecisionAct(ConfirmedAct):
    done: str
    already: str
    run: object  # deposit_request_approve or deposit_request_reject


DECISION_ACTS = (
    DecisionAct(
        name="approve",
        title="Approve",
        explanation="Each pending request's money moves now, from the issuance account into its account, once "
        "(its ledger key is the request's id). Requests you made yourself, and requests into an account you own, "
        "are refused: another staff member must decide them.",
        permission="approve",
        done="Approved",
        already="Already approved",
        run=deposit_request_approve,
    ),
    DecisionAct(
        name="reject",
        title="Reject",
        explanation="Each pending request ends rejected; nothing moves. Requests you made yourself are refused.",
        permission="approve",
        done="Rejected",
        already="Already rejected",
        run=deposit_request_reject,
    ),
)


@admin.register(DepositRequest)
class DepositRequestAdmin(
    ActionPermissionAdminMixin, ConfirmedActAdminMixin, LargeTableAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin
):
    list_display = (
        "id", "account_col", "amount_col", "status_col", "why", "requested_by", "beneficiary", "created_at_col",
        "decided_by", "decided_at_col",
    )
    list_select_related = ("requested_by", "decided_by", "beneficiary", "account__owner")
    list_filter = ("status", "why")
    ordering = ("-id",)  # ids are ULIDs: newest first
    search_fields = ("id",)  # shows the box; get_search_results does the matching
    search_help_text = "Exact request id or account id; several separated by spaces."
    actions = ["approve_selected", "reject_selected"]
    fields = (
        "id", "account_col", "amount_col", "reason", "status_col", "why", "requested_by", "beneficiary",
        "created_at", "decided_by", "decided_at", "decision_reason", "transfer_col",
    )
    readonly_fields = fields

    account_col = display_column("account", account_named_cell, "account", ordering="account")
    amount_col = display_column("amount", human, "amount")
    status_col = display_column("status", request_status_badge, "status")
    created_at_col = display_column("created_at", human, "requested (UTC)")
    decided_at_col = display_column("decided_at", human, "decided (UTC)")

    @admin.display(description="ledger transfer")
    def transfer_col(self, obj):
        transfer = Transfer.objects.filter(key=obj.pk).first()
        if transfer is None:
            return "none: no money moved for this request"
        url = reverse("admin:ledger_transfer_change", args=[transfer.pk])
        return format_html('<a href="{}">transfer #{}</a> at {}', url, transfer.pk, human(transfer.created_at))

    def get_search_results(self, request, queryset, search_term):
        terms = search_term.split()[:MAX_SEARCH_TERMS]
        if not terms:
            return queryset, False
        return queryset.filter(pk__in=terms) | queryset.filter(account_id__in=terms), False

    confirmed_acts = DECISION_ACTS
    act_permissions = {"approve": "ledger.approve_deposit"}  # the 403 page names it (common/admin_tools.py)
    approve_selected = confirmed_action(DECISION_ACTS[0], "Approve selected deposit requests (asks for a reason)")
    reject_selected = confirmed_action(DECISION_ACTS[1], "Reject selected deposit requests (asks for a reason)")

    def has_approve_permission(self, request, obj=None) -> bool:
        return request.user.has_perm("ledger.approve_deposit")

    def confirmation_rows(self, request, act: DecisionAct, object_ids: list[str]):
        requests = DepositRequest.objects.filter(pk__in=object_ids).select_related("requested_by", "account__owner")
        found = {r.pk: r for r in requests}
        rows = []
        for request_id in sorted(object_ids, key=lambda pk: (pk not in found, pk)):
            req = found.get(request_id)
            if req is None:
                rows.append(ConfirmRow([request_id, *["-"] * 5], left_alone="no such request"))
                continue
            if req.requested_by_id == request.user.pk:
                left_alone = "requested by you"
            elif act.name == "approve" and request.user.pk in (req.beneficiary_id, req.account.owner_id):
                left_alone = "into an account you own"
            elif req.status != DepositRequest.Status.PENDING:
                left_alone = f"already {req.status}"
            else:
                left_alone = ""
            rows.append(ConfirmRow(
                [deposit_request_link(req.pk), account_named_cell(req.account), human(req.amount),
                 username(req.requested_by), req.reason, request_status_badge(req.status)],
                left_alone=left_alone,
            ))
        return ["request", "account", "amount", "requested by", "reason", "status"], rows

    def perform_act(self, request, act: DecisionAct, object_ids: list[str], form) -> bool:
        done, already, refused, missing = [], [], [], []
        reason = form.cleaned_data["reason"]
        for request_id in object_ids:
            try:
                decision = act.run(request_id=request_id, actor=request.user, reason=reason)
            except SelfApprovalForbidden:
                refused.append(f"{request_id} is your own request")
                continue
            except ConflictOfInterest:
                refused.append(f"{request_id} goes into an account you own")
                continue
            except DepositRequestNotPending as exc:
                refused.append(f"{request_id} is {exc.status}")
                continue
            except DepositRefused as exc:
                refused.append(f"{request_id}: {exc.reason}")
                continue
            except DepositRequestNotFound:
                missing.append(request_id)
                continue
            if decision.changed_now:
                done.append(request_id)
                self.log_change(request, decision.request, f"{act.done} from the admin: {reason}")
            else:
                # Another staff member decided it first (both had the page open): the
                # decision and its reason are theirs; this one's reason goes into the
                # request's history rather than nowhere.
                first = decision.request
                self.log_change(
                    request, first,
                    f"{act.title} submitted again after {username(first.decided_by)} had decided it: {reason}",
                )
                already.append(f"{request_id} (by {username(first.decided_by)}; your reason is in its history)")
        report(request, messages.SUCCESS, act.done, done)
        report(request, messages.INFO, act.already, already)
        report(request, messages.ERROR, "Refused", refused)
        report(request, messages.ERROR, "No such deposit request", missing)
        return True

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        context["can_decide"] = (
            obj is not None
            and obj.status == DepositRequest.Status.PENDING
            and obj.requested_by_id != request.user.pk
            and self.has_approve_permission(request, obj)
        )
        context["own_request"] = obj is not None and obj.requested_by_id == request.user.pk
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)


class StaffActionAccountFilter(GivenValueFilter):
    """The staff acts on one account (``?account=<id>``, as linked from the account's
    page), newest first through ledger_staffaction_account_idx (account, id)."""

    title = "account"
    parameter_name = "account"

    def queryset(self, request, queryset):
        return queryset.filter(account_id=self.value()) if self.value() else queryset


@admin.register(StaffAction)
class StaffActionAdmin(ActionPermissionAdminMixin, LargeTableAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Every staff act on money or an account, with its author and reason. Append-only."""

    list_display = ("id", "created_at_col", "actor", "action", "account_col", "payment_id", "amount_col", "reason")
    list_select_related = ("actor",)
    list_filter = ("action", StaffActionAccountFilter)
    ordering = ("-id",)
    search_fields = ("account__id",)  # shows the box; get_search_results does the matching
    search_help_text = (
        "Exact account id, payment id, deposit request id or staff username; several separated by spaces."
    )
    fields = (
        "id", "created_at", "actor", "action", "reason", "account_col", "payment_id", "deposit_request",
        "transfer_key", "amount_col",
    )
    readonly_fields = fields

    created_at_col = display_column("created_at", human, "at (UTC)")
    amount_col = display_column("amount", human, "amount")

    @admin.display(description="account", ordering="account")
    def account_col(self, obj):
        return account_id_link(obj.account_id) if obj.account_id else "-"

    def get_search_results(self, request, queryset, search_term):
        terms = search_term.split()[:MAX_SEARCH_TERMS]
        if not terms:
            return queryset, False
        matching = (
            queryset.filter(account_id__in=terms)
            | queryset.filter(payment_id__in=terms)
            | queryset.filter(deposit_request_id__in=terms)
            | queryset.filter(actor__username__in=terms)
        )
        return matching, False


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
class TransferAdmin(ActionPermissionAdminMixin, LargeTableAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "key", "debit_col", "credit_col", "amount_col", "created_at_col")
    list_filter = (TransferAccountFilter, "created_at")
    ordering = ("-id",)
    search_fields = ("key",)  # shows the box; get_search_results does the matching
    search_help_text = "Exact transfer key (a payment's id for a payment) or account id; several separated by spaces."
    fields = ("id", "key", "debit_col", "credit_col", "amount_col", "created_at")
    readonly_fields = fields
    amount_col = display_column("amount", human, "amount")

    debit_col = display_column("debit_account_id", account_id_link, "debit", ordering="debit_account")
    credit_col = display_column("credit_account_id", account_id_link, "credit", ordering="credit_account")
    created_at_col = display_column("created_at", human, "created at (UTC)")

    def get_search_results(self, request, queryset, search_term):
        return exact_terms_search(queryset, search_term, ("key", "debit_account_id", "credit_account_id"))


def exact_terms_search(queryset, search_term: str, columns: tuple[str, ...]):
    """The admin's search of a large table: rows whose ``columns`` equal one of the terms
    (at most MAX_SEARCH_TERMS), each an index lookup, never a LIKE scan."""
    terms = search_term.split()[:MAX_SEARCH_TERMS]
    if not terms:
        return queryset, False
    matching = queryset.none()
    for column in columns:
        matching = matching | queryset.filter(**{f"{column}__in": terms})
    return matching, False


def pending_state_badge(state: str):
    return badge(state, PENDING_STATE_TONES.get(state, "grey"))


@admin.register(PendingTransfer)
class PendingTransferAdmin(ActionPermissionAdminMixin, LargeTableAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Funds reserved for a payout (debit -> clearing), then posted to the rail's settlement
    account or voided back to the payer: the key is the payment's id. Each step is also an
    ordinary transfer, keyed ``pend:``, ``post:`` or ``void:`` and the payment's id."""

    list_display = (
        "key", "debit_col", "clearing_col", "credit_col", "amount_col", "state_col", "created_at_col",
        "resolved_at_col", "transfers_col",
    )
    list_filter = ("state",)
    ordering = ("-key",)  # keys are payment ids, time-ordered: newest first, by the primary key
    search_fields = ("key",)  # shows the box; get_search_results does the matching
    search_help_text = "Exact key (the payment's id) or account id; several separated by spaces."
    fields = (
        "key", "debit_col", "clearing_col", "credit_col", "amount_col", "state_col", "created_at", "resolved_at",
        "transfers_col",
    )
    readonly_fields = fields
    amount_col = display_column("amount", human, "amount")

    debit_col = display_column("debit_account_id", account_id_link, "payer (debit)", ordering="debit_account")
    clearing_col = display_column("clearing_account_id", account_id_link, "held in", ordering="clearing_account")
    credit_col = display_column("credit_account_id", account_id_link, "posts to", ordering="credit_account")
    state_col = display_column("state", pending_state_badge, "state")
    created_at_col = display_column("created_at", human, "reserved (UTC)")
    resolved_at_col = display_column("resolved_at", human, "resolved (UTC)")

    @admin.display(description="transfers")
    def transfers_col(self, obj):
        keys = " ".join(prefix + obj.pk for prefix in (PENDING_PREFIX, POST_PREFIX, VOID_PREFIX))
        url = reverse("admin:ledger_transfer_changelist") + "?" + urlencode({"q": keys})
        return format_html('<a href="{}">its transfers</a>', url)

    def get_search_results(self, request, queryset, search_term):
        return exact_terms_search(queryset, search_term, ("key", "debit_account_id", "clearing_account_id"))


# --- users: Django's user admin, with links to the user's accounts and payments ---------------

MAX_LISTED_ACCOUNTS = 20


class DelaypayUserAdmin(UserAdmin):
    """Django's user admin (superusers: no staff group holds auth permissions) with, on top
    of the page, the user's accounts and a link to their payments."""

    def get_fieldsets(self, request, obj=None):
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None:
            return fieldsets
        return (("delaypay", {"fields": ("accounts_col", "payments_col")}), *fieldsets)

    def get_readonly_fields(self, request, obj=None):
        return (*super().get_readonly_fields(request, obj), "accounts_col", "payments_col")

    @admin.display(description="accounts")
    def accounts_col(self, obj):
        accounts = list(Account.objects.filter(owner=obj).order_by("id")[: MAX_LISTED_ACCOUNTS + 1])
        if not accounts:
            return "none"
        shown = format_html_join(
            ", ", '<a href="{}">{}</a> <span class="dp-mono">{}</span> ({})',
            ((account_url(a.pk), a.name or a.pk, a.pk, a.status) for a in accounts[:MAX_LISTED_ACCOUNTS]),
        )
        more = f" and more: the first {MAX_LISTED_ACCOUNTS} are shown" if len(accounts) > MAX_LISTED_ACCOUNTS else ""
        return format_html('{}{} · <a href="{}" id="dp-user-accounts">all their accounts</a>',
                           shown, more, user_accounts_url(obj.pk))

    @admin.display(description="payments")
    def payments_col(self, obj):
        return format_html('<a href="{}" id="dp-user-payments">the payments they made (as payer)</a>',
                           user_payments_url(obj.pk))


def use_delaypay_user_admin(site) -> None:
    """Replace the user model's admin with DelaypayUserAdmin (keeping a subclass of the
    one registered, should a package have replaced Django's)."""
    user_model = get_user_model()
    registered = site._registry.get(user_model)
    base = type(registered) if registered is not None else UserAdmin
    if registered is not None:
        site.unregister(user_model)
    if issubclass(DelaypayUserAdmin, base):
        site.register(user_model, DelaypayUserAdmin)
    else:
        site.register(user_model, type("DelaypayUserAdmin", (DelaypayUserAdmin, base), {"__module__": __name__}))


use_delaypay_user_admin(admin.site)
