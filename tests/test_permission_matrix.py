"""Role x endpoint: every route of the URL conf and every admin action, for every role.

The rule (common/authz.py): ``is_staff`` alone grants nothing. Staff read someone else's
objects with the model's view permission and act on them with the act's permission, the
one the admin asks for; without it they are ordinary users (404 on someone else's
object, their own rows only in a list), or get 403 where the act is staff-only.

What each route and action needs is declared below (API, ADMIN_ACTIONS, ROUTES); the
outcome for each role follows from what the role holds. The routes and actions tested
are collected from the URL conf (``get_resolver()``) and the admin site's registry, not
from these tables: a new route, HTTP method or admin action that is not declared fails
``test_every_route_and_action_is_declared`` and its own matrix cases, so none can slip
through without a decision. Own objects (the payer, the account owner) are the subject
of tests/payments/api/test_authorization.py; here every object belongs to someone who is
none of the roles.
"""

import io
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import date, timedelta
from html import unescape
from types import SimpleNamespace

import pytest
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.conf import settings as django_settings
from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.utils import quote
from django.contrib.auth import get_permission_codename
from django.contrib.auth.models import Group
from django.contrib.messages import get_messages
from django.core.management import call_command
from django.db import transaction
from django.test import Client, override_settings
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone
from django.utils.http import urlencode
from knox.models import AuthToken

from ledger.models import ISSUANCE_ACCOUNT_ID, Account, Transfer
from ledger.services import deposit_request_create
from payments.management.commands.staff_groups import STAFF_GROUPS
from payments.models import ArchivedPartition, RailState
from recurring.services import recurring_create
from tests.api import future
from tests.conftest import client_for, ensure_system_rows
from tests.console.test_payouts import reserved_payout
from tests.factories import (
    PASSWORD,
    AccountFactory,
    UserFactory,
    funded_account,
    future_payment,
    parked_payment,
    payee_for,
)
from webhooks.endpoints import endpoint_create
from webhooks.models import Delivery, DeliveryStatus, Event

pytestmark = pytest.mark.django_db

# Every shipped staff group is a role (a new group joins the matrix by itself), beside
# anonymous, an ordinary user, a staff user in no group and a superuser.
ROLES = ("anonymous", "user", "staff", *sorted(STAFF_GROUPS), "superuser")

NOBODY = "nobody"  # a need no role meets, superusers included (an admin action of a read-only table)

VIEW_ACCOUNT = "ledger.view_account"
VIEW_TRANSFER = "ledger.view_transfer"
VIEW_PAYMENT = "payments.view_scheduledpayment"
VIEW_RECURRING = "payments.view_recurringpayment"
VIEW_DEPOSIT_REQUEST = "ledger.view_depositrequest"
APPROVE_DEPOSIT = "ledger.approve_deposit"
VIEW_ENDPOINT = "webhooks.view_endpoint"
VIEW_DELIVERY = "webhooks.view_delivery"
RESEND_DELIVERY = "webhooks.resend_delivery"
VIEW_PAYEE = "payments.view_payee"
VIEW_RAILSTATE = "payments.view_railstate"
FORCE_BREAKER = "payments.force_breaker"


# --- The declared tables ------------------------------------------------------------------


@dataclass(frozen=True)
class Listing:
    """A list endpoint: someone else's row (``marker``, a World attribute) is listed only
    for staff holding ``permission``; everyone else sees their own rows only."""

    permission: str
    marker: str
    id_field: str


@dataclass(frozen=True)
class Api:
    """What an API route and method needs. Checked in this order: ``public`` (anyone,
    no token); a token (else 401); ``staff_only``: the act's permission before anything
    else (else 403); ``reach``: the permissions to see the object in the path (else 404:
    existence is not revealed); ``act``: the act's permission on an object the caller
    can see (else 403)."""

    public: bool = False
    reach: tuple[str, ...] = ()
    act: str = ""
    staff_only: bool = False
    listing: Listing | None = None
    ok: int = 200
    target: str = ""  # the World attribute the path's id names (default: by the kwarg's name)
    body: Callable | dict | None = None  # a dict, or world -> dict
    query: dict | None = None  # query parameters

    def expected(self, user) -> int:
        if self.public:
            return self.ok
        if user is None:
            return 401
        if self.staff_only and not holds(user, self.act):
            return 403
        if not all(holds(user, p) for p in self.reach):
            return 404
        if self.act and not holds(user, self.act):
            return 403
        return self.ok


def own_payment(world) -> dict:
    """A payment from the caller's own account (an anonymous caller has none: the owner's)."""
    source = world.own_account or world.account
    return {"from_account": source.id, "to_account": world.target.id, "amount": 1, "execute_at": future()}


def own_recurring(world) -> dict:
    source = world.own_account or world.account
    return {"from_account": source.id, "to_account": world.target.id, "amount": 1, "start_at": future(),
            "interval": "P1D"}


REASON = {"reason": "matrix"}

PUBLIC = Api(public=True)

