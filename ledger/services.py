"""Ledger writes. Every money movement goes through ``ledger_post_batch``.

The batch form exists for the executor (one transaction per batch of payments); the
single-transfer services are thin wrappers over it so that there is exactly one
implementation of the guard, the funds check and the balance update.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Sum
from django.db.models.functions import Now

from common.authz import ConflictOfInterest
from common.db import bound_cursor, database_now
from common.ids import new_id

from . import sql
from .models import ISSUANCE_ACCOUNT_ID, Account, DepositFormToken, DepositRequest, PendingTransfer, StaffAction
from .selectors import transfer_by_key, transfer_times


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


_CLOSED, _FROZEN, _USER = Account.Status.CLOSED.value, Account.Status.FROZEN.value, Account.Kind.USER.value


# The refusals, immutable and the same for every posting refused so.
_REFUSED_CLOSED = PostResult(Outcome.ACCOUNT_CLOSED, None)
_REFUSED_FROZEN = PostResult(Outcome.ACCOUNT_FROZEN, None)
_REFUSED_FUNDS = PostResult(Outcome.INSUFFICIENT_FUNDS, None)


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
    rows = cur.fetchall()
    # Each account's state as plain values, compared once here rather than against the
    # choices' enum members once per posting (py-spy of the executor: a fifth of its
    # Python time went to those comparisons in batches of 1,000). ``balance`` follows the
    # postings decided so far.
    balance = {row[0]: row[3] for row in rows}
    closed = {row[0] for row in rows if row[2] == _CLOSED}
    frozen = {row[0] for row in rows if row[2] == _FROZEN}
    may_go_negative = {row[0] for row in rows if row[1] != _USER}  # system accounts
    missing = set(account_ids) - balance.keys()
    if missing:
        raise UnknownAccount(", ".join(sorted(missing)))

    cur.execute(sql.TRANSFER_TIMES, [keys])
    existing: dict[str, datetime] = dict(cur.fetchall())
    now = database_now(cur)

    results: dict[str, PostResult] = {}
    applied = PostResult(Outcome.APPLIED, now)  # immutable: one instance for the batch
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
        debit, credit, amount = p.debit_account_id, p.credit_account_id, p.amount
        if debit in closed or credit in closed:
            results[p.key] = _REFUSED_CLOSED
        elif debit in frozen:
            results[p.key] = _REFUSED_FROZEN
        elif balance[debit] < amount and debit not in may_go_negative:
            results[p.key] = _REFUSED_FUNDS
        else:
            balance[debit] -= amount
            balance[credit] += amount
            deltas[debit] = deltas.get(debit, 0) - amount
            deltas[credit] = deltas.get(credit, 0) + amount
            new_transfers.append(p)
            results[p.key] = applied
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
    with bound_cursor() as cur:
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

    with bound_cursor() as cur:
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


def _deposit_post(*, account_id: str, amount: int, key: str) -> Deposit:
    """Credit ``account_id`` under ``key`` inside the caller's transaction (the guard,
    the checks and the posting of ``ledger_post_batch``)."""
    account = Account.objects.filter(pk=account_id).first()
    if account is None:
        raise UnknownAccount(account_id)
    account_deposit_check(account=account)
    result = ledger_post_batch(postings=[Posting(key, ISSUANCE_ACCOUNT_ID, account_id, amount)])[key]
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


def account_deposit(*, account_id: str, amount: int, actor, reason: str, key: str | None = None) -> Deposit:
    """Credit a user account from the issuance account at once, once per ``key`` (a new
    ``dep_`` key when none is given), with a ``deposit`` staff action naming ``actor`` and
    ``reason`` in the same transaction. Only when no second person is needed
    (``deposit_approval_why``): otherwise ``DepositNeedsApproval``, and
    ``deposit_request_create`` is the way.

    A key that already moved money moves nothing more and returns that earlier deposit
    (``replayed``, no second staff action). Raises ``DepositRefused`` for a system
    account or when the ledger refuses (a closed account)."""
    reason = clean_reason(reason)
    key = key or new_id("dep")
    with transaction.atomic():
        account = _deposit_account(account_id)
        why = _deposit_governed(account=account, amount=amount, actor=actor, key=key)
        if why is not None:
            raise DepositNeedsApproval(amount, why)
        return _deposit_at_once(account_id=account_id, amount=amount, actor=actor, reason=reason, key=key)


def _deposit_at_once(*, account_id: str, amount: int, actor, reason: str, key: str) -> Deposit:
    """The posting and its ``deposit`` staff action, in the caller's transaction, once the
    four-eyes rule has let it through (or it is a replay of ``key``)."""
    deposit = _deposit_post(account_id=account_id, amount=amount, key=key)
    if not deposit.replayed:
        staff_action_record(
            actor=actor, action=StaffAction.Kind.DEPOSIT, reason=reason, account_id=account_id,
            transfer_key=key, amount=amount,
        )
    return deposit


def _deposit_account(account_id: str) -> Account:
    """The account a deposit goes into: it exists and is a user account."""
    account = Account.objects.filter(pk=account_id).first()
    if account is None:
        raise UnknownAccount(account_id)
    account_deposit_check(account=account)
    return account


def account_create(*, owner, name: str) -> Account:
    """Open an empty user account owned by ``owner``."""
    return Account.objects.create(owner=owner, name=name, kind=Account.Kind.USER)


def account_set_status(*, account_id: str, status: str) -> Account:
    """Freeze, unfreeze or close an account. Closing is final."""
    with transaction.atomic():
        account = Account.objects.select_for_update(no_key=True).get(pk=account_id)
        if account.status == Account.Status.CLOSED and status != Account.Status.CLOSED:
            raise AccountStateError("a closed account cannot be reopened")
        if account.status != status:
            Account.objects.filter(pk=account_id).update(status=status)
            account.refresh_from_db()
        return account


@dataclass(frozen=True, slots=True)
class StatusChange:
    account: Account
    changed_now: bool  # False: it already had that status


def account_freeze(*, account_id: str, frozen: bool, actor, reason: str) -> StatusChange:
    """A staff member freezes (``frozen``) or unfreezes a user account, with a ``freeze``
    or ``unfreeze`` staff action in the same transaction. Raises ``AccountStateError`` for
    a system or closed account, ``UnknownAccount`` for none, ``ConflictOfInterest`` for
    the account's owner."""
    reason = clean_reason(reason)
    status = Account.Status.FROZEN if frozen else Account.Status.ACTIVE
    with transaction.atomic():
        before = (
            Account.objects.select_for_update(no_key=True).filter(pk=account_id)
            .values_list("kind", "status", "owner_id").first()
        )
        if before is None:
            raise UnknownAccount(account_id)
        if before[0] != Account.Kind.USER:
            raise AccountStateError("a system account is never frozen")
        if before[2] == actor.pk:
            raise ConflictOfInterest("You own this account: another staff member must freeze or unfreeze it.")
        account = account_set_status(account_id=account_id, status=status)
        changed = before[1] != status
        if changed:
            staff_action_record(
                actor=actor, action=StaffAction.Kind.FREEZE if frozen else StaffAction.Kind.UNFREEZE,
                reason=reason, account_id=account_id,
            )
    return StatusChange(account, changed_now=changed)


