"""Ledger reads, scoped to who may see what."""

from datetime import datetime

from django.db.models import Q, QuerySet

from common.authz import staff_may_view
from common.db import bound_cursor

from . import sql
from .models import Account, DepositRequest, StaffAction, Transfer


def account_visible_to(*, user) -> QuerySet[Account]:
    """Accounts a user may read: their own; every account for staff with
    ``ledger.view_account`` (common/authz.py)."""
    qs = Account.objects.all()
    return qs if staff_may_view(user, Account) else qs.filter(owner=user)


# Quotes around a search ("holiday fund") only say that it is one phrase.
PHRASE_QUOTES = "\"'\u201c\u201d\u2018\u2019"


def search_phrase(search_term: str) -> str:
    """The whole search as one phrase: the quotes around it dropped, runs of white space
    folded to one space, NUL characters (which PostgreSQL text cannot hold) removed."""
    return " ".join(search_term.replace("\x00", "").strip().strip(PHRASE_QUOTES).split())


def account_search_condition(*, terms: list[str], phrase: str) -> Q:
    """The accounts a console search names: one whose id, or whose owner's username, is
    exactly one of ``terms`` (ids pasted from a sheet, several at once), or whose name holds
    the whole ``phrase``, case-insensitively: "holiday fund" finds "Holiday fund 2026" and
    "Our holiday fund", never "fund for the holiday" (the words are not searched one by one)."""
    condition = Q(pk__in=terms) | Q(owner__username__in=terms)
    if phrase:
        condition |= Q(name__icontains=phrase)
    return condition


def transfer_visible_to(*, user) -> QuerySet[Transfer]:
    """Transfers a user may read: those debiting or crediting an account they own; every
    transfer for staff with ``ledger.view_transfer``."""
    qs = Transfer.objects.all()
    if staff_may_view(user, Transfer):
        return qs
    return qs.filter(Q(debit_account__owner=user) | Q(credit_account__owner=user))


def transfers_for_account(*, account_id: str) -> QuerySet[Transfer]:
    """Every transfer that debits or credits the account."""
    return Transfer.objects.filter(Q(debit_account_id=account_id) | Q(credit_account_id=account_id))


def transfer_list_for_account(*, user, account: Account) -> QuerySet[Transfer]:
    """The transfers of ``account`` that ``user`` may read: every one when the account is
    theirs (no join on owners then), else those transfer_visible_to allows. Unordered."""
    transfers = transfers_for_account(account_id=account.id)
    return transfers if account.owner_id == user.id else transfers & transfer_visible_to(user=user)


def transfer_by_key(*, key: str) -> Transfer | None:
    """The transfer recorded under ``key`` (for a payment: its id), if any."""
    return Transfer.objects.filter(key=key).first()


def transfer_times(*, keys: list[str]) -> dict[str, datetime]:
    """When each of ``keys`` that has a transfer was posted (keys without one are absent).
    Read in the caller's transaction: under the caller's row locks, it is the answer to
    "did this money already move?"."""
    if not keys:
        return {}
    with bound_cursor() as cur:
        cur.execute(sql.TRANSFER_TIMES, [list(keys)])
        return dict(cur.fetchall())


def deposit_requests(*, status: str | None = None, account_id: str | None = None) -> QuerySet[DepositRequest]:
    """Deposit requests, optionally in one status or for one account (staff reads:
    the callers check ``ledger.view_depositrequest``). Unordered: the caller orders."""
    qs = DepositRequest.objects.select_related("requested_by", "decided_by", "beneficiary")
    if status:
        qs = qs.filter(status=status)
    return qs.filter(account_id=account_id) if account_id else qs


def deposit_request_get(*, request_id: str) -> DepositRequest | None:
    return deposit_requests().filter(pk=request_id).first()


def staff_actions_for_account(*, account_id: str) -> QuerySet[StaffAction]:
    """Who did what to the account and why, oldest first."""
    return StaffAction.objects.filter(account_id=account_id).select_related("actor").order_by("id")