#  (route name, method): what it needs. HEAD is GET without a body: tested with GET's entry.
API: dict[tuple[str, str], Api] = {
    ("auth-token", "POST"): Api(public=True, body=lambda w: {"username": w.owner.username, "password": PASSWORD}),
    ("auth-logout", "POST"): Api(ok=204),  # the caller's own token
    ("auth-logout-all", "POST"): Api(ok=204),  # the caller's own tokens
    ("account-list", "GET"): Api(listing=Listing(VIEW_ACCOUNT, "account", "account_id")),
    ("account-list", "POST"): Api(ok=201, body={"name": "mine"}),
    ("account-detail", "GET"): Api(reach=(VIEW_ACCOUNT,)),
    # Money enters only through staff holding the deposit permission (a small amount: at once).
    ("account-deposits", "POST"): Api(
        staff_only=True, act="ledger.deposit_account", reach=(VIEW_ACCOUNT,), ok=201, body={"amount": 1, **REASON}
    ),
    ("account-payments", "GET"): Api(reach=(VIEW_ACCOUNT,), listing=Listing(VIEW_PAYMENT, "payment", "payment_id")),
    ("account-transfers", "GET"): Api(
        reach=(VIEW_ACCOUNT,), listing=Listing(VIEW_TRANSFER, "funding", "transfer_id")
    ),
    # Deposit requests are staff business only: nobody owns one.
    ("deposit-request-list", "GET"): Api(staff_only=True, act=VIEW_DEPOSIT_REQUEST),
    ("deposit-request-detail", "GET"): Api(staff_only=True, act=VIEW_DEPOSIT_REQUEST),
    ("deposit-request-approve", "POST"): Api(staff_only=True, act=APPROVE_DEPOSIT, body=REASON),
    ("deposit-request-reject", "POST"): Api(staff_only=True, act=APPROVE_DEPOSIT, body=REASON),
    ("payment-list", "GET"): Api(listing=Listing(VIEW_PAYMENT, "payment", "payment_id")),
    ("payment-list", "POST"): Api(ok=201, body=own_payment),
    ("payment-detail", "GET"): Api(reach=(VIEW_PAYMENT,)),
    ("payment-detail", "PATCH"): Api(reach=(VIEW_PAYMENT,), act="payments.change_scheduledpayment", body={"amount": 6}),
    ("payment-detail", "DELETE"): Api(reach=(VIEW_PAYMENT,), act="payments.cancel_scheduledpayment", query=REASON),
    ("payment-redrive", "POST"): Api(
        reach=(VIEW_PAYMENT,), act="payments.redrive_scheduledpayment", target="parked", body=REASON
    ),
    ("payment-resolve", "POST"): Api(
        reach=(VIEW_PAYMENT,), act="payments.redrive_scheduledpayment", target="parked",
        body={"outcome": "failed", **REASON},
    ),
    ("payee-list", "GET"): Api(listing=Listing(VIEW_PAYEE, "payee", "payee_id")),
    ("payee-list", "POST"): Api(ok=201, body={"name": "mine", "rail": "sandbox", "destination": "acct_mine"}),
    ("payee-detail", "GET"): Api(reach=(VIEW_PAYEE,)),
    # Only its owner deletes a payee: staff who may read it get 403 (NOBODY), anyone else 404
    # (payouts/payees.py, payee_delete).
    ("payee-detail", "DELETE"): Api(reach=(VIEW_PAYEE,), act=NOBODY, ok=204),
    ("recurring-list", "GET"): Api(listing=Listing(VIEW_RECURRING, "recurring", "recurring_id")),
    ("recurring-list", "POST"): Api(ok=201, body=own_recurring),
    ("recurring-detail", "GET"): Api(reach=(VIEW_RECURRING,)),
    ("recurring-detail", "PATCH"): Api(
        reach=(VIEW_RECURRING,), act="payments.change_recurringpayment", body={"amount": 3}
    ),
    ("recurring-detail", "DELETE"): Api(reach=(VIEW_RECURRING,), act="payments.delete_recurringpayment"),
    ("recurring-pause", "POST"): Api(reach=(VIEW_RECURRING,), act="payments.pause_recurringpayment"),
    ("recurring-resume", "POST"): Api(reach=(VIEW_RECURRING,), act="payments.pause_recurringpayment"),
    # Webhook endpoints are their owner's alone: staff who may read one still may not act on it
    # through the API (NOBODY: 403); support resends deliveries from the admin, with a reason.
    ("webhook-endpoint-list", "GET"): Api(listing=Listing(VIEW_ENDPOINT, "endpoint", "endpoint_id")),
    ("webhook-endpoint-list", "POST"): Api(
        ok=201, body={"url": "https://hooks.example.com/mine", "events": ["payment.executed"]}
    ),
    ("webhook-endpoint-detail", "GET"): Api(reach=(VIEW_ENDPOINT,)),
    ("webhook-endpoint-detail", "PATCH"): Api(reach=(VIEW_ENDPOINT,), act=NOBODY, body={"description": "matrix"}),
    ("webhook-endpoint-detail", "DELETE"): Api(reach=(VIEW_ENDPOINT,), act=NOBODY),
    ("webhook-endpoint-rotate-secret", "POST"): Api(reach=(VIEW_ENDPOINT,), act=NOBODY),
    ("webhook-delivery-list", "GET"): Api(reach=(VIEW_ENDPOINT, VIEW_DELIVERY)),
    ("webhook-delivery-resend", "POST"): Api(reach=(VIEW_ENDPOINT, VIEW_DELIVERY), act=NOBODY),
    ("schema", "GET"): PUBLIC,
    ("docs", "GET"): PUBLIC,
}  # fmt: skip


@dataclass(frozen=True)
class Admin:
    """What an admin page or action needs: every permission in ``needs`` (staff only;
    anyone else is sent to the login page)."""

    needs: tuple[str, ...]
    methods: tuple[str, ...] = ("GET",)
    target: str = ""  # the World attribute the object URL names (default: the model's first row)
    public: bool = False  # outside the admin, not a matter of roles (probes, metrics)
    # A page, a confirmation page, or done and redirected (303: a list action's POST answered
    # with its confirmation page's URL, common/admin_tools.py, act_selected).
    ok: tuple[int, ...] = (200, 302, 303)

    def expected(self, user) -> int | str:
        if self.public:
            return "ok"
        if user is None or not user.is_staff:
            return "login"
        return "ok" if all(holds(user, p) for p in self.needs) else 403


