"""Create or update the staff groups of the operations console (docs/reference/admin-console.md, "Staff roles").

Idempotent: each group ends up with exactly the permissions listed here. Run after
`migrate` (the release step does), because Django creates permissions after migrating.
"""

from django.contrib.auth.models import Group, Permission
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

VIEW = [
    "payments.view_scheduledpayment",
    "payments.view_executionattempt",
    "payments.view_paymentevent",
    "payments.view_recurringpayment",
    "payments.view_recurringevent",
    "payments.view_payee",
    "payments.view_payout",
    "payments.view_railstate",
    "payments.view_archivedpartition",
    "ledger.view_account",
    "ledger.view_transfer",
    "ledger.view_depositrequest",
    "ledger.view_staffaction",
    "ledger.view_pendingtransfer",
    "webhooks.view_endpoint",
    "webhooks.view_event",
    "webhooks.view_delivery",
    "webhooks.view_deliveryattempt",
]

STAFF_GROUPS: dict[str, list[str]] = {
    # Reads everything, cancels payments that have not started, re-drives or resolves
    # payments in review, pauses, resumes and ends recurring payments, resends webhook
    # deliveries (webhooks/admin.py: Delivery's change permission is its resend; nothing
    # edits one), and freezes or unfreezes user accounts: support is the group on call
    # when fraud is reported, a freeze moves no money and is undone by an unfreeze, and the
    # ledger refuses a freeze of one's own account (docs/reference/admin-console.md).
    "support": [
        *VIEW,
        "payments.cancel_scheduledpayment",
        "payments.redrive_scheduledpayment",
        "payments.pause_recurringpayment",
        "webhooks.resend_delivery",
        "ledger.freeze_account",
    ],
    # Reads everything, changes nothing.
    "auditor": VIEW,
    # Reads everything; deposits up to DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD at once, requests
    # larger deposits, and approves or rejects other members' requests (four eyes: the
    # services refuse a decision on one's own request, so two members are needed). Holds a
    # rail's circuit breaker open or closed, or clears the hold (the Rails page).
    "treasury": [
        *VIEW,
        "ledger.deposit_account",
        "ledger.approve_deposit",
        "payments.force_breaker",
    ],
}


def staff_groups_sync() -> dict[str, int]:
    """Give each staff group exactly its permissions; returns group -> permission count."""
    wanted = {perm for perms in STAFF_GROUPS.values() for perm in perms}
    found = {
        f"{p.content_type.app_label}.{p.codename}": p
        for p in Permission.objects.select_related("content_type").filter(
            codename__in=[w.split(".", 1)[1] for w in wanted]
        )
    }
    missing = sorted(wanted - found.keys())
    if missing:
        raise CommandError(f"permissions missing (run migrate first): {', '.join(missing)}")
    with transaction.atomic():
        for name, perms in STAFF_GROUPS.items():
            group, _ = Group.objects.get_or_create(name=name)
            group.permissions.set([found[p] for p in perms])
    return {name: len(perms) for name, perms in STAFF_GROUPS.items()}


class Command(BaseCommand):
    help = (
        'Create or update the "support" (view, cancel, re-drive, pause, resend webhooks, freeze accounts),'
        ' "auditor" (view only) and "treasury" (view, deposit, approve deposits, force a rail\'s circuit'
        " breaker) staff groups."
    )

    def handle(self, *args, **options):
        for name, count in staff_groups_sync().items():
            self.stdout.write(f"group {name}: {count} permissions")
