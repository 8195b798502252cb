"""Building blocks shared by the payments and ledger admin consoles.

The admin is a window on money and its audit trail: it reads, and it changes state only
through services (cancel, freeze, deposit). Nothing here edits a row by hand.
"""

import functools
import json
import re
import secrets
from dataclasses import dataclass, field

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import ShowFacets, helpers
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import get_script_prefix, path, reverse
from django.utils.functional import cached_property
from django.utils.html import format_html

from common.authz import MissingPermission
from common.text import validate_display_text

# Changelists count at most this many rows exactly; past it they show the planner's
# estimate, so no page of a large table waits on a COUNT(*) that reads every row.
EXACT_COUNT_LIMIT = 10_000
# From this row on a page is read as a deferred join (EstimatedCountPaginator.page).
DEFERRED_JOIN_FROM_ROW = 1_000


def planner_row_estimate(queryset) -> int:
    """PostgreSQL's estimate of how many rows ``queryset`` returns: one EXPLAIN, no scan."""
    plan = json.loads(queryset.order_by().explain(format="json"))
    return int(plan[0]["Plan"]["Plan Rows"])


class EstimatedCountPaginator(Paginator):
    """Exact counts up to EXACT_COUNT_LIMIT (a COUNT over a LIMITed subquery, so it
    stops reading there); above it, the planner's estimate, and ``estimated`` tells the
    pagination template to say "about"."""

    estimated = False

    @cached_property
    def count(self) -> int:
        bounded = self.object_list.order_by()[: EXACT_COUNT_LIMIT + 1].count()
        if bounded <= EXACT_COUNT_LIMIT:
            return bounded
        self.estimated = True
        return max(planner_row_estimate(self.object_list), bounded)

    def page(self, number):
        """Deep pages as a deferred join: the page's ids first (the list's own query
        reading only the primary key, in its order: index entries, not joined rows), then
        those rows with everything the page shows. Django's ``OFFSET n`` would fetch and
        join every skipped row: page 1,000 of a million payments took 240 ms of SQL."""
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        if bottom < DEFERRED_JOIN_FROM_ROW or not isinstance(self.object_list, QuerySet):
            return super().page(number)
        top = bottom + self.per_page
        if top + self.orphans >= self.count:
            top = self.count
        ids = list(self.object_list.values_list("pk", flat=True)[bottom:top])
        rows = {row.pk: row for row in self.object_list.filter(pk__in=ids).order_by()}
        return self._get_page([rows[pk] for pk in ids if pk in rows], number, self)


# Ids the admin may put in a URL as they are: Django's quote() would turn "_" into "_5F".
PLAIN_ID = re.compile(r"^[A-Za-z0-9-]+(_[0-9A-Za-z]+)+$")


def id_in_url(pk) -> str:
    """``pk`` as an admin URL carries it: payment, account, recurring ids as the API shows
    them (``pay_01...``, not ``pay_5F01...``); anything else quoted as the admin does. Both
    forms open the page: Django's unquote leaves these ids alone."""
    text = str(pk)
    return text if PLAIN_ID.match(text) and unquote(text) == text else quote(text)


_ID_PLACEHOLDER = "dp0id0placeholder"


@functools.cache
def _change_url_template(app_label: str, model_name: str, script_prefix: str) -> str:
    return reverse(f"admin:{app_label}_{model_name}_change", args=[_ID_PLACEHOLDER])


def change_url(model, pk) -> str:
    """``reverse("admin:<app>_<model>_change", args=[id_in_url(pk)])``, reversed once per
    model (and script prefix): a list page links every row and several cells of it, and
    each reverse walks the URL resolver."""
    opts = model._meta
    template = _change_url_template(opts.app_label, opts.model_name, get_script_prefix())
    return template.replace(_ID_PLACEHOLDER, id_in_url(pk))