# Every changelist action of every registered ModelAdmin: (model label, action) -> needs.
# Running an action needs the changelist (the model's view permission) and the action's own.
ADMIN_ACTIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("payments.ScheduledPayment", "cancel_selected"): (VIEW_PAYMENT, "payments.cancel_scheduledpayment"),
    ("payments.ScheduledPayment", "redrive_selected"): (VIEW_PAYMENT, "payments.redrive_scheduledpayment"),
    ("payments.ScheduledPayment", "resolve_selected"): (VIEW_PAYMENT, "payments.redrive_scheduledpayment"),
    ("payments.RecurringPayment", "pause_selected"): (VIEW_RECURRING, "payments.pause_recurringpayment"),
    ("payments.RecurringPayment", "resume_selected"): (VIEW_RECURRING, "payments.pause_recurringpayment"),
    ("payments.RecurringPayment", "end_selected"): (VIEW_RECURRING, "payments.pause_recurringpayment"),
    ("ledger.Account", "freeze_selected"): (VIEW_ACCOUNT, "ledger.freeze_account"),
    ("ledger.Account", "unfreeze_selected"): (VIEW_ACCOUNT, "ledger.freeze_account"),
    ("ledger.DepositRequest", "approve_selected"): (VIEW_DEPOSIT_REQUEST, APPROVE_DEPOSIT),
    ("ledger.DepositRequest", "reject_selected"): (VIEW_DEPOSIT_REQUEST, APPROVE_DEPOSIT),
    ("webhooks.Delivery", "resend_selected"): (VIEW_DELIVERY, RESEND_DELIVERY),
    # The Rails page's acts: each shows its confirmation page (asking for a reason).
    ("payments.RailState", "force_open_selected"): (VIEW_RAILSTATE, FORCE_BREAKER),
    ("payments.RailState", "force_closed_selected"): (VIEW_RAILSTATE, FORCE_BREAKER),
    ("payments.RailState", "clear_hold_selected"): (VIEW_RAILSTATE, FORCE_BREAKER),
    # Nothing is deleted in the console: the read-only tables offer delete_selected to nobody.
    **{
        (label, "delete_selected"): (NOBODY,)
        for label in (
            "payments.ScheduledPayment", "payments.RecurringPayment", "payments.PaymentEvent",
            "payments.ExecutionAttempt", "payments.RecurringEvent", "payments.Payee", "payments.Payout",
            "payments.RailState", "payments.ArchivedPartition",
            "ledger.Account", "ledger.Transfer", "ledger.DepositRequest", "ledger.StaffAction",
            "ledger.PendingTransfer", "webhooks.Endpoint", "webhooks.Event", "webhooks.Delivery",
        )
    },
    # Users, groups, API tokens and login lockouts: Django's and the packages' own admins,
    # for superusers (no staff group holds these).
    ("auth.User", "delete_selected"): ("auth.view_user", "auth.delete_user"),
    ("auth.Group", "delete_selected"): ("auth.view_group", "auth.delete_group"),
    # API tokens are view-only (common/admin_tools.py, make_tokens_and_login_records_view_only).
    ("knox.AuthToken", "delete_selected"): (NOBODY,),
    ("axes.AccessAttempt", "delete_selected"): ("axes.view_accessattempt", "axes.delete_accessattempt"),
    # django-axes declares no permission on this action; ours (common/admin_tools.py,
    # mend_axes_cleanup_action) needs the delete permission. It deletes expired lockouts.
    ("axes.AccessAttempt", "cleanup_expired_attempts"): ("axes.view_accessattempt", "axes.delete_accessattempt"),
    # Login logs are an audit trail: view-only.
    ("axes.AccessLog", "delete_selected"): (NOBODY,),
    ("axes.AccessFailureLog", "delete_selected"): (NOBODY,),
}  # fmt: skip

# A page with a form (a confirmation asking for a reason, the deposit form): GET shows it,
# a POST without the form's fields shows it again; both need the act's permission.
PAGE = ("GET", "POST")

