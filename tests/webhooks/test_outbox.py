"""The outbox triggers: an event row in the transaction of each webhook-worthy change, for an
owner with an enabled endpoint subscribed to its type (webhooks/0006)."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.utils import timezone

from devtools.bench import loader
from payments.execution import execute_batch
from payments.models import PaymentEvent, RecurringEvent, ScheduledPayment
from payments.services import payment_cancel, payment_update
from recurring.services import recurring_create, recurring_end, recurring_pause, recurring_resume
from tests.factories import claimed, due_payment, funded_account, future_payment, parked_payment, webhook_endpoint
from webhooks import events
from webhooks.models import Event

User = get_user_model()


def types_of(**filters) -> list[str]:
    return list(Event.objects.filter(**filters).order_by("id").values_list("type", flat=True))


def subscribed_account(**kwargs):
    account = funded_account(**kwargs)
    webhook_endpoint(account.owner)
    return account


@pytest.mark.django_db
def test_an_executor_batch_writes_one_event_per_payment_in_one_statement():
    a, b = subscribed_account(balance=100), funded_account()
    paid = [due_payment(source=a, target=b, amount=30) for _ in range(3)]
    short = due_payment(source=a, target=b, amount=1000)
    result = execute_batch(pairs=claimed(*paid, short))
    assert sorted(result.executed) == sorted(p.id for p in paid)
    for payment in paid:
        (event,) = Event.objects.filter(payment_id=payment.id)
        assert event.type == events.PAYMENT_EXECUTED
        assert event.owner_id == a.owner_id
        # Terminal: no snapshot (migration 0003); the dispatcher reads the row, frozen now.
        assert event.snapshot is None
        payment.refresh_from_db()
        assert (payment.status, event.version) == ("EXECUTED", payment.version)
        assert event.fanned_out_at is None
    (failed,) = Event.objects.filter(payment_id=short.id)
    assert (failed.type, failed.snapshot) == (events.PAYMENT_FAILED, None)


@pytest.mark.django_db
def test_only_an_owner_with_an_enabled_endpoint_subscribed_to_the_type_gets_an_event():
    # Each payer below lacks one of the three conditions, except the last.
    cases = {
        "no endpoint": lambda owner: None,
        "another type": lambda owner: webhook_endpoint(owner, types=[events.PAYMENT_FAILED]),
        "disabled": lambda owner: webhook_endpoint(owner, enabled=False),
        "another owner's": lambda owner: webhook_endpoint(funded_account().owner),
        "subscribed": lambda owner: webhook_endpoint(owner, types=[events.PAYMENT_EXECUTED]),
    }
    payments = {}
    for case, setup in cases.items():
        a, b = funded_account(balance=100), funded_account()
        setup(a.owner)
        payments[case] = due_payment(source=a, target=b, amount=1)
    result = execute_batch(pairs=claimed(*payments.values()))
    assert len(result.executed) == len(cases)  # the money moves whoever listens
    assert {case: types_of(payment_id=p.id) for case, p in payments.items()} == {
        **{case: [] for case in cases}, "subscribed": [events.PAYMENT_EXECUTED],
    }


@pytest.mark.django_db
def test_a_series_event_needs_a_subscriber_too():
    a, b = funded_account(balance=100), funded_account()
    rec = recurring_create(
        payer=a.owner, from_account_id=a.id, to_account_id=b.id, amount=5,
        start_at=timezone.now() + timedelta(hours=1), interval="P1D",
    )  # fmt: skip
    recurring_pause(recurring_id=rec.id, actor=a.owner)
    webhook_endpoint(a.owner, types=[events.RECURRING_RESUMED])
    recurring_resume(recurring_id=rec.id, actor=a.owner)
    recurring_end(recurring_id=rec.id, actor=a.owner)
    assert types_of(recurring_id=rec.id) == [events.RECURRING_RESUMED]


@pytest.mark.django_db
def test_claims_and_creations_write_no_event():
    a, b = subscribed_account(balance=100), funded_account()
    payment = due_payment(source=a, target=b, amount=1)
    claimed(payment)
    assert not Event.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_change_writes_no_event():
    a, b = subscribed_account(balance=100), funded_account()
    payment = future_payment(source=a, target=b)
    with pytest.raises(RuntimeError), transaction.atomic():
        payment_cancel(payment_id=payment.id, actor=a.owner)
        assert types_of(payment_id=payment.id) == [events.PAYMENT_CANCELLED]  # visible inside
        raise RuntimeError("roll back")
    assert not Event.objects.exists()
    payment_cancel(payment_id=payment.id, actor=a.owner)
    assert types_of(payment_id=payment.id) == [events.PAYMENT_CANCELLED]


@pytest.mark.django_db
def test_cancel_and_reschedule():
    a, b = subscribed_account(balance=100), funded_account()
    payment = future_payment(source=a, target=b)
    payment_update(payment_id=payment.id, actor=a.owner, amount=7)
    payment_cancel(payment_id=payment.id, actor=a.owner)
    assert types_of(payment_id=payment.id) == [events.PAYMENT_RESCHEDULED, events.PAYMENT_CANCELLED]
    rescheduled, cancelled = Event.objects.filter(payment_id=payment.id).order_by("id")
    assert (rescheduled.snapshot["amount"], rescheduled.version) == (7, 2)
    assert (cancelled.snapshot, cancelled.version) == (None, 3)  # terminal: the frozen row is read at delivery


@pytest.mark.django_db
def test_park_writes_needs_review(settings):
    a, b = subscribed_account(balance=100), funded_account()
    payment = parked_payment(settings, source=a, target=b)
    (event,) = Event.objects.filter(payment_id=payment.id)
    assert (event.type, event.snapshot["status"]) == (events.PAYMENT_NEEDS_REVIEW, "NEEDS_REVIEW")


@pytest.mark.django_db
def test_pause_resume_end_of_a_series():
    a, b = subscribed_account(balance=100), funded_account()
    rec = recurring_create(
        payer=a.owner,
        from_account_id=a.id,
        to_account_id=b.id,
        amount=5,
        start_at=timezone.now() + timedelta(hours=1),
        interval="P1D",
    )
    recurring_pause(recurring_id=rec.id, actor=a.owner)
    recurring_resume(recurring_id=rec.id, actor=a.owner)
    recurring_end(recurring_id=rec.id, actor=a.owner)
    assert types_of(recurring_id=rec.id) == [events.RECURRING_PAUSED, events.RECURRING_RESUMED, events.RECURRING_ENDED]
    paused = Event.objects.filter(recurring_id=rec.id).order_by("id").first()
    assert (paused.snapshot["status"], paused.owner_id) == ("PAUSED", a.owner_id)
    # The occurrences the pause and the end cancelled are payment.cancelled events.
    occurrences = ScheduledPayment.objects.filter(recurring_id=rec.id).values("id")
    cancelled = Event.objects.filter(type=events.PAYMENT_CANCELLED, payment_id__in=occurrences)
    assert cancelled.count() == 2


def test_the_triggers_map_kinds_as_events_py_says():
    """The SQL in migration 0002 and the maps in webhooks/events.py agree."""
    from importlib import import_module

    migration = import_module("webhooks.migrations.0002_outbox_triggers")
    pairs = dict(re.findall(r"WHEN '(\w+)' THEN '(payment\.\w+)'", migration.TRIGGERS))
    assert pairs == events.PAYMENT_KIND_TO_TYPE
    # Migrations 0003 and 0006 replaced the payment trigger's function: the same map, and
    # no snapshot for exactly the terminal types.
    for name in ("0003_terminal_events_read_the_frozen_row", "0006_outbox_only_for_subscribers"):
        replaced = import_module(f"webhooks.migrations.{name}").PAYMENT_OUTBOX
        assert dict(re.findall(r"WHEN '(\w+)' THEN '(payment\.\w+)'", replaced)) == events.PAYMENT_KIND_TO_TYPE
        (no_snapshot,) = re.findall(r"CASE WHEN e\.kind IN \(([^)]*)\) THEN NULL", replaced)
        assert {events.PAYMENT_KIND_TO_TYPE[k] for k in re.findall(r"'(\w+)'", no_snapshot)} == set(
            events.TERMINAL_STATUS_TO_TYPE.values())
    assert set(events.PAYMENT_KIND_TO_TYPE) <= set(PaymentEvent.Kind.values)
    payment_kinds, recurring_kinds = re.findall(r"e\.kind IN \(([^)]*)\)", migration.TRIGGERS)
    assert set(re.findall(r"'(\w+)'", payment_kinds)) == set(events.PAYMENT_KIND_TO_TYPE)
    assert set(re.findall(r"'(\w+)'", recurring_kinds)) == set(events.RECURRING_KIND_TO_TYPE)
    assert set(events.RECURRING_KIND_TO_TYPE) <= set(RecurringEvent.Kind.values)
    assert {f"recurring_payment.{k}" for k in events.RECURRING_KIND_TO_TYPE} == set(
        events.RECURRING_KIND_TO_TYPE.values()
    )
    assert set(events.PAYMENT_KIND_TO_TYPE.values()) | set(events.RECURRING_KIND_TO_TYPE.values()) == set(
        events.EVENT_TYPES
    )


@pytest.mark.django_db
def test_the_triggers_are_statement_level():
    with connection.cursor() as cur:
        cur.execute("SELECT tgname, tgtype & 1 FROM pg_trigger WHERE tgname LIKE 'webhooks_%%_outbox' ORDER BY tgname")
        assert cur.fetchall() == [("webhooks_payment_outbox", 0), ("webhooks_recurring_outbox", 0)]


def seq_tuples_read_of_payments() -> int:
    """Rows read by sequential scans of the schedule's partitions in this transaction."""
    with connection.cursor() as cur:
        cur.execute("""
            SELECT coalesce(sum(s.seq_tup_read), 0) FROM pg_stat_xact_user_tables s
              JOIN pg_inherits i ON i.inhrelid = s.relid
             WHERE i.inhparent = 'payments_scheduledpayment'::regclass
        """)
        return cur.fetchone()[0]