# --- Staff actions: an author and a reason for every staff act on money -----------------

MAX_REASON = 500


class ReasonRequired(ValueError):
    """A staff act without a usable reason (the API: 400 validation_error on ``reason``)."""

    code = "validation_error"

    def __init__(self, message: str):
        super().__init__(message)
        self.detail = "Invalid input."
        self.extra = {"fields": {"reason": [message]}}


def clean_reason(reason) -> str:
    """The reason of a staff act, stripped: required, at most ``MAX_REASON`` characters."""
    if not isinstance(reason, str) or not reason.strip():
        raise ReasonRequired("Say why: the reason is recorded with your user.")
    if len(reason.strip()) > MAX_REASON:
        raise ReasonRequired(f"At most {MAX_REASON} characters.")
    return reason.strip()


def staff_action_record(
    *,
    actor,
    action: str,
    reason: str,
    account_id: str | None = None,
    payment_id: str = "",
    deposit_request_id: str | None = None,
    transfer_key: str = "",
    amount: int | None = None,
) -> StaffAction:
    """Record who did ``action`` and why, inside the act's own transaction: the act and
    its record commit together or not at all."""
    if not connection.in_atomic_block:
        raise RuntimeError("a staff action is recorded inside the transaction of the act")
    return StaffAction.objects.create(
        actor=actor, action=action, reason=clean_reason(reason), account_id=account_id, payment_id=payment_id,
        deposit_request_id=deposit_request_id, transfer_key=transfer_key, amount=amount,
    )


# --- Four eyes: deposits above the threshold are requested, then approved by another ------


