"""Cells, badges and links the console's lists and pages share, and the admin search's terms."""

import re
from datetime import datetime

from django.contrib.auth import get_user_model
from django.db.models import BigIntegerField, Case, OuterRef, Q, Subquery, When
from django.db.models.functions import Cast, Substr
from django.utils.html import format_html

from common.admin_tools import (
    badge,
    change_url,
)
from common.formats import human
from console.admin_rails import breaker_badge, payee_cell
from ledger.models import Account
from payments.models import (
    BreakerState,
    PaymentStatus,
    Payout,
    PayoutState,
    RecurringStatus,
    ScheduledPayment,
)
from payments.reasons import failure_reason, review_reason
from payments.selectors import (
    payments_matching,
)

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

# More search terms than this are ignored (each is an exact id, or a username or account
# name prefix); the list says how many were taken.
MAX_SEARCH_TERMS = 50
# A name prefix ("a") may match many accounts: the search takes at most this many.
MAX_PREFIX_ACCOUNTS = 200
SEARCH_SEPARATORS = re.compile(r"[\s,]+")


def status_badge(status: str):
    return badge(status, STATUS_TONES.get(status, "grey"))


def admin_link(obj, text=None):
    """A link to ``obj``'s admin change page (ids as the API shows them)."""
    return format_html('<a href="{}">{}</a>', change_url(type(obj), obj.pk), text if text is not None else obj.pk)


def payment_link(payment_id: str):
    url = change_url(ScheduledPayment, payment_id)
    return format_html('<a href="{}">{}</a>', url, payment_id)


def account_cell(account):
    """The account's owner, linked to the account (its id on hover): the confirmation
    pages stay narrow; the list and the detail page name the account too (party_cell)."""
    owner = account.owner.username if account.owner_id else account.name
    url = change_url(Account, account.pk)
    return format_html('<a href="{}" title="{}">{}</a>', url, account.pk, owner)


def party_cell(account):
    """Which of its owner's accounts: the account's name linked to it, the owner after it
    ("Savings · alice"); a system account has no owner."""
    url = change_url(Account, account.pk)
    if not account.owner_id:
        return format_html('<a href="{}" title="{}">{}</a>', url, account.pk, account.name)
    return format_html(
        '<a href="{}" title="{}">{}</a> <span class="dp-quiet">· {}</span>',
        url, account.pk, account.name, account.owner.username,
    )


def to_cell(obj):
    """Whom a payment (or recurring payment) pays: an account, or a payee through its rail."""
    return party_cell(obj.to_account) if obj.to_payee_id is None else payee_cell(obj.to_payee)


def to_detail(obj):
    """The detail page's "to": the account with its id, or the payee with its rail and destination."""
    if obj.to_payee_id is None:
        return format_html("{} <span class=\"dp-mono\">{}</span>", party_cell(obj.to_account), obj.to_account_id)
    return format_html("payout: {} <span class=\"dp-mono\">{}</span>", payee_cell(obj.to_payee), obj.to_payee_id)


def from_detail(obj):
    return format_html("{} <span class=\"dp-mono\">{}</span>", party_cell(obj.from_account), obj.from_account_id)


def search_terms(search_term: str) -> tuple[list[str], int]:
    """The terms of a search (separated by spaces or commas, as pasted from a sheet), at
    most MAX_SEARCH_TERMS of them, and how many were given."""
    terms = [t for t in SEARCH_SEPARATORS.split(search_term.strip()) if t]
    return terms[:MAX_SEARCH_TERMS], len(terms)


def accounts_by_prefix(terms: list[str], phrase: str = "") -> tuple[list[str], bool]:
    """Ids of the accounts a search names: by id, by a prefix of the owner's username (the
    unique index on auth_user.username, varchar_pattern_ops copy, serves LIKE 'x%'), or
    by the whole search as one phrase in the account's name ("holiday fund": not each word
    on its own; no index: a read of the accounts table, bounded by MAX_PREFIX_ACCOUNTS
    rows, never of the payments). True when more matched than taken."""
    if not terms:
        return [], False
    by_name = Q(name__icontains=phrase) if phrase else Q()
    for term in terms:
        by_name |= Q(owner__username__startswith=term)
    exact = list(Account.objects.filter(pk__in=terms).values_list("pk", flat=True))
    prefixed = list(
        Account.objects.filter(by_name).order_by().values_list("pk", flat=True)[: MAX_PREFIX_ACCOUNTS + 1]
    )
    more = len(prefixed) > MAX_PREFIX_ACCOUNTS
    return sorted({*exact, *prefixed[:MAX_PREFIX_ACCOUNTS]}), more