INSERT_EVENTS = """
    INSERT INTO payments_paymentevent (payment_id, kind, from_status, to_status, attempt, actor, data, created_at)
    SELECT id, 'executed', 'EXECUTING', 'EXECUTED', 1, 'test', '{}', now() FROM unnest(%s::text[]) AS id
"""


def outbox_plan_of(ids: list[str], *, empty_firing_first: bool) -> str:
    """The plan the payment outbox trigger ran for an insert of events for ``ids``, as
    ``auto_explain`` reports it. The trigger's plan is made again after ``ANALYZE`` (an
    invalidation), at its next firing: the claim's empty audit insert, or a batch."""
    plans = []

    def notice(diagnostic):
        plans.append(diagnostic.message_primary or "")

    raw = connection.connection
    raw.add_notice_handler(notice)
    try:
        with connection.cursor() as cur:
            cur.execute("LOAD 'auto_explain'")
            for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on",
                            "auto_explain.log_level = notice", "client_min_messages = notice"):
                cur.execute(f"SET LOCAL {setting}")
            cur.execute("ANALYZE payments_scheduledpayment")
            if empty_firing_first:
                cur.execute(INSERT_EVENTS, [[]])
            plans.clear()
            cur.execute(INSERT_EVENTS, [ids])
            cur.execute("SET LOCAL auto_explain.log_min_duration = -1")
    finally:
        raw.remove_notice_handler(notice)
    [plan] = [text for text in plans if "INSERT INTO webhooks_event" in text]
    return plan