# Every named route that is neither the API nor Django's own admin pages (the admin
# site's index, login, ...; a ModelAdmin's changelist, add, change, delete, history).
# The console's acts: GET shows the confirmation page (asking for a reason), which needs
# the act's permission already; buttons that act at once are POST only.
ROUTES: dict[str, Admin] = {
    "healthz": Admin((), public=True),
    "readyz": Admin((), public=True, ok=(200, 503)),  # 503 until a promoter has ticked
    "metrics": Admin((), public=True),  # guarded by DELAYPAY_METRICS_TOKEN when set, not by role
    "favicon": Admin((), public=True),  # the console's icon, asked for by every page
    "admin-dashboard": Admin((VIEW_PAYMENT,)),
    "admin-limits": Admin((VIEW_PAYMENT,)),
    # The console-wide search: any staff member; each finds only what they may view (a page
    # saying "nothing you may see", or a redirect to the one match).
    "admin-search": Admin(()),
    # The payment list as CSV (the same filters as the list): reading, so the view permission.
    "admin:payments_scheduledpayment_export": Admin((VIEW_PAYMENT,)),
    "admin:payments_scheduledpayment_cancel": Admin(
        (VIEW_PAYMENT, "payments.cancel_scheduledpayment"), methods=("POST",), target="payment"
    ),
    "admin:payments_scheduledpayment_redrive": Admin(
        (VIEW_PAYMENT, "payments.redrive_scheduledpayment"), methods=PAGE, target="parked"
    ),
    "admin:payments_scheduledpayment_resolve": Admin(
        (VIEW_PAYMENT, "payments.redrive_scheduledpayment"), methods=PAGE, target="parked"
    ),
    "admin:payments_recurringpayment_pause": Admin(
        (VIEW_RECURRING, "payments.pause_recurringpayment"), methods=PAGE, target="recurring"
    ),
    "admin:payments_recurringpayment_resume": Admin(
        (VIEW_RECURRING, "payments.pause_recurringpayment"), methods=PAGE, target="recurring"
    ),
    "admin:payments_recurringpayment_end": Admin(
        (VIEW_RECURRING, "payments.pause_recurringpayment"), methods=PAGE, target="recurring"
    ),
    "admin:ledger_account_deposit": Admin((VIEW_ACCOUNT, "ledger.deposit_account"), methods=PAGE, target="account"),
    "admin:ledger_account_freeze": Admin((VIEW_ACCOUNT, "ledger.freeze_account"), methods=PAGE, target="account"),
    "admin:ledger_account_unfreeze": Admin((VIEW_ACCOUNT, "ledger.freeze_account"), methods=PAGE, target="account"),
    "admin:ledger_depositrequest_approve": Admin(
        (VIEW_DEPOSIT_REQUEST, APPROVE_DEPOSIT), methods=PAGE, target="deposit_request"
    ),
    "admin:ledger_depositrequest_reject": Admin(
        (VIEW_DEPOSIT_REQUEST, APPROVE_DEPOSIT), methods=PAGE, target="deposit_request"
    ),
    "admin:webhooks_delivery_resend": Admin((VIEW_DELIVERY, RESEND_DELIVERY), methods=PAGE, target="delivery"),
    "admin:payments_railstate_force_open": Admin((VIEW_RAILSTATE, FORCE_BREAKER), methods=PAGE, target="rail_state"),
    "admin:payments_railstate_force_closed": Admin(
        (VIEW_RAILSTATE, FORCE_BREAKER), methods=PAGE, target="rail_state"
    ),
    "admin:payments_railstate_clear_hold": Admin((VIEW_RAILSTATE, FORCE_BREAKER), methods=PAGE, target="rail_state"),
    "admin:auth_user_password_change": Admin(("auth.view_user", "auth.change_user"), methods=PAGE, target="owner"),
    # A list action's confirmation page (a GET reached by a redirect; here without a kept
    # selection, so back to the list): the list's view permission and the act's.
    **{
        f"admin:{name}_selected": Admin(needs, methods=PAGE)
        for name, needs in {
            "payments_scheduledpayment_cancel": (VIEW_PAYMENT, "payments.cancel_scheduledpayment"),
            "payments_scheduledpayment_redrive": (VIEW_PAYMENT, "payments.redrive_scheduledpayment"),
            "payments_scheduledpayment_resolve": (VIEW_PAYMENT, "payments.redrive_scheduledpayment"),
            "payments_recurringpayment_pause": (VIEW_RECURRING, "payments.pause_recurringpayment"),
            "payments_recurringpayment_resume": (VIEW_RECURRING, "payments.pause_recurringpayment"),
            "payments_recurringpayment_end": (VIEW_RECURRING, "payments.pause_recurringpayment"),
            "ledger_account_freeze": (VIEW_ACCOUNT, "ledger.freeze_account"),
            "ledger_account_unfreeze": (VIEW_ACCOUNT, "ledger.freeze_account"),
            "ledger_depositrequest_approve": (VIEW_DEPOSIT_REQUEST, APPROVE_DEPOSIT),
            "ledger_depositrequest_reject": (VIEW_DEPOSIT_REQUEST, APPROVE_DEPOSIT),
            "webhooks_delivery_resend": (VIEW_DELIVERY, RESEND_DELIVERY),
            "payments_railstate_force_open": (VIEW_RAILSTATE, FORCE_BREAKER),
            "payments_railstate_force_closed": (VIEW_RAILSTATE, FORCE_BREAKER),
            "payments_railstate_clear_hold": (VIEW_RAILSTATE, FORCE_BREAKER),
        }.items()
    },
}


def holds(user, permission: str) -> bool:
    """Whether a role holds a permission: staff with it (superusers hold every one but NOBODY)."""
    return permission != NOBODY and user.is_staff and user.has_perm(permission)


# --- What the URL conf and the admin registry hold ------------------------------------------


@dataclass(frozen=True)
class Route:
    name: str  # namespaced: "admin:payments_scheduledpayment_cancel"
    path: str
    view: Callable


def routes(resolver: URLResolver | None = None, prefix: str = "", namespace: str = "") -> list[Route]:
    resolver = resolver or get_resolver()
    found = []
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            inner = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            found += routes(entry, prefix + str(entry.pattern), inner)
        elif isinstance(entry, URLPattern):
            found.append(Route(f"{namespace}{entry.name}" if entry.name else "", prefix + str(entry.pattern),
                               entry.callback))
    return found


def api_methods(view) -> list[str]:
    """The methods a view class answers (HEAD follows GET, Django serves it as GET)."""
    cls = view.view_class
    names = view.view_initkwargs.get("http_method_names", cls.http_method_names)
    methods = [m.upper() for m in names if m != "head" and hasattr(cls, m)]
    return methods + (["HEAD"] if "GET" in methods else [])