class DepositNeedsApproval(ValueError):
    """``account_deposit`` of a deposit that needs a second person: request it instead."""

    def __init__(self, amount: int, why: str = DepositRequest.Why.ABOVE_THRESHOLD):
        super().__init__(
            f"A deposit of {amount} needs another staff member's approval: {DepositRequest.Why(why).label}"
            f" (DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD {settings.DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD},"
            f" over DELAYPAY_DEPOSIT_APPROVAL_WINDOW_HOURS {settings.DELAYPAY_DEPOSIT_APPROVAL_WINDOW_HOURS})."
        )
        self.why = why


class DepositRequestNotFound(Exception):
    code = "not_found"

    def __init__(self):
        super().__init__("No such deposit request.")
        self.detail = "No such deposit request."


class SelfApprovalForbidden(Exception):
    """Four eyes: whoever requested a deposit may not approve or reject it."""

    code = "self_approval_forbidden"

    def __init__(self):
        super().__init__("You requested this deposit: another staff member must approve or reject it.")
        self.detail = str(self)


class DepositRequestNotPending(Exception):
    """Approve of a rejected request, or reject of an approved one."""

    code = "deposit_request_not_pending"

    def __init__(self, status: str):
        super().__init__(f"The deposit request is {status}.")
        self.detail = str(self)
        self.status = status
        self.extra = {"status": status}


def deposit_needs_approval(*, amount: int) -> bool:
    """Whether a deposit of ``amount`` needs a second staff member whoever makes it (the
    rest of the rule, who and how much this window, is ``deposit_approval_why``)."""
    return amount > settings.DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD


# The advisory lock namespaces of LOCK_DEPOSIT_GOVERNANCE: the bytes "dep1" and "dep2" as int4.
DEPOSIT_LOCK_ACTOR = int.from_bytes(b"dep1", "big")
DEPOSIT_LOCK_BENEFICIARY = int.from_bytes(b"dep2", "big")


def deposit_window() -> timedelta:
    """How far back the approver-less deposits are summed (DELAYPAY_DEPOSIT_APPROVAL_WINDOW_HOURS)."""
    return timedelta(hours=settings.DELAYPAY_DEPOSIT_APPROVAL_WINDOW_HOURS)


def deposit_approval_why(*, account: Account, amount: int, actor) -> str | None:
    """Why a deposit of ``amount`` into ``account`` by ``actor`` needs a second person
    (a ``DepositRequest.Why``), or None when it may post at once. Four eyes whenever the
    actor, or the account's owner, would get past the threshold alone:

    * the amount is above DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD;
    * the actor owns the account (nobody deposits into their own account alone);
    * the actor's deposits made without a second person in the last
      DELAYPAY_DEPOSIT_APPROVAL_WINDOW_HOURS, plus this one, pass the threshold;
    * so do the approver-less deposits into any account of the same owner, by anyone.

    Read under the locks of ``_deposit_governed`` (else two deposits racing could each see
    the sums without the other)."""
    if deposit_needs_approval(amount=amount):
        return DepositRequest.Why.ABOVE_THRESHOLD
    if account.owner_id == actor.pk:
        return DepositRequest.Why.OWN_ACCOUNT
    threshold = settings.DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD
    direct = StaffAction.objects.filter(action=StaffAction.Kind.DEPOSIT, created_at__gt=Now() - deposit_window())
    if (direct.filter(actor=actor).aggregate(n=Sum("amount"))["n"] or 0) + amount > threshold:
        return DepositRequest.Why.ACTOR_WINDOW
    into = direct.filter(account__owner_id=account.owner_id).aggregate(n=Sum("amount"))["n"] or 0
    if into + amount > threshold:
        return DepositRequest.Why.BENEFICIARY_WINDOW
    return None


def _deposit_governed(*, account: Account, amount: int, actor, key: str | None) -> str | None:
    """``deposit_approval_why`` in the caller's transaction, holding (to its commit) the
    advisory locks of the actor's deposits and of the beneficiary's, always in that order
    (no deadlock). None for a replay: a ``key`` that already moved money moves nothing."""
    if key is not None and transfer_by_key(key=key) is not None:
        return None
    with connection.cursor() as cur:
        for namespace, user_id in ((DEPOSIT_LOCK_ACTOR, actor.pk), (DEPOSIT_LOCK_BENEFICIARY, account.owner_id)):
            cur.execute(sql.LOCK_DEPOSIT_GOVERNANCE, {"namespace": namespace, "user": user_id})
    return deposit_approval_why(account=account, amount=amount, actor=actor)


