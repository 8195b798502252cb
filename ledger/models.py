"""Double-entry ledger: accounts with a balance, append-only transfers.

A transfer names one debit account, one credit account and a positive integer amount;
the balances of both accounts change in the same transaction that inserts it. User
accounts can never go below zero (a CHECK the database enforces, whatever the code
does); the one system issuance account goes negative by exactly the money that
entered the system, so the sum of all balances is always zero.
"""

from django.conf import settings
from django.db import models
from django.db.models.functions import Now

from common.ids import new_id

ISSUANCE_ACCOUNT_ID = "acc_issuance"


def new_account_id() -> str:
    return new_id("acc")


def new_deposit_request_id() -> str:
    return new_id("dreq")


def new_deposit_form_token() -> str:
    return new_id("adep")


class Account(models.Model):
    class Kind(models.TextChoices):
        USER = "user"
        SYSTEM = "system"

    class Status(models.TextChoices):
        ACTIVE = "active"
        FROZEN = "frozen"  # may receive, may not send
        CLOSED = "closed"  # neither sends nor receives

    id = models.CharField(primary_key=True, max_length=40, default=new_account_id, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="accounts",
    )
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.USER)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.ACTIVE)
    balance = models.BigIntegerField(default=0, db_default=0)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        ordering = ["created_at", "id"]
        # Staff actions in the admin beyond viewing (docs/reference/admin-console.md, "Staff roles").
        permissions = [
            ("freeze_account", "Can freeze or unfreeze an account"),
            ("deposit_account", "Can deposit into an account from the issuance account"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(kind="system") | models.Q(balance__gte=0),
                name="ledger_account_user_balance_non_negative",
            ),
            models.CheckConstraint(
                condition=models.Q(kind="system") | models.Q(owner__isnull=False),
                name="ledger_account_user_has_owner",
            ),
            models.CheckConstraint(
                condition=models.Q(kind__in=["user", "system"]), name="ledger_account_kind_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=["active", "frozen", "closed"]),
                name="ledger_account_status_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.name})"


class Transfer(models.Model):
    """One movement of money. Append-only: a trigger rejects UPDATE and DELETE.

    Its accounts carry no foreign-key constraint in the database (decision 0014): every
    transfer is inserted by ``ledger_post_batch`` in the transaction that read and locked
    both accounts, and accounts are never deleted (a trigger refuses it), so the check,
    two deferred queries per transfer at every commit of a batch, could never fail.
    Reconciliation reports a transfer whose account does not exist
    (``transfer_unknown_account``)."""

    key = models.CharField(max_length=64, unique=True)
    debit_account = models.ForeignKey(
        Account, on_delete=models.PROTECT, related_name="debits", db_index=False, db_constraint=False
    )
    credit_account = models.ForeignKey(
        Account, on_delete=models.PROTECT, related_name="credits", db_index=False, db_constraint=False
    )
    amount = models.BigIntegerField()
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(condition=models.Q(amount__gt=0), name="ledger_transfer_amount_positive"),
            models.CheckConstraint(
                condition=~models.Q(debit_account=models.F("credit_account")),
                name="ledger_transfer_distinct_accounts",
            ),
        ]
        indexes = [
            models.Index(fields=["debit_account", "id"], name="ledger_transfer_debit_idx"),
            models.Index(fields=["credit_account", "id"], name="ledger_transfer_credit_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.key}: {self.debit_account_id} -> {self.credit_account_id} {self.amount:,}"


class DepositApprovalWhy(models.TextChoices):
    """Why a deposit waits for a second person instead of posting at once
    (ledger/services.py, ``deposit_approval_why``)."""

    ABOVE_THRESHOLD = "above_threshold", "above the approval threshold"
    OWN_ACCOUNT = "own_account", "into an account the requester owns"
    ACTOR_WINDOW = "actor_window", "the requester's deposits in the window would pass the threshold"
    BENEFICIARY_WINDOW = "beneficiary_window", "the beneficiary's deposits in the window would pass the threshold"


class DepositRequest(models.Model):
    """A deposit that needs a second person (``why``: above
    ``DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD``, into the requester's own account, or past the
    threshold summed over the window): requested by one staff member, approved (the money
    moves, under the ledger key ``id``) or rejected by another.

    pending -> approved | rejected, forward only: a compare-and-set on ``pending`` decides
    (two approvers racing post once), and a trigger refuses any other change and every
    delete. The database also refuses a decision by the requester and an approval by the
    beneficiary, the account's owner (four eyes)."""

    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"

    Why = DepositApprovalWhy

    id = models.CharField(primary_key=True, max_length=40, default=new_deposit_request_id, editable=False)
    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="deposit_requests")
    # The account's owner when the request was made, set by the database (a trigger reads
    # the account): whoever it is may never approve it (a CHECK).
    beneficiary = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    why = models.CharField(max_length=20, choices=Why.choices, default=Why.ABOVE_THRESHOLD)
    amount = models.BigIntegerField()
    reason = models.TextField(help_text="Why the requester wants the money deposited.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        ordering = ["created_at", "id"]
        permissions = [("approve_deposit", "Can approve or reject another staff member's deposit request")]
        constraints = [
            models.CheckConstraint(condition=models.Q(amount__gt=0), name="ledger_depositrequest_amount_positive"),
            models.CheckConstraint(
                condition=models.Q(status__in=["pending", "approved", "rejected"]),
                name="ledger_depositrequest_status_valid",
            ),
            models.CheckConstraint(
                condition=(
                    models.Q(status="pending", decided_by__isnull=True, decided_at__isnull=True)
                    | (
                        models.Q(status__in=["approved", "rejected"])
                        & models.Q(decided_by__isnull=False, decided_at__isnull=False)
                        & ~models.Q(decided_by=models.F("requested_by"))
                    )
                ),
                name="ledger_depositrequest_decided_by_another",
            ),
            models.CheckConstraint(
                condition=~models.Q(status="approved") | ~models.Q(decided_by=models.F("beneficiary")),
                name="ledger_depositrequest_not_approved_by_beneficiary",
            ),
            models.CheckConstraint(
                condition=models.Q(why__in=DepositApprovalWhy.values),
                name="ledger_depositrequest_why_valid",
            ),
            models.CheckConstraint(condition=models.Q(reason__regex=r"\S"), name="ledger_depositrequest_reason_given"),
        ]
        indexes = [
            # The pending queue (and an account's pending requests), oldest first.
            models.Index(
                fields=["account", "created_at"],
                name="ledger_depreq_pending_idx",
                condition=models.Q(status="pending"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id}: {self.amount:,} into {self.account_id} ({self.status})"


class StaffActionKind(models.TextChoices):
    DEPOSIT = "deposit"
    DEPOSIT_REQUESTED = "deposit_requested"
    DEPOSIT_APPROVED = "deposit_approved"
    DEPOSIT_REJECTED = "deposit_rejected"
    FREEZE = "freeze"
    UNFREEZE = "unfreeze"
    PAYMENT_CANCEL = "payment_cancel"


class StaffAction(models.Model):
    """Who did what to money or an account, and why: every deposit, deposit request,
    approval, rejection, freeze, unfreeze and staff cancel, written in the same
    transaction as the act. Append-only (a trigger refuses UPDATE and DELETE)."""

    Kind = StaffActionKind

    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    action = models.CharField(max_length=20, choices=Kind.choices)
    reason = models.TextField()
    account = models.ForeignKey(
        Account, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    # An opaque payment id: the ledger knows nothing of payments beyond a key.
    payment_id = models.CharField(max_length=40, blank=True, default="")
    deposit_request = models.ForeignKey(
        DepositRequest, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    transfer_key = models.CharField(max_length=64, blank=True, default="", help_text="The deposit's ledger key.")
    amount = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(action__in=StaffActionKind.values), name="ledger_staffaction_action_valid"
            ),
            models.CheckConstraint(condition=models.Q(reason__regex=r"\S"), name="ledger_staffaction_reason_given"),
        ]
        indexes = [
            models.Index(fields=["account", "id"], name="ledger_staffaction_account_idx"),
            # The rolling sums of deposits made without a second person (ledger/services.py,
            # deposit_approval_why): by actor, and by account for the beneficiary's.
            models.Index(
                fields=["actor", "created_at"], name="ledger_staffaction_deposit_idx",
                condition=models.Q(action="deposit"),
            ),
        ]

    def __str__(self) -> str:
        # The actor's username, not their id (the console's lists load the actor with the row).
        return f"{self.action} by {self.actor.get_username()}: {self.reason[:40]}"


class DepositFormToken(models.Model):
    """One opened deposit form in the admin: issued to one staff member for one account,
    consumed by the submit that acts on it, in the deposit's transaction. The form page's
    URL carries it, so Back (or a reload) returns to the same, consumed form."""

    id = models.CharField(primary_key=True, max_length=40, default=new_deposit_form_token, editable=False)
    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="+", db_index=False)
    issued_to = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    issued_at = models.DateTimeField(db_default=Now(), editable=False)
    consumed_at = models.DateTimeField(null=True, blank=True)
    # What the submit did: a deposit (its ledger key is this token's id) or a request.
    amount = models.BigIntegerField(null=True, blank=True)
    deposit_request = models.ForeignKey(
        DepositRequest, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )

    class Meta:
        indexes = [models.Index(fields=["issued_to", "issued_at"], name="ledger_formtoken_user_idx")]

    def __str__(self) -> str:
        return f"deposit form {self.id} for {self.account_id}"


class PendingTransfer(models.Model):
    """A two-phase transfer (TigerBeetle's pending / post / void) for money that leaves the
    ledger through an outside party whose answer comes later.

    Pending: ``amount`` moved from ``debit_account`` to ``clearing_account`` (a system
    account), under the transfer key ``pend:<key>``: the funds are reserved, the payer's
    balance no longer has them. Then exactly one of post (clearing -> ``credit_account``,
    the rail's settlement account, key ``post:<key>``) or void (clearing -> back to the
    debit account, key ``void:<key>``), decided by a compare-and-set on ``state``. A
    clearing account's balance is the sum of its pending amounts (reconciliation checks it).
    """

    class State(models.TextChoices):
        PENDING = "pending"
        POSTED = "posted"
        VOIDED = "voided"

    key = models.CharField(primary_key=True, max_length=56)
    debit_account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="+", db_index=False)
    clearing_account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="+", db_index=False)
    credit_account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="+", db_index=False)
    amount = models.BigIntegerField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "key"]
        constraints = [
            models.CheckConstraint(condition=models.Q(amount__gt=0), name="ledger_pending_amount_positive"),
            models.CheckConstraint(
                condition=models.Q(state__in=["pending", "posted", "voided"]), name="ledger_pending_state_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(state="pending", resolved_at__isnull=True)
                | (models.Q(state__in=["posted", "voided"]) & models.Q(resolved_at__isnull=False)),
                name="ledger_pending_resolved_has_time",
            ),
        ]
        indexes = [
            models.Index(fields=["clearing_account", "created_at"], condition=models.Q(state="pending"),
                         name="ledger_pending_open_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.key}: {self.amount} {self.state}"