def django_admin_names() -> set[str]:
    """Django's own admin pages: the site's, and every ModelAdmin's standard five."""
    names = {f"admin:{p.name}" for p in admin.AdminSite.get_urls(admin.site) if isinstance(p, URLPattern) and p.name}
    for model_admin in admin.site._registry.values():
        names |= {f"admin:{p.name}" for p in admin.ModelAdmin.get_urls(model_admin) if p.name}
    return names


ROUTE = {route.name: route for route in routes()}  # "": the unnamed ones (Django's admin has a few)


def collected() -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[str], list[str]]:
    """(API (route, method) pairs, admin (model label, action) pairs, other named routes,
    unnamed routes outside the admin)."""
    api, others, unnamed = [], [], []
    standard = django_admin_names()
    for route in routes():
        if route.path.startswith("api/v1/"):
            api += [(route.name, method) for method in api_methods(route.view)]
        elif not route.name:
            unnamed += [] if route.path.startswith("admin/") else [route.path]
        elif route.name not in standard:
            others.append(route.name)
    actions = [
        (model._meta.label, name)
        for model, model_admin in admin.site._registry.items()
        for _, name, _ in model_admin._get_base_actions()
    ]
    return api, actions, others, unnamed


API_CASES, ACTION_CASES, ROUTE_CASES, UNNAMED_ROUTES = collected()


def test_every_route_and_action_is_declared():
    """A route, method or admin action nobody decided about fails here, by name."""
    undeclared = (
        [f"API {name} {method}" for name, method in API_CASES if (name, method.replace("HEAD", "GET")) not in API]
        + [f"admin action {label}.{name}" for label, name in ACTION_CASES if (label, name) not in ADMIN_ACTIONS]
        + [f"route {name}" for name in ROUTE_CASES if name not in ROUTES]
    )
    assert not undeclared, "declare what these need in tests/test_permission_matrix.py: " + ", ".join(undeclared)
    assert not UNNAMED_ROUTES, f"name these routes, so the matrix can declare them: {UNNAMED_ROUTES}"
    stale = (
        [f"API {key}" for key in API if key not in API_CASES]
        + [f"admin action {key}" for key in ADMIN_ACTIONS if key not in ACTION_CASES]
        + [f"route {name}" for name in ROUTES if name not in ROUTE_CASES]
    )
    assert not stale, "no longer in the URL conf or the admin: " + ", ".join(stale)


# What each shipped group may do beyond reading every table of the console.
GROUP_ACTS = {
    "auditor": set(),
    "support": {
        "payments.cancel_scheduledpayment",
        "payments.redrive_scheduledpayment",
        "payments.pause_recurringpayment",
        RESEND_DELIVERY,
        "ledger.freeze_account",
    },
    "treasury": {"ledger.deposit_account", APPROVE_DEPOSIT, FORCE_BREAKER},
}


def test_the_staff_groups_hold_what_the_roles_assume(world):
    """Every group reads every table of the console (payments and ledger) and does only
    its own acts: support freezes accounts (on call when fraud is reported); nobody but a
    superuser changes amounts."""

    def held(name):
        return {f"{p.content_type.app_label}.{p.codename}" for p in Group.objects.get(name=name).permissions.all()}

    console = [m for m in admin.site._registry if m._meta.app_label in ("payments", "ledger", "webhooks")]
    views = {f"{m._meta.app_label}.{get_permission_codename('view', m._meta)}" for m in console}
    views.add("webhooks.view_deliveryattempt")  # shown inline on a delivery's page
    assert set(STAFF_GROUPS) == set(GROUP_ACTS), "a new staff group: say what it may do in GROUP_ACTS"
    for name, acts in GROUP_ACTS.items():
        assert held(name) == views | acts, name


# --- The world -------------------------------------------------------------------------------


@dataclass
class World:
    """Everything here belongs to people who are none of the roles: ``owner`` (and the
    recipient), and a staff member who asked for a large deposit."""

    owner: object
    account: object  # the owner's, funded by a deposit
    funding: object  # that deposit's transfer
    target: object  # the recipient's account
    payment: object  # SCHEDULED, from account to target
    parked: object  # NEEDS_REVIEW, from account to target (attempts and events too)
    recurring: object  # ACTIVE, daily, from account to target
    deposit_request: object  # pending, above the approval threshold, into account
    endpoint: object  # the owner's webhook endpoint
    delivery: object  # a failed delivery of an event about payment to endpoint
    payee: object  # the owner's payee (sandbox rail)
    payout: object  # a payout to payee parked in NEEDS_REVIEW with its funds reserved
    rail_state: object  # the sandbox rail's breaker
    roles: dict  # role -> (its user or None, that user's own account or None)
    sessions: dict  # a role's user id -> the admin session cookie of that user, logged in
    caller: object = None  # the role's user (None: anonymous)
    own_account: object = None  # the caller's own account


def role_user(role: str):
    if role == "anonymous":
        return None
    if role == "superuser":
        return UserFactory(is_staff=True, is_superuser=True)
    user = UserFactory(is_staff=role != "user")
    if role in STAFF_GROUPS:
        user.groups.add(Group.objects.get(name=role))
    return user