def deposit_request_create(
    *, account_id: str, amount: int, actor, reason: str, why: str | None = None
) -> DepositRequest:
    """Ask another staff member to approve a deposit, with a ``deposit_requested`` staff
    action. ``why`` it waits (worked out here when not given). Refused at once
    (``DepositRefused``) when the account can never receive it: a system or closed
    account. Nothing moves until ``deposit_request_approve``, by someone who is neither
    the requester nor the account's owner (the database sets ``beneficiary``)."""
    reason = clean_reason(reason)
    if amount <= 0:
        raise InvalidPosting(f"invalid amount {amount!r}")
    with transaction.atomic():
        account = _deposit_account(account_id)
        if account.status == Account.Status.CLOSED:
            raise DepositRefused("The deposit was rejected: account_closed.", reason="account_closed")
        if why is None:
            why = _deposit_governed(account=account, amount=amount, actor=actor, key=None)
        request = DepositRequest.objects.create(
            account=account, amount=amount, reason=reason, requested_by=actor, beneficiary_id=account.owner_id,
            why=why or DepositRequest.Why.ABOVE_THRESHOLD,
        )
        staff_action_record(
            actor=actor, action=StaffAction.Kind.DEPOSIT_REQUESTED, reason=reason, account_id=account_id,
            deposit_request_id=request.id, amount=amount,
        )
    request.refresh_from_db()
    return request


@dataclass(frozen=True, slots=True)
class DepositSubmission:
    """What a staff deposit did: posted at once (``deposit``) or waits for approval (``request``)."""

    deposit: Deposit | None = None
    request: DepositRequest | None = None


def deposit_submit(*, account_id: str, amount: int, actor, reason: str, key: str | None = None) -> DepositSubmission:
    """The deposit of the API and the admin: it posts at once when the four-eyes rule
    lets it (``deposit_approval_why``), else it becomes a request for another staff
    member, in one transaction with the rule's reading."""
    reason = clean_reason(reason)
    if amount <= 0:
        raise InvalidPosting(f"invalid amount {amount!r}")
    with transaction.atomic():
        account = _deposit_account(account_id)
        why = _deposit_governed(account=account, amount=amount, actor=actor, key=key)
        if why is not None:
            return DepositSubmission(request=deposit_request_create(
                account_id=account_id, amount=amount, actor=actor, reason=reason, why=why
            ))
        return DepositSubmission(deposit=_deposit_at_once(
            account_id=account_id, amount=amount, actor=actor, reason=reason, key=key or new_id("dep")
        ))


@dataclass(frozen=True, slots=True)
class DepositDecision:
    request: DepositRequest
    changed_now: bool  # False: an earlier identical decision had already made it
    deposit: Deposit | None = None  # an approval that moved the money just now


def _decide_request(*, request_id: str, actor, reason: str, status: str) -> tuple[DepositRequest | None, bool]:
    """The compare-and-set: pending -> ``status``, by anyone but the requester (and, for
    an approval, anyone but the account's owner). Returns
    (the request, True) when this call decided it; else (the request as it is, False)
    after raising for what the caller may not do."""
    if status == DepositRequest.Status.APPROVED:  # nobody approves money into their own account
        owners = DepositRequest.objects.filter(pk=request_id).values_list("beneficiary_id", "account__owner_id").first()
        if owners is not None and actor.pk in owners:
            raise ConflictOfInterest("The deposit goes into an account you own: another staff member must approve it.")
    updated = (
        DepositRequest.objects.filter(pk=request_id, status=DepositRequest.Status.PENDING)
        .exclude(requested_by=actor)
        .update(status=status, decided_by=actor, decided_at=Now(), decision_reason=reason)
    )
    request = DepositRequest.objects.filter(pk=request_id).first()
    if request is None:
        raise DepositRequestNotFound()
    if updated:
        return request, True
    if request.requested_by_id == actor.pk:
        raise SelfApprovalForbidden()
    if request.status != status:
        raise DepositRequestNotPending(request.status)
    return request, False  # decided so already: a retried request


