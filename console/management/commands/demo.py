"""Demo data for `make run`: users, funded accounts and payments due within a minute."""

import os
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from common.ids import new_id
from ledger.models import Account, DepositRequest
from ledger.services import account_create, deposit_request_create, ledger_deposit
from payments.models import Payee
from payments.services import payment_cancel, payment_schedule
from payouts.payees import payee_create


class Command(BaseCommand):
    help = "Create demo users and accounts (once) and schedule fresh demo payments (every run)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--webhook-url", default="",
            help="give alice a webhook endpoint for every event type at this URL (make run: the demo receiver)",
        )
        parser.add_argument(
            "--webhook-secret-file", default="",
            help="append the endpoint's signing secret to this file (the demo receiver reads it)",
        )

    def handle(self, *args, **options):
        # A superuser with a known password and money from nowhere (deposits with no staff
        # member and no second person): development only (docs/explanation/threat-model.md).
        if not settings.DEBUG:
            raise CommandError("demo runs with DJANGO_DEBUG=1 only: it creates a superuser with a known password "
                               "and deposits money without a staff member")
        password = os.environ.get("DELAYPAY_DEMO_PASSWORD", "demo-password")
        User = get_user_model()
        admin, created = User.objects.get_or_create(
            username="admin", defaults={"is_staff": True, "is_superuser": True}
        )
        if created:
            admin.set_password(password)
            admin.save()
        people = {}
        for name in ("alice", "bob"):
            user, created = User.objects.get_or_create(username=name)
            if created:
                user.set_password(password)
                user.save()
            account = Account.objects.filter(owner=user).order_by("created_at").first()
            if account is None:
                account = account_create(owner=user, name=f"{name}'s wallet")
                ledger_deposit(key=new_id("dep"), account_id=account.id, amount=10_000)
            people[name] = (user, account)

        (alice, alice_acc), (bob, bob_acc) = people["alice"], people["bob"]
        if options["webhook_url"]:
            self.subscribe(alice, options["webhook_url"], options["webhook_secret_file"])

        # Four-eyes money: two treasury staff (the group comes from `staff_groups`), and a
        # deposit above DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD one of them asked for, waiting
        # in the admin for the other's approval.
        treasury = Group.objects.filter(name="treasury").first()
        treasurers = []
        for name in ("treasurer", "approver"):
            user, created = User.objects.get_or_create(username=name, defaults={"is_staff": True})
            if created:
                user.set_password(password)
                user.save()
                if treasury is not None:
                    user.groups.add(treasury)
            treasurers.append(user)
        if not DepositRequest.objects.filter(account=bob_acc).exists():
            deposit_request_create(
                account_id=bob_acc.id, amount=50_000, actor=treasurers[0], reason="demo: a top-up awaiting approval"
            )
        now = timezone.now()
        scheduled = []
        for i, amount in enumerate((100, 250, 400, 50, 75), start=1):
            scheduled.append(
                payment_schedule(
                    payer=alice, from_account_id=alice_acc.id, to_account_id=bob_acc.id,
                    amount=amount, execute_at=now + timedelta(seconds=5 * i),
                )
            )
        # One that cannot be paid, and one cancelled before it is due.
        too_big = payment_schedule(
            payer=bob, from_account_id=bob_acc.id, to_account_id=alice_acc.id,
            amount=10**9, execute_at=now + timedelta(seconds=12),
        )
        doomed = payment_schedule(
            payer=alice, from_account_id=alice_acc.id, to_account_id=bob_acc.id,
            amount=999, execute_at=now + timedelta(seconds=20),
        )
        payment_cancel(payment_id=doomed.id, actor=alice)
        # Payouts through the sandbox gateway (the `gateway` process): one paid, one to a
        # destination the gateway always declines (its money comes back to alice).
        carol = Payee.objects.filter(owner=alice, destination="acct_carol").first() or payee_create(
            owner=alice, name="Carol at her bank", rail="sandbox", destination="acct_carol"
        )
        closed = Payee.objects.filter(owner=alice, destination="decline-closed").first() or payee_create(
            owner=alice, name="A closed bank account", rail="sandbox", destination="decline-closed"
        )
        payouts = [
            payment_schedule(payer=alice, from_account_id=alice_acc.id, to_payee_id=payee.id, amount=amount,
                             execute_at=now + timedelta(seconds=seconds))
            for payee, amount, seconds in ((carol, 300, 8), (closed, 120, 16))
        ]

        self.stdout.write(self.style.SUCCESS(
            f"demo: {len(scheduled)} payments alice -> bob due in 5..25 s, {too_big.id} underfunded"
            f" (will fail), {doomed.id} cancelled; payouts through the sandbox gateway: {payouts[0].id} to"
            f" {carol.id} (paid), {payouts[1].id} to {closed.id} (declined: the money comes back)"
        ))
        self.stdout.write(
            "users alice, bob, admin (superuser), treasurer and approver (treasury staff: a 50,000 deposit"
            " request by treasurer waits for approver); password from DELAYPAY_DEMO_PASSWORD (default demo-password)\n"
            "admin: http://127.0.0.1:8000/admin/\n"
            "token: curl -s -X POST -H 'Content-Type: application/json'"
            " -d '{\"username\": \"alice\", \"password\": \"demo-password\"}' http://127.0.0.1:8000/api/v1/auth/token\n"
            f"then:  curl -s -H 'Authorization: Token <token>' http://127.0.0.1:8000/api/v1/payments/{scheduled[0].id}"
        )

    def subscribe(self, owner, url: str, secret_file: str) -> None:
        """Once: an endpoint of ``owner`` for every event type at ``url`` (a loopback
        receiver; allowed with DJANGO_DEBUG=1), its secret appended to ``secret_file``."""
        from webhooks.endpoints import endpoint_create
        from webhooks.events import EVENT_TYPES
        from webhooks.models import Endpoint

        endpoint = Endpoint.objects.filter(owner=owner, url=url).first()
        if endpoint is None:
            created = endpoint_create(owner=owner, url=url, events=list(EVENT_TYPES), description="demo receiver")
            endpoint = created.endpoint
        if secret_file:
            path = Path(secret_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            known = path.read_text().split() if path.exists() else []
            if endpoint.secret not in known:
                with path.open("a") as f:
                    f.write(endpoint.secret + "\n")
        self.stdout.write(f"webhooks: alice's payments are signed and sent to {url} ({endpoint.id})")
