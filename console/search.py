"""The console-wide search (the box in every console page's header and on the front page):
a pasted id of any kind, or a username, opens that object's page.

* An id is known by its prefix (common/ids.py; each model's default id): ``pay_`` a
  payment, ``acc_`` an account, ``rec_`` a recurring payment, ``pye_`` a payee, ``whe_`` a
  webhook endpoint, ``dreq_`` a deposit request, ``evt_<number>`` a webhook event (its
  ``public_id``). Looked up by primary key, as pasted or with its ULID upper-cased.
* Anything else is a username (exact, any case): the user's page for staff who may view
  users, else the accounts that user owns.
* Nothing found that way: the accounts whose name holds the whole search as one phrase
  (ledger.selectors.search_phrase), at most MAX_NAME_MATCHES.

Only what the staff member may view counts: each model's admin decides
(``has_view_permission``), as on its own pages, and a match they may not view is dropped
before anything is said, so "nothing you may see" never tells whether it exists. One match
redirects to its page; several are listed; none says so. Several ids pasted at once (at most
MAX_TERMS, separated by spaces or commas) are looked up together: one query a kind."""

import re
from dataclasses import dataclass

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db.models import Q
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.html import format_html

from common.admin_tools import change_url
from common.formats import human
from ledger.models import Account, DepositRequest
from ledger.selectors import search_phrase
from payments.models import Payee, RecurringPayment, ScheduledPayment
from webhooks.models import Endpoint, Event

MAX_QUERY_LENGTH = 500
MAX_TERMS = 20
MAX_NAME_MATCHES = 20
TERM_SEPARATORS = re.compile(r"[\s,]+")
EVENT_PREFIX = "evt_"
EVENT_ID_DIGITS = 18  # a bigint holds every 18-digit number


@dataclass(frozen=True)
class IdKind:
    prefix: str
    model: type
    noun: str
    related: tuple[str, ...] = ()  # select_related for the row's description


# The public ids the product mints, by prefix (the models' id defaults; evt_ is Event.public_id).
ID_KINDS = (
    IdKind("pay_", ScheduledPayment, "payment", ("from_account__owner",)),
    IdKind("acc_", Account, "account", ("owner",)),
    IdKind("rec_", RecurringPayment, "recurring payment", ("from_account__owner",)),
    IdKind("pye_", Payee, "payee", ("owner",)),
    IdKind("whe_", Endpoint, "webhook endpoint", ("owner",)),
    IdKind("dreq_", DepositRequest, "deposit request", ("account__owner",)),
    IdKind(EVENT_PREFIX, Event, "webhook event", ("owner",)),
)


@dataclass(frozen=True)
class Match:
    noun: str  # what it is: "payment", "account", "user"
    label: str  # its id (or username)
    url: str  # its change page
    detail: str  # a line to tell several apart


def may_view(request, model) -> bool:
    """As the model's admin decides on its own pages (no admin: nobody may)."""
    model_admin = admin.site._registry.get(model)
    return model_admin is not None and model_admin.has_view_permission(request)


def search_terms(query: str) -> list[str]:
    return [t for t in TERM_SEPARATORS.split(query) if t][:MAX_TERMS]


def id_candidates(kind: IdKind, term: str) -> list:
    """The primary keys a pasted term may be: as pasted, and with its prefix lower-cased and
    its ULID upper-cased (``PAY_01jd...`` from a tool that changed its case); an event's number."""
    rest = term[len(kind.prefix):]
    if kind.prefix == EVENT_PREFIX:
        ok = rest.isascii() and rest.isdigit() and len(rest) <= EVENT_ID_DIGITS
        return [int(rest)] if ok else []
    return list(dict.fromkeys([term, kind.prefix + rest, kind.prefix + rest.upper()]))


def label_of(obj) -> str:
    return getattr(obj, "public_id", None) or str(obj.pk)