def build_world() -> World:
    Account.objects.get_or_create(id=ISSUANCE_ACCOUNT_ID, defaults={"name": "Issuance", "kind": Account.Kind.SYSTEM})
    call_command("staff_groups", stdout=io.StringIO())
    owner, recipient, requester = UserFactory(), UserFactory(), UserFactory(is_staff=True)
    account, target = funded_account(owner=owner, balance=100), funded_account(owner=recipient)
    with override_settings(DELAYPAY_MAX_ATTEMPTS=1):
        # Due an hour ago: the claim judges on the database clock, which stands still in
        # the module's transaction.
        parked = parked_payment(SimpleNamespace(), source=account, target=target, seconds_ago=3600)
    rec = recurring_create(
        payer=owner, from_account_id=account.id, to_account_id=target.id, amount=2,
        start_at=timezone.now() + timedelta(days=1), interval="P1D",
    )
    large = django_settings.DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD + 1
    # A row in each table of the console's other admins, for their actions to select.
    AuthToken.objects.create(owner)
    login = {"username": owner.username, "ip_address": "192.0.2.1", "user_agent": "matrix", "http_accept": "*/*",
             "path_info": "/admin/login/"}
    AccessAttempt.objects.create(**login, get_data="", post_data="", failures_since_start=1)
    AccessFailureLog.objects.create(**login, locked_out=False)
    AccessLog.objects.create(**login)
    endpoint = endpoint_create(owner=owner, url="https://hooks.example.com/owner", events=["payment.executed"]).endpoint
    event = Event.objects.create(type="payment.executed", owner=owner, payment_id=parked.pk, version=1, snapshot={})
    delivery = Delivery.objects.create(event=event, endpoint=endpoint, status=DeliveryStatus.FAILED, attempts=1)
    # The sandbox rail's accounts and state come from a data migration (payments/0014).
    for role in ("clearing", "settlement"):
        Account.objects.get_or_create(id=f"acc_sandbox_{role}", defaults={"name": role, "kind": Account.Kind.SYSTEM})
    rail_state, _ = RailState.objects.get_or_create(rail="sandbox")
    # A month archived long ago (payments/partitions.py): its record, for the admin's page.
    ArchivedPartition.objects.create(month=date(2020, 1, 1), id_low="pay_01DX", id_high="pay_01E0", payments=0,
                                     executed_count=0, executed_amount=0, location="/archive", manifest={})
    payee = payee_for(owner)
    payout = reserved_payout(source=account, payee=payee, amount=3)
    roles = {}
    for role in ROLES:
        user = role_user(role)
        roles[role] = (user, AccountFactory(owner=user) if user else None)
    sessions = {}
    for user, _ in roles.values():
        if user is not None:  # logged in once here: a login per test was a fifth of the module's time
            client = Client()
            client.force_login(user)
            sessions[user.pk] = client.cookies[django_settings.SESSION_COOKIE_NAME].value
    return World(
        owner=owner,
        account=account,
        funding=Transfer.objects.get(credit_account=account),
        target=target,
        payment=future_payment(source=account, target=target, amount=5, minutes=60),
        parked=parked,
        recurring=rec,
        deposit_request=deposit_request_create(account_id=account.id, amount=large, actor=requester, reason="big"),
        endpoint=endpoint,
        delivery=delivery,
        payee=payee,
        payout=payout,
        rail_state=rail_state,
        roles=roles,
        sessions=sessions,
    )


@pytest.fixture(scope="module")
def shared_world(django_db_setup, django_db_blocker):
    """The world and a user per role, built once for the module (as Django's
    setUpTestData): inside a transaction rolled back after the module's last test. Each
    test runs in a savepoint of it, so what one test changes the next never sees."""
    ensure_system_rows(django_db_blocker)
    with django_db_blocker.unblock(), transaction.atomic():
        world = build_world()
        yield world
        transaction.set_rollback(True)


@pytest.fixture
def world(shared_world) -> World:
    return replace(shared_world)


def as_role(world: World, role: str) -> World:
    world.caller, world.own_account = world.roles[role]
    return world


# --- The API -------------------------------------------------------------------------------


PATH_TARGETS = {
    "account_id": "account", "payment_id": "payment", "recurring_id": "recurring", "request_id": "deposit_request",
    "endpoint_id": "endpoint", "delivery_id": "delivery", "payee_id": "payee",
}


def api_request(world: World, name: str, method: str, rule: Api):
    route = ROUTE[name]
    kwargs = {
        kwarg: getattr(world, rule.target or attr).pk for kwarg, attr in PATH_TARGETS.items() if f"<public_id:{kwarg}>"
        in route.path
    }
    url = reverse(name, kwargs=kwargs) + (f"?{urlencode(rule.query)}" if rule.query else "")
    body = rule.body(world) if callable(rule.body) else rule.body
    client = client_for(world.caller)
    if method in ("GET", "HEAD", "OPTIONS", "DELETE"):
        return client.generic(method, url)
    headers = {"HTTP_IDEMPOTENCY_KEY": uuid.uuid4().hex} if method == "POST" else {}
    data = b"" if body is None else json.dumps(body)
    return client.generic(method, url, data=data, content_type="application/json", **headers)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(("name", "method"), API_CASES, ids=[f"{m} {n}" for n, m in API_CASES])
def test_api(world, name, method, role):
    rule = API.get((name, method.replace("HEAD", "GET")))
    assert rule is not None, f"declare ({name!r}, {method!r}) in API"
    as_role(world, role)
    expected = rule.expected(world.caller)
    response = api_request(world, name, method, rule)
    assert response.status_code == expected, (role, response.status_code, response.content[:300])
    if rule.listing and expected == 200 and method == "GET":
        items = response.json()["items"]
        listed = {str(item[rule.listing.id_field]) for item in items}
        marker = str(getattr(world, rule.listing.marker).pk)
        assert (marker in listed) == holds(world.caller, rule.listing.permission), (role, listed)


# --- The admin -------------------------------------------------------------------------------