@pytest.mark.django_db
@pytest.mark.parametrize("empty_firing_first", [False, True])
def test_the_payment_outbox_looks_each_payment_up_by_primary_key(empty_firing_first):
    # A PL/pgSQL statement's plan is made at its first firing after an invalidation and
    # kept. Made at a batch of 1,000 on a table that looked small, a plain join hashed
    # every payment (webhooks/0004); made at the claim's empty firing, 0004's ANY-array
    # form rescanned the whole array for each event, O(batch squared) (webhooks/0005).
    loader.load_accounts(accounts=50)
    loader.load_payments(payments=3000, accounts=50, due_at=timezone.now() - timedelta(seconds=1))
    for payer_id in ScheduledPayment.objects.values_list("payer_id", flat=True).distinct():
        webhook_endpoint(User.objects.get(pk=payer_id), types=[events.PAYMENT_EXECUTED])
    with connection.cursor() as cur:
        cur.execute("SELECT id FROM payments_scheduledpayment ORDER BY id LIMIT 1000")
        ids = [row[0] for row in cur.fetchall()]
    before = seq_tuples_read_of_payments()
    plan = outbox_plan_of(ids, empty_firing_first=empty_firing_first)
    assert seq_tuples_read_of_payments() == before
    assert Event.objects.filter(type=events.PAYMENT_EXECUTED).count() == 1000
    assert "Nested Loop" in plan and "Index Cond: ((id)::text = (e.payment_id)::text)" in plan, plan
    assert "Index Scan using webhooks_endpoint_owner_idx" in plan, plan  # the subscription: one probe an event
    for wrong in ("Hash Join", "Merge Join", "Seq Scan on payments_scheduledpayment", "(id)::text = ANY",
                  "Seq Scan on webhooks_endpoint"):
        assert wrong not in plan, plan