def describe(obj) -> str:
    """A line that tells one match from another (names, owners, states, amounts)."""
    if isinstance(obj, Account):
        return f"{obj.name} · {human(obj.owner)} · {obj.status} · balance {human(obj.balance)}"
    if isinstance(obj, ScheduledPayment | RecurringPayment):
        return f"{obj.status} · {human(obj.amount)} from {obj.from_account.name} · {human(obj.from_account.owner)}"
    if isinstance(obj, Payee):
        return f"{obj.name} · {human(obj.owner)} · {obj.rail}"
    if isinstance(obj, Endpoint):
        return f"{obj.url} · {human(obj.owner)}"
    if isinstance(obj, DepositRequest):
        return f"{obj.status} · {human(obj.amount)} into {obj.account.name} · {human(obj.account.owner)}"
    if isinstance(obj, Event):
        return f"{obj.type} · {human(obj.created_at)}"
    return str(obj)


def id_matches(request, terms: list[str]) -> tuple[list[Match], list[str]]:
    """The objects the id-shaped terms name (one query a kind the user may view), and the
    terms that have no id prefix."""
    by_kind: dict[IdKind, list] = {}
    others = []
    for term in terms:
        kind = next((k for k in ID_KINDS if term.lower().startswith(k.prefix)), None)
        if kind is None:
            others.append(term)
        else:
            by_kind.setdefault(kind, []).extend(id_candidates(kind, term))
    matches = []
    for kind, keys in by_kind.items():
        if not keys or not may_view(request, kind.model):
            continue
        rows = kind.model._default_manager.filter(pk__in=keys).select_related(*kind.related).order_by("pk")
        matches += [Match(kind.noun, label_of(obj), change_url(kind.model, obj.pk), describe(obj)) for obj in rows]
    return matches, others


def user_matches(request, names: list[str]) -> list[Match]:
    """Users by exact username (any case): their page for staff who may view users, else the
    accounts they own for staff who may view accounts."""
    if not names:
        return []
    user_model = get_user_model()
    by_name = Q()
    for name in names:
        by_name |= Q(username__iexact=name)
    if may_view(request, user_model):
        users = user_model.objects.filter(by_name).order_by("username")[:MAX_NAME_MATCHES]
        return [Match("user", u.get_username(), change_url(user_model, u.pk), u.get_full_name() or u.email or "")
                for u in users]
    if may_view(request, Account):
        accounts = Account.objects.filter(owner__in=user_model.objects.filter(by_name)).select_related("owner")
        return [Match("account", a.pk, change_url(Account, a.pk), describe(a))
                for a in accounts.order_by("owner__username", "pk")[:MAX_NAME_MATCHES]]
    return []


def account_name_matches(request, phrase: str) -> tuple[list[Match], bool]:
    """Accounts whose name holds the phrase (case-insensitive); True when more matched than shown."""
    if not may_view(request, Account):
        return [], False
    rows = list(
        Account.objects.filter(name__icontains=phrase).select_related("owner").order_by("name", "pk")[
            : MAX_NAME_MATCHES + 1
        ]
    )
    matches = [Match("account", a.pk, change_url(Account, a.pk), describe(a)) for a in rows[:MAX_NAME_MATCHES]]
    return matches, len(rows) > MAX_NAME_MATCHES


def console_search(request, query: str) -> tuple[list[Match], bool]:
    """What ``query`` names that the user may view (see the module's docstring), and whether
    more account names matched than are listed."""
    phrase = search_phrase(query[:MAX_QUERY_LENGTH])
    if not phrase:
        return [], False
    matches, others = id_matches(request, search_terms(phrase))
    matches += user_matches(request, others)
    more = False
    if not matches:
        matches, more = account_name_matches(request, phrase)
    unique = list({m.url: m for m in matches}.values())
    return unique, more


def search_view(request):
    """``/admin/search/?q=``: one match opens its page, several are listed, none says so.
    Any staff user may search; each sees only what they may view."""
    query = request.GET.get("q", "")
    matches, more = console_search(request, query)
    if len(matches) == 1:
        return HttpResponseRedirect(matches[0].url)
    shown = search_phrase(query[:MAX_QUERY_LENGTH])
    context = {
        **admin.site.each_context(request),
        "title": f"Search: {shown}" if shown else "Search",
        "query": shown,
        "matches": matches,
        "more": more,
        "max_name_matches": MAX_NAME_MATCHES,
        "prefixes": [format_html("<code>{}</code> {}", k.prefix, k.noun) for k in ID_KINDS],
    }
    return TemplateResponse(request, "admin/console_search.html", context)