def deposit_request_approve(*, request_id: str, actor, reason: str) -> DepositDecision:
    """Approve another staff member's deposit request: the money moves once, under the
    ledger key ``request_id``, with a ``deposit_approved`` staff action, all in one
    transaction. Two approvers racing: the compare-and-set on ``pending`` lets one win,
    the other gets the approved request (``changed_now`` False) and moves nothing. If the
    ledger refuses (the account was closed meanwhile) nothing changes: the request stays
    pending and ``DepositRefused`` says why. Raises ``SelfApprovalForbidden`` for the
    requester, ``ConflictOfInterest`` for the account's owner, ``DepositRequestNotPending``
    for a rejected request."""
    reason = clean_reason(reason)
    with transaction.atomic():
        request, decided = _decide_request(
            request_id=request_id, actor=actor, reason=reason, status=DepositRequest.Status.APPROVED
        )
        if not decided:
            return DepositDecision(request, changed_now=False)
        deposit = _deposit_post(account_id=request.account_id, amount=request.amount, key=request.id)
        staff_action_record(
            actor=actor, action=StaffAction.Kind.DEPOSIT_APPROVED, reason=reason, account_id=request.account_id,
            deposit_request_id=request.id, transfer_key=request.id, amount=request.amount,
        )
    return DepositDecision(request, changed_now=True, deposit=deposit)


def deposit_request_reject(*, request_id: str, actor, reason: str) -> DepositDecision:
    """Reject another staff member's deposit request, with a ``deposit_rejected`` staff
    action; nothing moves. Idempotent like approval; ``DepositRequestNotPending`` for an
    approved request."""
    reason = clean_reason(reason)
    with transaction.atomic():
        request, decided = _decide_request(
            request_id=request_id, actor=actor, reason=reason, status=DepositRequest.Status.REJECTED
        )
        if decided:
            staff_action_record(
                actor=actor, action=StaffAction.Kind.DEPOSIT_REJECTED, reason=reason, account_id=request.account_id,
                deposit_request_id=request.id, amount=request.amount,
            )
    return DepositDecision(request, changed_now=decided)


# --- The admin's deposit form: one token per opened form, consumed by its submit ----------

DEPOSIT_FORM_MAX_AGE = timedelta(hours=24)


class DepositFormInvalid(ValueError):
    """A token that was never issued to this user for this account, or that expired."""


def deposit_form_open(*, account_id: str, actor) -> str:
    """Issue the token of one deposit form (its URL carries it). Forgets this user's
    tokens older than twice the maximum age on the way."""
    DepositFormToken.objects.filter(issued_to=actor, issued_at__lt=Now() - 2 * DEPOSIT_FORM_MAX_AGE).delete()
    return DepositFormToken.objects.create(account_id=account_id, issued_to=actor).id


def deposit_form_token(*, token: str, account_id: str, actor) -> DepositFormToken:
    """The form's token if it is this user's, for this account and not expired (consumed
    or not); else ``DepositFormInvalid``."""
    row = DepositFormToken.objects.filter(
        pk=token, account_id=account_id, issued_to=actor, issued_at__gte=Now() - DEPOSIT_FORM_MAX_AGE
    ).first()
    if row is None:
        raise DepositFormInvalid("This form is unknown, expired or someone else's; open the deposit form again.")
    return row


@dataclass(frozen=True, slots=True)
class DepositFormResult:
    submission: DepositSubmission
    already: bool  # the form had been submitted before: this submit did nothing


def deposit_form_result(*, token: DepositFormToken) -> DepositSubmission:
    """What a consumed form did: its deposit (ledger key = the token) or its request."""
    if token.deposit_request_id:
        return DepositSubmission(request=token.deposit_request)
    transfer = transfer_by_key(key=token.id)
    balance = Account.objects.values_list("balance", flat=True).get(pk=transfer.credit_account_id)
    return DepositSubmission(deposit=Deposit(
        key=transfer.key, account_id=transfer.credit_account_id, amount=transfer.amount, balance=balance,
        posted_at=transfer.created_at, replayed=True,
    ))


def deposit_form_submit(*, token: str, account_id: str, actor, amount: int, reason: str) -> DepositFormResult:
    """Consume the form's token and deposit (or request the deposit) in one transaction:
    a second submit of the same form (a double click, Back and submit again) finds the
    token consumed and does nothing (``already``). A refused deposit rolls the consumption
    back, so the same form can be corrected and sent again."""
    reason = clean_reason(reason)
    with transaction.atomic():
        row = deposit_form_token(token=token, account_id=account_id, actor=actor)
        consumed = DepositFormToken.objects.filter(pk=row.pk, consumed_at__isnull=True).update(consumed_at=Now())
        if not consumed:  # another submit of this form got there first (and committed)
            row.refresh_from_db()
            return DepositFormResult(deposit_form_result(token=row), already=True)
        submission = deposit_submit(account_id=account_id, amount=amount, actor=actor, reason=reason, key=row.id)
        DepositFormToken.objects.filter(pk=row.pk).update(amount=amount, deposit_request=submission.request)
    return DepositFormResult(submission, already=False)


