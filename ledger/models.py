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
    """One movement of money. Append-only: a trigger rejects UPDATE and DELETE."""

    key = models.CharField(max_length=64, unique=True)
    debit_account = models.ForeignKey(
        Account, on_delete=models.PROTECT, related_name="debits", db_index=False
    )
    credit_account = models.ForeignKey(
        Account, on_delete=models.PROTECT, related_name="credits", db_index=False
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
        return f"{self.key}: {self.debit_account_id} -> {self.credit_account_id} {self.amount}"