class LimitedChangeList(ChangeList):
    """A changelist whose row query always carries a LIMIT.

    Django drops the LIMIT when everything fits on one page. On a filter whose row
    estimate is far too high (``execute_at <= now()`` and a status are correlated, the
    planner assumes they are not) that turns a few index lookups into a sort of the
    whole table; with the LIMIT the planner keeps to the indexes.
    """

    def get_filters(self, request):
        """The date drill-down's range (``<field>__gte``/``__lt``, set by Django from
        ``<field>__year`` ...) goes through the admin's ``date_hierarchy_condition`` when
        it has one: a range over every row may need a shape the indexes can serve."""
        specs, has_filters, params, may_have_duplicates, has_active = super().get_filters(request)
        self.date_range = {}
        if self.date_hierarchy and hasattr(self.model_admin, "date_hierarchy_condition"):
            for key in (f"{self.date_hierarchy}__gte", f"{self.date_hierarchy}__lt"):
                if key in params:
                    self.date_range[key] = params.pop(key)[-1]
        return specs, has_filters, params, may_have_duplicates, has_active

    def url_for_result(self, result):
        """Rows link to ``<id>/change/`` with the id as the API shows it (id_in_url)."""
        return change_url(self.model, getattr(result, self.pk_attname))

    def get_queryset(self, request, exclude_parameters=None):
        queryset = super().get_queryset(request, exclude_parameters)
        # A filter that bounds the date drill-down's field says so on the request
        # (console/admin/filters.py, known_execute_at_range): the drill-down spans that range.
        self.date_hierarchy_range = getattr(request, "_dp_execute_at_range", None)
        if self.date_range:
            queryset = queryset.filter(self.model_admin.date_hierarchy_condition(**self.date_range))
        return queryset

    def get_results(self, request):
        super().get_results(request)
        if not self.multi_page or (self.show_all and self.can_show_all):
            limit = self.list_max_show_all if self.show_all else self.list_per_page
            self.result_list = self.queryset[:limit]


class ReadOnlyAdminMixin:
    """No add, no change, no delete: rows change only through services (actions and
    buttons that call them). Works for ModelAdmin and inlines alike."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class LargeTableAdminMixin:
    """Changelist settings for tables of millions of rows: no full COUNT(*)."""

    paginator = EstimatedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    list_max_show_all = 500
    show_facets = ShowFacets.NEVER  # "Show counts" would COUNT every filter choice over the table

    def get_changelist(self, request, **kwargs):
        return LimitedChangeList

    def action_checkbox(self, obj):
        """Django's selection checkbox, the same HTML, written directly: Django renders a
        form widget through the template engine for each row, a third of a 50-row page's
        rendering time."""
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
            helpers.ACTION_CHECKBOX_NAME, str(obj.pk), f"Select this object for an action - {obj}",
        )


class LatestRowsInlineFormSet(BaseInlineFormSet):
    """An inline that shows only the first ``max_rows`` rows in the inline's ordering
    (newest first): a recurring payment's occurrences and events grow without bound."""

    max_rows = 50

    def get_queryset(self):
        if not hasattr(self, "_latest_rows"):
            self._latest_rows = super().get_queryset()[: self.max_rows]
        return self._latest_rows


def see_other(url: str) -> HttpResponseRedirect:
    """A redirect after a POST that the browser follows with a GET (303 See Other)."""
    response = HttpResponseRedirect(url)
    response.status_code = 303
    return response


def has_model_permission(model_admin, request, action: str) -> bool:
    """Whether the user holds ``<app>.<action>_<model>`` (a Meta permission such as cancel)."""
    return request.user.has_perm(act_permission(model_admin, action))


def act_permission(model_admin, action: str) -> str:
    """The permission behind the ModelAdmin's ``has_<action>_permission``: the model's
    ``<app>.<action>_<model>`` unless the ModelAdmin's ``act_permissions`` names another
    (ledger.approve_deposit, payments.force_breaker). The 403 page names it."""
    named = getattr(model_admin, "act_permissions", {}).get(action)
    if named:
        return named
    opts = model_admin.opts
    return f"{opts.app_label}.{get_permission_codename(action, opts)}"