def payment_admin_search_condition(*, terms: list[str], phrase: str = "") -> tuple[Q, bool]:
    """What the payment list's search matches (any term): a payment id, a recurring id
    (its occurrences), an account id, a prefix of an account owner's username, or the whole
    search as a phrase in an account's name, either side. Accounts are resolved first so the
    payments are read through the lookup table's account indexes; ids through its primary
    key, occurrences through payments_recurring_idx (selectors.payments_matching)."""
    account_ids, more = accounts_by_prefix(terms, phrase)
    condition = payments_matching(ids=terms, account_ids=account_ids,
                                  recurring_ids=[t for t in terms if t.startswith("rec_")])
    return condition, more


def reserved_payout_ids(payment_ids) -> set[str]:
    """Which of these payments are payouts whose funds are reserved at their rail."""
    return set(
        Payout.objects.filter(payment_id__in=payment_ids, state=PayoutState.PENDING).values_list("pk", flat=True)
    )


# --- the review queue: why a payment waits for staff, and the state of its rail ----------

# --- an event's data, as staff read it ------------------------------------------------------

# Event data whose values are reason codes: shown with their sentence (payments/reasons.py).
CODED_EVENT_DATA = {"failure_reason": failure_reason, "review_reason": review_reason}


def data_value(key: str, value) -> str:
    """One value of an event's data: a reason with its sentence, an ISO time (the events
    store them with microseconds) as a time, a nested record's values likewise."""
    if key in CODED_EVENT_DATA and isinstance(value, str) and value:
        return human(CODED_EVENT_DATA[key](value))
    if isinstance(value, dict):
        return f"({data_text(value, separator=', ')})"
    if isinstance(value, list):
        return ", ".join(data_value(key, item) for item in value) or "none"
    if isinstance(value, str) and len(value) >= 19 and value[4:5] == "-" and value[10:11] == "T":
        try:
            return human(datetime.fromisoformat(value))
        except ValueError:
            return value
    return human(value)


def data_text(data: dict, *, separator: str = "; ") -> str:
    """An event's data (payment and recurring events) as "key: value" pairs staff read."""
    return separator.join(f"{key}: {data_value(key, value)}" for key, value in data.items())


# --- who did it: "user:<id>" actors as usernames ---------------------------------------------

# How the audit tables name a user who acted (payments.services: "user:<id>"); other actors
# (promoter, worker:<name>, system) are names already.
USER_ACTOR = re.compile(r"^user:([0-9]{1,18})$")


def actor_usernames(actors) -> dict[str, str]:
    """"user:<id>" -> the username, for every such actor given: one query, whatever the count."""
    ids = {int(match[1]) for actor in actors if (match := USER_ACTOR.match(actor or ""))}
    if not ids:
        return {}
    names = get_user_model().objects.filter(pk__in=ids).values_list("pk", "username")
    return {f"user:{pk}": username for pk, username in names}


def with_actor_username(queryset):
    """``queryset`` (of a table with an ``actor`` column) with ``actor_username``: the
    username of a "user:<id>" actor, from one primary-key lookup per row of the page."""
    user_id = Cast(Substr(OuterRef("actor"), len("user:") + 1), BigIntegerField())
    username = get_user_model().objects.filter(pk=user_id).values("username")[:1]
    return queryset.annotate(actor_username=Case(When(actor__regex=USER_ACTOR.pattern, then=Subquery(username))))


def actor_text(obj) -> str:
    """Who acted, as staff read it: a username (never "user:4"), or the process's name."""
    return getattr(obj, "actor_username", None) or obj.actor


def review_reason_text(code: str) -> str:
    """A review reason as staff read it: its sentence, then the code (payments/reasons.py)."""
    return human(review_reason(code))


def failure_reason_text(code: str) -> str:
    """A failure reason as staff read it: its sentence, then the code (payments/reasons.py)."""
    return human(failure_reason(code))


# What an open or half-open breaker means for a payout sent to its rail now.
BREAKER_CONSEQUENCE = {
    BreakerState.OPEN: "its payouts are not claimed while it is open: a re-driven one waits",
    BreakerState.HALF_OPEN: "a few probe payouts at a time until it closes",
}


def rail_cell(rail: str, *, breaker: str | None, forced: str = ""):
    """A payout's rail and what its breaker says now (an internal transfer has no rail)."""
    if not rail:
        return "-"
    if breaker is None:  # no state recorded for the rail yet: its breaker starts closed
        breaker = BreakerState.CLOSED
    consequence = BREAKER_CONSEQUENCE.get(forced or breaker, "")
    return format_html(
        '{} {}{}', rail, breaker_badge(breaker=breaker, forced=forced),
        format_html(' <span class="dp-quiet">{}</span>', consequence) if consequence else "",
    )