def admin_client(world: World) -> Client:
    """A browser logged in as the caller (anonymous: not logged in). The session was made
    with the world, so a test's logout is rolled back with the rest of the test."""
    client = Client()
    if world.caller:
        client.cookies[django_settings.SESSION_COOKIE_NAME] = world.sessions[world.caller.pk]
    return client


def first_row(world: World, model, target: str = ""):
    if target:
        return getattr(world, target)
    row = model._default_manager.order_by("pk").first()
    assert row is not None, f"the world has no {model._meta.label}: add one to the world fixture"
    return row


def assert_outcome(response, expected, role, ok=(200, 302, 303)):
    """``expected``: "login" (sent to the admin's login page), 403, or "ok" (a status in
    ``ok``, not the login page, and no action Django quietly refused)."""
    location = response.get("Location", "")
    if expected == "login":
        assert response.status_code == 302 and "/login/" in location, (role, response.status_code, location)
    elif expected == 403:
        assert response.status_code == 403, (role, response.status_code, location)
    else:
        assert response.status_code in ok, (role, response.status_code, response.content[:300])
        assert "/login/" not in location, (role, location)
        # Django's quiet refusals of an action: a redirect with one of these messages.
        quiet = ("No action selected", "Items must be selected")
        refused = [m.message for m in get_messages(response.wsgi_request) if m.message.startswith(quiet)]
        assert not refused, (role, refused)


@pytest.mark.console
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(("label", "action"), ACTION_CASES, ids=[f"{lab}.{a}" for lab, a in ACTION_CASES])
def test_admin_action(world, label, action, role):
    needs = ADMIN_ACTIONS.get((label, action))
    assert needs is not None, f"declare ({label!r}, {action!r}) in ADMIN_ACTIONS"
    as_role(world, role)
    model = next(m for m in admin.site._registry if m._meta.label == label)
    row = first_row(world, model, {"payments.ScheduledPayment": "payment"}.get(label, ""))
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    response = admin_client(world).post(
        url, {"action": action, helpers.ACTION_CHECKBOX_NAME: [str(row.pk)], "index": "0"}
    )
    assert_outcome(response, Admin(needs).expected(world.caller), role)


@pytest.mark.console
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("name", ROUTE_CASES)
def test_route(world, name, role):
    rule = ROUTES.get(name)
    assert rule is not None, f"declare {name!r} in ROUTES"
    as_role(world, role)
    route = ROUTE[name]
    args = []
    if "<path:object_id>" in route.path or "<id>" in route.path:
        model_admin = next(
            ma for ma in admin.site._registry.values() if name in {f"admin:{p.name}" for p in ma.get_urls()}
        )
        args = [quote(str(first_row(world, model_admin.model, rule.target).pk))]
    url = reverse(name, args=args)
    for method in rule.methods:
        response = admin_client(world).generic(method, url)
        assert_outcome(response, rule.expected(world.caller), role, ok=rule.ok)


@pytest.mark.console
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("label", sorted(m._meta.label for m in admin.site._registry))
def test_admin_changelist_needs_the_view_permission(world, label, role):
    """Django's own pages, under Django's rule: a model's list needs its view permission."""
    as_role(world, role)
    model = next(m for m in admin.site._registry if m._meta.label == label)
    opts = model._meta
    view = f"{opts.app_label}.{get_permission_codename('view', opts)}"
    response = admin_client(world).get(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))
    assert_outcome(response, Admin((view,)).expected(world.caller), role)


# --- A walkthrough of the console by each staff role (issue 36) -----------------------------
#
# Every page a staff role reaches from the front page: the index, the dashboard, the search,
# each registered model's list and its first row's page. None answers 5xx; a refusal is the
# console's own 403 page (its header, the missing permission); and no page shows a value
# staff should not have to decode: a time with microseconds, an ISO 8601 duration, a bare
# number of seven digits or more, a user's id where their name belongs.

RAW_VALUES = {
    "a time with microseconds": re.compile(r"\d{2}:\d{2}:\d{2}\.\d{3,6}"),
    "an ISO 8601 duration": re.compile(r"(?<![\w-])P(?:T\d+[HMS]|\d+[DWY])(?![\w-])"),
    # Seven digits or more: a quantity (an amount, a cap) reads with separators; an object's
    # id does not, and the world's ids (an event's, counted up by the whole run) stay below.
    "a number without thousands separators": re.compile(r"(?<![\w.,:/-])\d{7,}(?![\w.,:/-])"),
    "a user's id where their name belongs": re.compile(r"\bby \d+\b"),
}
STAFF_ROLES = [r for r in ROLES if r not in ("anonymous", "user")]


def visible_text(html: str) -> str:
    """What a person reads: no script, style, tags or attribute values; entities decoded."""
    html = re.sub(r"(?is)<(script|style|textarea)\b.*?</\1>", " ", html)
    return unescape(re.sub(r"(?s)<[^>]+>", " ", html))


def console_pages(world: World) -> list[str]:
    pages = [reverse("admin:index"), reverse("admin-dashboard"), reverse("admin-search") + f"?q={world.payment.pk}"]
    for model in admin.site._registry:
        opts = model._meta
        pages.append(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))
        row = model._default_manager.order_by("pk").first()
        if row is not None:
            pages.append(reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[quote(row.pk)]))
    return pages