def object_view_url(model_admin, name: str, view):
    """``<object_id>/<name>/`` under the model's admin, behind the admin's login and CSRF
    checks and the model's view permission (an act on an object needs to see it first, as
    in the API: common/authz.py), reversible as ``admin:<app>_<model>_<name>``."""
    opts = model_admin.opts

    @functools.wraps(view)
    def seen_first(request, *args, **kwargs):
        if not model_admin.has_view_or_change_permission(request):
            raise MissingPermission(act_permission(model_admin, "view"))
        return view(request, *args, **kwargs)

    return path(
        f"<path:object_id>/{name}/",
        model_admin.admin_site.admin_view(seen_first),
        name=f"{opts.app_label}_{opts.model_name}_{name}",
    )


def display_column(attr: str, render, description: str, ordering: str | None = None):
    """A column (list or detail page) showing ``render(obj.<attr>)``, sortable by
    ``ordering`` (``attr`` by default)."""

    @admin.display(description=description, ordering=ordering or attr)
    def column(model_admin, obj):
        return render(getattr(obj, attr))

    return column


def badge(value: str, tone: str):
    """A coloured pill; the colours live in templates/admin/delaypay_styles.html."""
    return format_html('<span class="dp-badge dp-{}">{}</span>', tone, value)


def report(request, level: int, label: str, items: list[str]) -> None:
    """One admin message per outcome, naming every object it applies to."""
    if items:
        messages.add_message(request, level, f"{label}: {', '.join(items)}.")



# --- Staff acts: permission first, then a confirmation page with a reason ------------------


class ActionPermissionAdminMixin:
    """A changelist action the user may not run is refused with 403.

    Django answers a POSTed action that is not among the user's actions (no permission
    for it, or no such action) with "No action selected." and a 200 or a redirect: the
    act silently does not happen. A staff act without its permission is refused
    outright instead. Every ModelAdmin of the console has this mixin (a test checks the
    admin site's registry)."""

    def changelist_view(self, request, extra_context=None):
        if request.method == "POST" and "_save" not in request.POST:  # _save: list_editable, not an action
            allowed = self.get_actions(request)
            refused = [name for name in request.POST.getlist("action") if name and name not in allowed]
            if refused:
                raise self.action_refusal(request, refused[0])
        return super().changelist_view(request, extra_context)

    def action_refusal(self, request, name: str) -> PermissionDenied:
        """The refusal of action ``name``: naming the first permission it needs that the
        user lacks (a MissingPermission), or a bare one for an action that does not exist."""
        actions = {action_name: func for func, action_name, _ in self._get_base_actions()}
        for needed in getattr(actions.get(name), "allowed_permissions", ()):
            if not getattr(self, f"has_{needed}_permission")(request):
                return MissingPermission(act_permission(self, needed))
        return PermissionDenied()


def mend_axes_cleanup_action(site) -> None:
    """django-axes 8.3's "Clean up expired attempts" action reads the request's login
    attempt time, which only a login request carries (AttributeError: a 500 for any staff
    user who runs it), and declares no permission. Re-register its admin with the action
    run at the current time, and allowed only to those who may delete login attempts."""
    from axes.models import AccessAttempt
    from django.utils import timezone

    model_admin = site._registry.get(AccessAttempt)
    if model_admin is None:
        return
    cls = type(model_admin)

    @admin.action(description="Clean up expired attempts", permissions=["delete"])
    def cleanup_expired_attempts(self, request, queryset):
        if not hasattr(request, "axes_attempt_time"):
            request.axes_attempt_time = timezone.now()
        return cls.cleanup_expired_attempts(self, request, queryset)

    site.unregister(AccessAttempt)
    site.register(AccessAttempt, type(cls.__name__, (cls,), {
        "__module__": cls.__module__, "cleanup_expired_attempts": cleanup_expired_attempts,
    }))


