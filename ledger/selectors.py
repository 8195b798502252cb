"""Ledger reads, scoped to who may see what."""

from datetime import datetime

from django.db import connection
from django.db.models import Q, QuerySet

from . import sql
from .models import Account, Transfer


def account_visible_to(*, user) -> QuerySet[Account]:
    """Accounts a user may read: their own; staff see every account."""
    qs = Account.objects.all()
    return qs if user.is_staff else qs.filter(owner=user)


def transfers_for_account(*, account_id: str) -> QuerySet[Transfer]:
    """Every transfer that debits or credits the account."""
    return Transfer.objects.filter(Q(debit_account_id=account_id) | Q(credit_account_id=account_id))


def transfer_by_key(*, key: str) -> Transfer | None:
    """The transfer recorded under ``key`` (for a payment: its id), if any."""
    return Transfer.objects.filter(key=key).first()


def transfer_times(*, keys: list[str]) -> dict[str, datetime]:
    """When each of ``keys`` that has a transfer was posted (keys without one are absent).
    Read in the caller's transaction: under the caller's row locks, it is the answer to
    "did this money already move?"."""
    if not keys:
        return {}
    with connection.cursor() as cur:
        cur.execute(sql.TRANSFER_TIMES, [list(keys)])
        return dict(cur.fetchall())