# --- Two-phase transfers: reserve now, post or void when an outside party answers --------
#
# TigerBeetle's pending / post / void, on this ledger's plain transfers: the reserve
# moves the money to a clearing account (the payer's balance no longer has it, so no
# other payment can spend it), and exactly one of post or void moves it on, decided by a
# compare-and-set on the pending row. Every step is an ordinary keyed transfer through
# ``ledger_post_batch``: idempotent, funds-checked, balances locked in id order.

PENDING_PREFIX, POST_PREFIX, VOID_PREFIX = "pend:", "post:", "void:"


@dataclass(frozen=True, slots=True)
class Reservation:
    key: str  # the pending transfer's key (a payout's payment id)
    debit_account_id: str  # who pays
    clearing_account_id: str  # holds the money while pending
    credit_account_id: str  # where a post sends it (a rail's settlement account)
    amount: int


class PendingStateConflict(Exception):
    """Post of a voided pending transfer, void of a posted one, or either of none."""


def ledger_reserve_batch(*, reservations: Sequence[Reservation]) -> dict[str, PostResult]:
    """Phase one, inside the caller's transaction: reserve each amount (debit -> clearing)
    with the guard, state and funds checks of ``ledger_post_batch``. A key reserved before
    is ``ALREADY_APPLIED`` and reserves nothing more. Returns the result per key."""
    postings = [
        Posting(PENDING_PREFIX + r.key, r.debit_account_id, r.clearing_account_id, r.amount) for r in reservations
    ]
    results = ledger_post_batch(postings=postings)
    applied = [r for r in reservations if results[PENDING_PREFIX + r.key].outcome == Outcome.APPLIED]
    if applied:
        with connection.cursor() as cur:
            cur.execute(sql.INSERT_PENDING, [
                [r.key for r in applied], [r.debit_account_id for r in applied],
                [r.clearing_account_id for r in applied], [r.credit_account_id for r in applied],
                [r.amount for r in applied],
            ])
    return {r.key: results[PENDING_PREFIX + r.key] for r in reservations}


def ledger_resolve_pending(*, keys: Sequence[str], post: bool) -> dict[str, PostResult]:
    """Phase two, inside the caller's transaction: post (clearing -> credit account) or
    void (clearing -> back to the debit account) each pending transfer, once. A key
    already resolved the same way is ``ALREADY_APPLIED``; resolved the other way or never
    reserved, ``PendingStateConflict``. The ledger refusing the posting (a closed payer on
    a void) raises ``AccountStateError``: the caller's transaction must roll back."""
    _check_postings([])
    keys = sorted(set(keys))
    if not keys:
        return {}
    state = PendingTransfer.State.POSTED if post else PendingTransfer.State.VOIDED
    prefix = POST_PREFIX if post else VOID_PREFIX
    with connection.cursor() as cur:
        cur.execute(sql.RESOLVE_PENDING, {"keys": keys, "state": state.value})
        rows = cur.fetchall()
        postings = [
            Posting(prefix + key, clearing, credit if post else debit, amount)
            for key, debit, clearing, credit, amount in rows
        ]
        resolved = {row[0] for row in rows}
        rest = [k for k in keys if k not in resolved]
        states = {}
        if rest:
            cur.execute(sql.PENDING_STATES, [rest])
            states = dict(cur.fetchall())
    for key in rest:
        if states.get(key) != state:
            raise PendingStateConflict(f"{key} is {states.get(key, 'not reserved')}, not pending")
    results = ledger_post_batch(postings=postings)
    refused = {k: r.outcome for k, r in results.items() if not r.outcome.moved}
    if refused:
        raise AccountStateError(f"the ledger refused {refused}")
    out = {p.key[len(prefix):]: results[p.key] for p in postings}
    if rest:
        for key, posted_at in transfer_times(keys=[prefix + k for k in rest]).items():
            out[key[len(prefix):]] = PostResult(Outcome.ALREADY_APPLIED, posted_at)
    return out