class ViewOnlyAdminMixin:
    """No add and no change, for anyone, superusers included: every field is shown read-only
    and a POST to the add or change page is refused with 403 (Django's own check). Delete
    is left to the ModelAdmin."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


class NoDeleteAdminMixin:
    def has_delete_permission(self, request, obj=None) -> bool:
        return False


def make_tokens_and_login_records_view_only(site) -> None:
    """Re-register the admins of django-rest-knox's API tokens and django-axes' login
    records as view-only (issue 36). Knox's admin edited a token's digest, key, user and
    expiry and added tokens: a token could be extended or moved to another user with no
    staff action recorded. Deleting (revoking) one would record no reason either, so it is
    gone too: deactivate the user (knox refuses an inactive user's tokens) or the user logs
    out through the API. Axes' logs (AccessLog, AccessFailureLog) are an audit trail: view
    only. An AccessAttempt is the lockout itself: deleting one (or "Clean up expired
    attempts") lifts it, as django-axes documents, so that stays, for superusers."""
    from axes.models import AccessAttempt, AccessFailureLog, AccessLog
    from knox.models import AuthToken

    mixins = {
        AuthToken: (ViewOnlyAdminMixin, NoDeleteAdminMixin),
        AccessAttempt: (ViewOnlyAdminMixin,),
        AccessLog: (ViewOnlyAdminMixin, NoDeleteAdminMixin),
        AccessFailureLog: (ViewOnlyAdminMixin, NoDeleteAdminMixin),
    }
    for model, bases in mixins.items():
        model_admin = site._registry.get(model)
        if model_admin is None:
            continue
        cls = type(model_admin)
        site.unregister(model)
        site.register(model, type(cls.__name__, (*bases, cls), {"__module__": cls.__module__}))


def refuse_unpermitted_actions_everywhere(site) -> None:
    """Give every ModelAdmin registered on ``site`` the ActionPermissionAdminMixin,
    Django's and third-party apps' too (users, groups, tokens, login attempts): run once
    all admin modules are imported (payments' AppConfig.ready, after the admin's
    autodiscovery)."""
    for model, model_admin in list(site._registry.items()):
        if not isinstance(model_admin, ActionPermissionAdminMixin):
            cls = type(model_admin)
            site.unregister(model)
            site.register(model, type(cls.__name__, (ActionPermissionAdminMixin, cls), {"__module__": cls.__module__}))


MAX_REASON_LENGTH = 500

# The confirmation page's submit: present, the act runs; absent, the page is shown.
CONFIRMED = "confirmed"

# A list action's selection, kept in the session for its confirmation page (a GET, reached
# by a redirect: Back never re-posts): the query parameter naming it, the session key, and
# how many a session keeps (the oldest go first).
SELECTION_PARAM = "selection"
SELECTIONS_SESSION_KEY = "dp_act_selections"
MAX_KEPT_SELECTIONS = 20


class ReasonForm(forms.Form):
    """Why a staff member acts: recorded with their user (the payment's event history, the
    ledger's staff actions, the admin's history)."""

    reason = forms.CharField(
        max_length=MAX_REASON_LENGTH,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        validators=[validate_display_text],
        help_text="Required, on one line. Recorded with your user.",
    )


@dataclass(frozen=True)
class ConfirmedAct:
    """An act that changes state irreversibly (or moves money): one click shows its
    confirmation page (the rows, how many it will change, a required reason); only the
    page's submit runs it."""

    name: str  # the object URL (<id>/<name>/) and the bulk action (<name>_selected)
    title: str  # the page's title and its button
    explanation: str  # what it does, on the page
    permission: str  # the ModelAdmin's has_<permission>_permission decides who may
    form: type[forms.Form] = ReasonForm
    extra: dict = field(default_factory=dict)  # whatever the ModelAdmin's perform_act needs
    # The submit button, naming the act and what it changes: {count} is "3 scheduled payments".
    button: str = ""

    def button_text(self, count: str) -> str:
        return (self.button or f"{self.title} {{count}}").format(count=count)


@dataclass(frozen=True)
class ConfirmRow:
    cells: list
    left_alone: str = ""  # why this row will not change (empty: it will)


def confirmed_action(act: ConfirmedAct, description: str):
    """The changelist action ``<act.name>_selected``: shows ``act``'s confirmation page."""

    @admin.action(description=description, permissions=[act.permission])
    def action(model_admin, request, queryset):
        return model_admin.act_selected(request, queryset, act)

    action.__name__ = f"{act.name}_selected"
    return action


class ConfirmedActAdminMixin:
    """Confirmation pages for ``confirmed_acts``: the object page's button (GET
    ``<id>/<name>/`` shows the page, its POST with CONFIRMED runs the act) and the
    changelist action (``confirmed_action``; its page posts back to the changelist).
    Subclasses give the page's rows (``confirmation_rows``) and run the act on each id,
    reporting what happened (``perform_act``)."""

    confirmed_acts: tuple[ConfirmedAct, ...] = ()
    max_rows_per_act = 500
    confirm_template = "admin/confirm_act.html"

    def confirmation_rows(
        self, request, act: ConfirmedAct, object_ids: list[str]
    ) -> tuple[list[str], list[ConfirmRow]]:
        """The page's table: its headers and a row per id (in the order to show)."""
        raise NotImplementedError

    def perform_act(self, request, act: ConfirmedAct, object_ids: list[str], form) -> bool:
        """Run ``act`` on each id and report it; False (with errors on the form) when the
        service refused the input itself."""
        raise NotImplementedError

    def noun(self, count: int) -> str:
        return self.opts.verbose_name if count == 1 else self.opts.verbose_name_plural

    def act_allowed(self, request, act: ConfirmedAct) -> bool:
        return getattr(self, f"has_{act.permission}_permission")(request)

    def get_urls(self):
        def view_for(act):
            return lambda request, object_id: self.act_view(request, object_id, act)

        def selection_view_for(act):
            return lambda request: self.selection_view(request, act)

        opts = self.opts
        # Before the object pages: "selected/<name>/" would match "<path:object_id>/<name>/".
        selection_urls = [
            path(
                f"selected/{act.name}/",
                self.admin_site.admin_view(selection_view_for(act)),
                name=f"{opts.app_label}_{opts.model_name}_{act.name}_selected",
            )
            for act in self.confirmed_acts
        ]
        object_urls = [object_view_url(self, act.name, view_for(act)) for act in self.confirmed_acts]
        return [*selection_urls, *object_urls, *super().get_urls()]

    def act_selected(self, request, queryset, act: ConfirmedAct):
        """The bulk action: the selection is kept in the session and the POST answered with
        a redirect (303) to its confirmation page, a GET: Back from the list the act
        returns to never shows the browser's "Confirm Form Resubmission". A row that left
        the list's filter meanwhile is still acted on and reported, not silently skipped.
        A POST with CONFIRMED and the ids (as the confirmation page once posted back to the
        changelist) still runs the act, then redirects to the list."""
        plural = self.opts.verbose_name_plural
        refusal = f"Select at most {self.max_rows_per_act} {plural} per {act.title.lower()}; nothing changed."
        if CONFIRMED in request.POST:
            ids = sorted(set(request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)))
        else:
            selected = queryset.order_by().values_list("pk", flat=True)[: self.max_rows_per_act + 1]
            ids = sorted(str(pk) for pk in selected)
        if len(ids) > self.max_rows_per_act:
            self.message_user(request, refusal, messages.ERROR)
            return None
        if CONFIRMED in request.POST:
            return self.act_page(
                request, act, ids, back_url=request.get_full_path(), bulk_action=f"{act.name}_selected"
            )
        token = self.keep_selection(request, act, ids, back_url=request.get_full_path())
        return see_other(f"{self.selection_url(act)}?{SELECTION_PARAM}={token}")

    def selection_url(self, act: ConfirmedAct) -> str:
        return reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_{act.name}_selected")

    def keep_selection(self, request, act: ConfirmedAct, ids: list[str], *, back_url: str) -> str:
        kept = dict(request.session.get(SELECTIONS_SESSION_KEY, {}))
        token = secrets.token_urlsafe(9)
        kept[token] = {"act": self.selection_key(act), "ids": ids, "back": back_url}
        request.session[SELECTIONS_SESSION_KEY] = dict(list(kept.items())[-MAX_KEPT_SELECTIONS:])
        return token

    def selection_key(self, act: ConfirmedAct) -> str:
        return f"{self.opts.label}.{act.name}"

    def selection_view(self, request, act: ConfirmedAct):
        """The bulk action's confirmation page (GET), and its submit (POST): after the act,
        a redirect (303) to the list it was chosen from, with the report in messages."""
        if not self.has_view_or_change_permission(request):
            raise MissingPermission(act_permission(self, "view"))
        if not self.act_allowed(request, act):
            raise MissingPermission(act_permission(self, act.permission))
        token = request.GET.get(SELECTION_PARAM, "")
        kept = request.session.get(SELECTIONS_SESSION_KEY, {}).get(token)
        changelist = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist")
        if not kept or kept.get("act") != self.selection_key(act):
            self.message_user(
                request, f"That {act.title.lower()} selection is no longer known; select the rows again.",
                messages.WARNING,
            )
            return see_other(changelist)
        back = kept["back"] if kept["back"].startswith(changelist) else changelist
        return self.act_page(request, act, kept["ids"], back_url=back) or see_other(back)

    def act_view(self, request, object_id, act: ConfirmedAct):
        """The object page's button: the confirmation page, then back to the object."""
        if not self.act_allowed(request, act):
            raise MissingPermission(act_permission(self, act.permission))
        pk = unquote(object_id)
        if not self.model._default_manager.filter(pk=pk).exists():
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        change_url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_change", args=[id_in_url(pk)])
        return self.act_page(request, act, [pk], back_url=change_url) or HttpResponseRedirect(change_url)

    def act_page(self, request, act: ConfirmedAct, object_ids: list[str], *, back_url: str, bulk_action: str = ""):
        """The confirmation page (asked for, or its form invalid), or None once the act ran
        on every id and each was reported, or was refused because none would change (the
        page's button is disabled then)."""
        confirmed = request.method == "POST" and CONFIRMED in request.POST
        form = act.form(request.POST if confirmed else None)
        headers, rows = self.confirmation_rows(request, act, object_ids)
        count, affected = len(object_ids), sum(1 for row in rows if not row.left_alone)
        noun = self.noun(count)
        if confirmed and form.is_valid():
            if not affected:  # the page's button was disabled: a stale page, or a forged submit
                why = "; ".join(dict.fromkeys(row.left_alone for row in rows))
                self.message_user(
                    request,
                    f"{act.title}: none of the {count} {noun} listed would change ({why}); nothing was done and "
                    "your reason was not recorded.",
                    messages.ERROR,
                )
                return None
            if self.perform_act(request, act, object_ids, form):
                return None
        context = {
            **self.admin_site.each_context(request),
            "title": f"{act.title}: {count} {noun}",
            "subtitle": None,
            "opts": self.opts,
            "act": act,
            "form": form,
            "headers": headers,
            "rows": rows,
            "count": count,
            "affected": affected,
            "left_alone": count - affected,
            "noun": noun,
            "submit_label": act.button_text(f"{affected} {self.noun(affected)}"),
            "object_ids": object_ids,
            "bulk_action": bulk_action,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "confirmed_name": CONFIRMED,
            "back_url": back_url,
            "has_view_permission": self.has_view_permission(request),
        }
        return TemplateResponse(request, self.confirm_template, context)


class GivenValueFilter(admin.SimpleListFilter):
    """A filter on one id given in the URL (as linked from another page): listing every
    choice would not scale, so the choice is offered only once given. A subclass sets
    ``title`` and ``parameter_name`` and filters in ``queryset``."""

    def lookups(self, request, model_admin):
        return [(self.value(), self.value())] if self.value() else []

    def has_output(self) -> bool:
        return bool(self.value())


def name_login_records_in_plain_times() -> None:
    """django-axes names its login records with the raw datetime ("Attempted Access:
    2026-12-05 03:25:49.402722+00:00"), which the console shows as their pages' titles
    and breadcrumbs. The same names, with the time as every console page writes it
    (common.formats.human: to the second, UTC)."""
    from axes.models import AccessAttempt, AccessFailureLog, AccessLog

    from common.formats import human

    def attempt(self):
        return f"Attempted access: {human(self.attempt_time)}"

    def failure(self):
        locked_out = " locked out" if self.locked_out else ""
        return f"Failed access: user {self.username}{locked_out} on {human(self.attempt_time)} from {self.ip_address}"

    def log(self):
        return f"Access log for {self.username} @ {human(self.attempt_time)}"

    AccessAttempt.__str__, AccessFailureLog.__str__, AccessLog.__str__ = attempt, failure, log
