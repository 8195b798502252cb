"""Ledger writes. Every money movement goes through ``ledger_post_batch``.

The batch form exists for the executor (one transaction per batch of payments); the
single-transfer services are thin wrappers over it so that there is exactly one
implementation of the guard, the funds check and the balance update.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from django.db import connection, transaction

from common.ids import new_id

from . import sql
from .models import ISSUANCE_ACCOUNT_ID, Account
from .selectors import transfer_by_key


class Outcome(StrEnum):
    APPLIED = "applied"
    ALREADY_APPLIED = "already_applied"
    INSUFFICIENT_FUNDS = "insufficient_funds"
    ACCOUNT_FROZEN = "account_frozen"
    ACCOUNT_CLOSED = "account_closed"

    @property
    def moved(self) -> bool:
        """True when a transfer with this key exists after the call."""
        return self in (Outcome.APPLIED, Outcome.ALREADY_APPLIED)


@dataclass(frozen=True, slots=True)
class Posting:
    key: str
    debit_account_id: str
    credit_account_id: str
    amount: int


@dataclass(frozen=True, slots=True)
class PostResult:
    outcome: Outcome
    # When the money moved: this call's transaction time, or the original transfer's
    # time for an already-applied key. None when nothing moved.
    posted_at: datetime | None


class UnknownAccount(Exception):
    pass


class InvalidPosting(ValueError):
    pass


class AccountStateError(ValueError):
    pass


def _check_postings(postings: Sequence[Posting]) -> None:
    if not connection.in_atomic_block:
        raise RuntimeError("the ledger's batch services must run inside transaction.atomic()")
    for p in postings:
        if p.amount <= 0 or p.debit_account_id == p.credit_account_id:
            raise InvalidPosting(f"invalid posting {p!r}")


def _decide(cur, postings: Sequence[Posting], *, lock: bool):
    """Read the accounts (``FOR UPDATE`` in ascending id order when ``lock``) and the
    existing transfers, and decide every posting in order: the guard first, then account
    state and funds. Returns (results, balance deltas, transfers to insert)."""
    account_ids = sorted({p.debit_account_id for p in postings} | {p.credit_account_id for p in postings})
    keys = [p.key for p in postings]
    cur.execute(sql.LOCK_ACCOUNTS if lock else sql.READ_ACCOUNTS, [account_ids])
    accounts = {row[0]: {"kind": row[1], "status": row[2], "balance": row[3]} for row in cur.fetchall()}
    missing = set(account_ids) - accounts.keys()
    if missing:
        raise UnknownAccount(", ".join(sorted(missing)))

    cur.execute(sql.TRANSFER_TIMES, [keys])
    existing: dict[str, datetime] = dict(cur.fetchall())
    cur.execute(sql.DB_NOW)
    now = cur.fetchone()[0]

    results: dict[str, PostResult] = {}
    deltas: dict[str, int] = {}
    new_transfers: list[Posting] = []
    for p in postings:
        if p.key in existing:
            results[p.key] = PostResult(Outcome.ALREADY_APPLIED, existing[p.key])
            continue
        if p.key in results:  # the same key twice in one batch: the first one counts
            first = results[p.key]
            results[p.key] = (
                PostResult(Outcome.ALREADY_APPLIED, first.posted_at) if first.outcome.moved else first
            )
            continue
        debit, credit = accounts[p.debit_account_id], accounts[p.credit_account_id]
        if debit["status"] == Account.Status.CLOSED or credit["status"] == Account.Status.CLOSED:
            results[p.key] = PostResult(Outcome.ACCOUNT_CLOSED, None)
        elif debit["status"] == Account.Status.FROZEN:
            results[p.key] = PostResult(Outcome.ACCOUNT_FROZEN, None)
        elif debit["kind"] == Account.Kind.USER and debit["balance"] < p.amount:
            results[p.key] = PostResult(Outcome.INSUFFICIENT_FUNDS, None)
        else:
            debit["balance"] -= p.amount
            credit["balance"] += p.amount
            deltas[p.debit_account_id] = deltas.get(p.debit_account_id, 0) - p.amount
            deltas[p.credit_account_id] = deltas.get(p.credit_account_id, 0) + p.amount
            new_transfers.append(p)
            results[p.key] = PostResult(Outcome.APPLIED, now)
    return results, deltas, new_transfers


def ledger_preview_batch(*, postings: Sequence[Posting]) -> dict[str, PostResult]:
    """What ``ledger_post_batch`` would decide now, from reads that take no lock; writes
    nothing. A forecast only: the decision that counts is the one made under the locks.

    It lets a caller do its own writes before the account locks are taken, then
    compare the forecast with ``ledger_post_batch``'s result and roll back on any
    difference (the executor: see payments/execution.py).
    """
    _check_postings(postings)
    if not postings:
        return {}
    with connection.cursor() as cur:
        return _decide(cur, postings, lock=False)[0]


def ledger_post_batch(*, postings: Sequence[Posting]) -> dict[str, PostResult]:
    """Apply postings in the given order inside the caller's transaction.

    Idempotent on ``key``: a key that already has a transfer is reported
    ``ALREADY_APPLIED`` and moves nothing, before any funds check (a retry after a
    crash must never turn moved money into a failure). Every other posting gets its
    own status and funds check against balances locked ``FOR UPDATE`` in ascending
    id order, so concurrent batches cannot deadlock on accounts.
    """
    _check_postings(postings)
    if not postings:
        return {}

    with connection.cursor() as cur:
        results, deltas, new_transfers = _decide(cur, postings, lock=True)
        if new_transfers:
            # Set-based writes: one INSERT and one UPDATE for the whole batch.
            cur.execute(
                sql.INSERT_TRANSFERS,
                [
                    [p.key for p in new_transfers],
                    [p.debit_account_id for p in new_transfers],
                    [p.credit_account_id for p in new_transfers],
                    [p.amount for p in new_transfers],
                ],
            )
            changed = sorted(a for a, d in deltas.items() if d)
            cur.execute(sql.APPLY_BALANCE_DELTAS, [changed, [deltas[a] for a in changed]])
    return results


def ledger_transfer(*, key: str, debit_account_id: str, credit_account_id: str, amount: int) -> PostResult:
    """Move ``amount`` once per ``key``; a repeated key moves nothing (``ALREADY_APPLIED``)."""
    with transaction.atomic():
        return ledger_post_batch(
            postings=[Posting(key, debit_account_id, credit_account_id, amount)],
        )[key]


def ledger_deposit(*, key: str, account_id: str, amount: int) -> PostResult:
    """Credit a user account from the issuance account: how money enters the system."""
    return ledger_transfer(
        key=key, debit_account_id=ISSUANCE_ACCOUNT_ID, credit_account_id=account_id, amount=amount
    )


class DepositRefused(Exception):
    """A deposit the ledger will not make: into a system account, or one the ledger
    refuses (``reason`` is then the ledger's outcome, e.g. ``account_closed``)."""

    code = "deposit_rejected"

    def __init__(self, detail: str, *, reason: str):
        super().__init__(detail)
        self.detail = detail
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Deposit:
    key: str
    account_id: str
    amount: int
    balance: int  # the account's balance right after the deposit, in its transaction
    posted_at: datetime
    replayed: bool  # the key had already moved this money: nothing moved this time


def account_deposit_check(*, account: Account) -> None:
    """Refuse a deposit that can never succeed, before any work: money enters user
    accounts only. ``account_deposit`` checks it again at the moment of action."""
    if account.kind != Account.Kind.USER:
        raise DepositRefused("Deposits go to user accounts only.", reason="not_a_user_account")


def account_deposit(*, account_id: str, amount: int, key: str | None = None) -> Deposit:
    """Credit a user account from the issuance account, once per ``key`` (a new ``dep_``
    key when none is given): the one deposit service of the API and the admin.

    A key that already moved money moves nothing more and returns that earlier deposit
    (``replayed``). Raises ``DepositRefused`` for a system account or when the ledger
    refuses (a closed account)."""
    key = key or new_id("dep")
    with transaction.atomic():
        account = Account.objects.filter(pk=account_id).first()
        if account is None:
            raise UnknownAccount(account_id)
        account_deposit_check(account=account)
        result = ledger_deposit(key=key, account_id=account_id, amount=amount)
        if result.outcome == Outcome.ALREADY_APPLIED:
            earlier = transfer_by_key(key=key)
            account_id, amount = earlier.credit_account_id, earlier.amount
        elif result.outcome != Outcome.APPLIED:
            raise DepositRefused(f"The deposit was rejected: {result.outcome.value}.", reason=result.outcome.value)
        balance = Account.objects.values_list("balance", flat=True).get(pk=account_id)
    return Deposit(
        key=key,
        account_id=account_id,
        amount=amount,
        balance=balance,
        posted_at=result.posted_at,
        replayed=result.outcome == Outcome.ALREADY_APPLIED,
    )


def account_create(*, owner, name: str) -> Account:
    """Open an empty user account owned by ``owner``."""
    return Account.objects.create(owner=owner, name=name, kind=Account.Kind.USER)


def account_set_status(*, account_id: str, status: str) -> Account:
    """Freeze, unfreeze or close an account. Closing is final."""
    with transaction.atomic():
        account = Account.objects.select_for_update().get(pk=account_id)
        if account.status == Account.Status.CLOSED and status != Account.Status.CLOSED:
            raise AccountStateError("a closed account cannot be reopened")
        if account.status != status:
            Account.objects.filter(pk=account_id).update(status=status)
            account.refresh_from_db()
        return account
