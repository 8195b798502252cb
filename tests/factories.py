from datetime import timedelta

import factory
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from common.ids import new_id
from ledger.models import Account
from ledger.services import ledger_deposit
from payments.models import PaymentEvent, ScheduledPayment

PASSWORD = "correct-horse-battery-staple"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.PostGenerationMethodCall("set_password", PASSWORD)

    @factory.post_generation
    def _save(obj, create, extracted, **kwargs):
        if create:
            obj.save()


class AccountFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Account

    owner = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"account {n}")
    kind = Account.Kind.USER


def funded_account(*, owner=None, balance: int = 0, **kwargs) -> Account:
    """A user account holding ``balance`` units, deposited through the ledger."""
    account = AccountFactory(owner=owner or UserFactory(), **kwargs)
    if balance:
        ledger_deposit(key=new_id("dep"), account_id=account.id, amount=balance)
        account.refresh_from_db()
    return account


def due_time(seconds_ago: float):
    """``seconds_ago`` before now. Already due (``seconds_ago >= 0``): before the database's
    now() as well, which in a test's transaction is the transaction's start: the claim
    judges on that clock, and a test that spent more than ``seconds_ago`` before this call
    (a slow page under load) would otherwise get a payment that is not due yet."""
    now = timezone.now()
    if seconds_ago >= 0:
        with connection.cursor() as cur:
            cur.execute("SELECT now()")
            now = min(now, cur.fetchone()[0])
    return now - timedelta(seconds=seconds_ago)


def due_payment(*, source: Account, target: Account, amount: int, seconds_ago: float = 1.0, payer=None):
    """A SCHEDULED payment already due, with its "created" event, written directly as
    the service would (the service refuses the past)."""
    payment = ScheduledPayment.objects.create(
        payer=payer or source.owner,
        from_account=source,
        to_account=target,
        amount=amount,
        execute_at=due_time(seconds_ago),
    )
    PaymentEvent.objects.create(payment=payment, kind="created", to_status="SCHEDULED", actor="test")
    return payment


def expire_lease(payment) -> None:
    """Make an EXECUTING payment's lease lapse now (a test's transaction has one now())."""
    ScheduledPayment.objects.filter(pk=payment.pk, status="EXECUTING").update(
        lease_until=timezone.now() - timedelta(hours=1)
    )


def future_payment(*, source: Account, target: Account, amount: int = 10, minutes: float = 30, payer=None):
    """A SCHEDULED payment due ``minutes`` from now (written directly, like due_payment)."""
    return due_payment(source=source, target=target, amount=amount, seconds_ago=-60 * minutes, payer=payer)


def bulk_due_payments(*, source: Account, target: Account, count: int, amount: int = 1) -> None:
    """``count`` due SCHEDULED payments with their created events, in two statements."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            """
            WITH p AS (
                INSERT INTO payments_scheduledpayment
                       (id, payer_id, from_account_id, to_account_id, amount, execute_at, status,
                        failure_reason, attempt, version, created_at, updated_at)
                SELECT 'pay_BULK' || lpad(g::text, 22, '0') || substr(md5(random()::text), 1, 4),
                       %(payer)s, %(source)s, %(target)s, %(amount)s,
                       now() - interval '1 second' - g * interval '1 microsecond',
                       'SCHEDULED', '', 0, 1, now(), now()
                  FROM generate_series(1, %(count)s) AS g
             RETURNING id
            )
            INSERT INTO payments_paymentevent
                   (payment_id, kind, from_status, to_status, attempt, actor, data, created_at)
            SELECT id, 'created', '', 'SCHEDULED', 0, 'test', '{}'::jsonb, now() FROM p
            """,
            {"payer": source.owner_id, "source": source.id, "target": target.id, "amount": amount, "count": count},
        )


def claimed(*payments) -> list[tuple[str, int]]:
    """Claim what is due (as the promoter would) and return the (id, attempt) pairs of ``payments``."""
    from payments.promoter import claim_due

    claim = claim_due(batch=1000, lease_seconds=60)
    wanted = {p.id for p in payments}
    return [pair for pair in claim.fresh + claim.reclaimed if pair[0] in wanted]


def parked_payment(
    settings, *, source: Account, target: Account, amount: int = 1, seconds_ago: float = 1.0
) -> ScheduledPayment:
    """A due payment whose retry budget is spent, parked in NEEDS_REVIEW by the executor
    (as tests/payments/test_services.py::parked_payment): ``settings`` is pytest-django's
    fixture, DELAYPAY_MAX_ATTEMPTS becomes 1 and two worker starts are marked. Due
    ``seconds_ago`` (on the test's clock; the claim judges on the database's)."""
    from payments import execution

    settings.DELAYPAY_MAX_ATTEMPTS = 1
    payment = due_payment(source=source, target=target, amount=amount, seconds_ago=seconds_ago)
    for _ in range(2):
        expire_lease(payment)
        (pair,) = claimed(payment)
        execution.mark_started([pair])
    assert execution.execute_batch(pairs=[pair]).parked == {payment.id: "attempts_exhausted"}
    return ScheduledPayment.objects.get(pk=payment.pk)


def payee_for(owner, *, destination: str = "acct_bob", name: str = "Bob at the bank"):
    """A sandbox payee of ``owner``."""
    from payments.models import Payee

    return Payee.objects.create(owner=owner, name=name, rail="sandbox", destination=destination)


def due_payout(*, source: Account, payee, amount: int, seconds_ago: float = 1.0):
    """A SCHEDULED payout already due, with its "created" event (as due_payment)."""
    payment = ScheduledPayment.objects.create(
        payer=source.owner, from_account=source, to_payee=payee, rail=payee.rail, amount=amount,
        execute_at=due_time(seconds_ago),
    )
    PaymentEvent.objects.create(payment=payment, kind="created", to_status="SCHEDULED", actor="test")
    return payment


def claim_payouts(batch: int = 100) -> list[tuple[str, int]]:
    """The promoter's payouts claim of the sandbox rail, as one tick would make it."""
    from payments import promoter

    claim = promoter.claim_payouts(rail="sandbox", batch=batch, lease_seconds=60)
    return claim.fresh + claim.reclaimed


def work_payouts(batch: int = 100):
    """Claim the due payouts and work them here, as the payouts process would (None: none due)."""
    from payouts.executor import run_payout_batch

    pairs = claim_payouts(batch)
    return run_payout_batch(pairs, worker="test") if pairs else None


def webhook_endpoint(owner, *, types=None, url: str = "https://example.com/hook", **kwargs):
    """An endpoint of ``owner`` subscribed to ``types`` (default: every event type), written
    directly. The outbox writes an event only for such an owner (webhooks/0006)."""
    from webhooks.events import EVENT_TYPES
    from webhooks.models import Endpoint

    return Endpoint.objects.create(owner=owner, url=url, events=list(EVENT_TYPES if types is None else types), **kwargs)