@pytest.mark.console
@pytest.mark.parametrize("role", STAFF_ROLES)
def test_a_walkthrough_of_the_console_finds_no_error_and_no_raw_value(world, role):
    as_role(world, role)
    client = admin_client(world)
    found = []
    for url in console_pages(world):
        response = client.get(url)
        if response.status_code in (301, 302, 303):
            continue
        if response.status_code == 403:
            body = response.content.decode()
            if 'class="dp-refused"' not in body or 'id="dp-missing-permission"' not in body:
                found.append(f"{url}: a bare 403")
            continue
        if response.status_code != 200:
            found.append(f"{url}: {response.status_code}")
            continue
        text = visible_text(response.content.decode())
        for what, pattern in RAW_VALUES.items():
            for match in pattern.finditer(text):
                found.append(f"{url}: {what}: ...{text[max(0, match.start() - 40):match.end() + 20].strip()}...")
    assert not found, "\n".join(found)


# --- Who benefits: the caller as the beneficiary or the creator (issue 33) -------------------
#
# The tables above give every role objects that belong to someone else. Here the object is
# the caller's own: their account (a deposit into it, an approval of a deposit into it, its
# freeze), a payment they created, a payment into their account. Holding the act's
# permission does not let anyone do these alone: a deposit becomes a request (202,
# why own_account) and every other act is 403 conflict_of_interest; without the
# permission the ordinary rule answers. Nothing moves either way.

DEPOSIT_ACCOUNT, REDRIVE = "ledger.deposit_account", "payments.redrive_scheduledpayment"


def self_parked(world: World, *, relation: str):
    """A payment parked in review that the caller created (``creator``) or that pays
    into the caller's account (``beneficiary``)."""
    source = world.own_account if relation == "creator" else world.account
    target = world.target if relation == "creator" else world.own_account
    if relation == "creator":
        ledger_deposit_for_matrix(source, 10)
    with override_settings(DELAYPAY_MAX_ATTEMPTS=1):
        return parked_payment(SimpleNamespace(), source=source, target=target, seconds_ago=3600)


def ledger_deposit_for_matrix(account, amount: int) -> None:
    from common.ids import new_id
    from ledger.services import ledger_deposit

    ledger_deposit(key=new_id("dep"), account_id=account.id, amount=amount)


def status_of(payment) -> str:
    return type(payment).objects.get(pk=payment.pk).status


SELF_ROLES = [r for r in ROLES if r != "anonymous"]


@pytest.mark.parametrize("role", SELF_ROLES)
def test_a_deposit_into_ones_own_account_never_posts_alone(world, role):
    as_role(world, role)
    url = reverse("account-deposits", kwargs={"account_id": world.own_account.pk})
    response = client_for(world.caller).post(url, {"amount": 1, **REASON}, format="json",
                                             HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex)
    if holds(world.caller, DEPOSIT_ACCOUNT):
        assert response.status_code == 202 and response.json()["why"] == "own_account", response.content
    else:
        assert response.status_code == 403, response.content
    assert Account.objects.get(pk=world.own_account.pk).balance == 0


@pytest.mark.parametrize("role", SELF_ROLES)
def test_a_deposit_into_ones_own_account_is_never_approved_by_oneself(world, role):
    as_role(world, role)
    request = deposit_request_create(
        account_id=world.own_account.id, amount=django_settings.DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD + 1,
        actor=world.deposit_request.requested_by, reason="into the caller's account",
    )
    response = client_for(world.caller).post(
        reverse("deposit-request-approve", kwargs={"request_id": request.pk}), REASON, format="json",
        HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex,
    )
    expected_code = "conflict_of_interest" if holds(world.caller, APPROVE_DEPOSIT) else "permission_denied"
    assert (response.status_code, response.json()["code"]) == (403, expected_code), response.content
    assert Account.objects.get(pk=world.own_account.pk).balance == 0


@pytest.mark.parametrize("relation", ["creator", "beneficiary"])
@pytest.mark.parametrize("act", ["payment-redrive", "payment-resolve"])
@pytest.mark.parametrize("role", SELF_ROLES)
def test_a_party_to_a_payment_never_reviews_it(world, role, act, relation):
    as_role(world, role)
    parked = self_parked(world, relation=relation)
    body = {"outcome": "failed", **REASON} if act == "payment-resolve" else REASON
    response = client_for(world.caller).post(
        reverse(act, kwargs={"payment_id": parked.pk}), body, format="json", HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex
    )
    caller = world.caller
    if relation == "beneficiary" and not holds(caller, VIEW_PAYMENT):
        expected = (404, "not_found")  # someone else's payment, not readable
    elif holds(caller, REDRIVE):
        expected = (403, "conflict_of_interest")
    else:
        expected = (403, "permission_denied")
    assert (response.status_code, response.json()["code"]) == expected, response.content
    assert status_of(parked) == "NEEDS_REVIEW"


@pytest.mark.console
@pytest.mark.parametrize("action", ["freeze_selected", "unfreeze_selected"])
@pytest.mark.parametrize("role", SELF_ROLES)
def test_nobody_freezes_or_unfreezes_their_own_account(world, role, action):
    as_role(world, role)
    account = world.own_account
    if action == "unfreeze_selected":
        Account.objects.filter(pk=account.pk).update(status="frozen")
    before = Account.objects.get(pk=account.pk).status
    response = admin_client(world).post(
        reverse("admin:ledger_account_changelist"),
        {"action": action, helpers.ACTION_CHECKBOX_NAME: [account.pk], "index": "0", "reason": "mine",
         "confirmed": "1"},
        follow=True,
    )
    if holds(world.caller, "ledger.freeze_account"):
        assert any("your own account" in str(m) for m in response.context["messages"]), response.content[:300]
    assert Account.objects.get(pk=account.pk).status == before
