"""The lookup keys off the hot path (decision 0011, migration 0021): payments_paymentlookup
holds each payment's payer, accounts and due time, kept by triggers; the payments table
has no index on those columns that a claim or a finish writes; the readers by payer and
by account go through it and never read the whole payments table."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test import RequestFactory
from django.utils import timezone

from console.admin.filters import PayerFilter
from console.admin.payments import ScheduledPaymentAdmin
from devtools.bench import loader
from payments import selectors
from payments.execution import execute_batch
from payments.limits import outflow_by_payer_and_day, pending_by_payer
from payments.models import PaymentLookup, ScheduledPayment
from payments.promoter import claim_due
from payments.reconciliation import reconcile
from payments.services import payment_schedule, payment_update
from tests.factories import UserFactory, bulk_due_payments, due_payment, funded_account, future_payment

from .test_execution_plans import plan_nodes

pytestmark = pytest.mark.django_db

KEYS = ("payer_id", "from_account_id", "to_account_id", "execute_at")


def lookup_of(payment_id: str) -> tuple:
    return PaymentLookup.objects.filter(pk=payment_id).values_list(*KEYS).get()


def keys_of(payment_id: str) -> tuple:
    return ScheduledPayment.objects.filter(pk=payment_id).values_list(*KEYS).get()


def lookup_violations() -> list[str]:
    return reconcile().get("lookup_keys").samples


def test_every_way_of_creating_payments_writes_their_lookup_rows():
    source, target = funded_account(balance=100), funded_account()
    scheduled = payment_schedule(payer=source.owner, from_account_id=source.id, to_account_id=target.id,
                                 amount=5, execute_at=timezone.now() + timedelta(hours=1))
    direct = due_payment(source=source, target=target, amount=3)  # the ORM's INSERT
    bulk_due_payments(source=source, target=target, count=40)  # one INSERT ... SELECT of 40 rows
    assert lookup_of(scheduled.id) == keys_of(scheduled.id)
    assert lookup_of(direct.id) == keys_of(direct.id)
    assert PaymentLookup.objects.count() == ScheduledPayment.objects.count() == 42
    assert lookup_violations() == []


def test_a_reschedule_moves_the_lookup_row_and_the_hot_path_leaves_it_alone():
    source, target = funded_account(balance=100), funded_account()
    payment = future_payment(source=source, target=target, amount=5, minutes=30)
    later = payment.execute_at + timedelta(hours=2)
    payment_update(payment_id=payment.id, actor=source.owner, execute_at=later)
    assert lookup_of(payment.id) == (source.owner_id, source.id, target.id, later)

    due = due_payment(source=source, target=target, amount=5)
    with connection.cursor() as cur:
        cur.execute("SELECT xmin::text FROM payments_paymentlookup WHERE payment_id = %s", [due.id])
        written = cur.fetchone()[0]
    claimed = claim_due(batch=10, lease_seconds=60)
    assert execute_batch(pairs=claimed.fresh).executed == [due.id]
    with connection.cursor() as cur:
        cur.execute("SELECT xmin::text FROM payments_paymentlookup WHERE payment_id = %s", [due.id])
        assert cur.fetchone()[0] == written  # the same row version: neither update touched it
    assert lookup_violations() == []


def test_no_index_of_the_payments_table_that_a_claim_or_a_finish_writes_holds_a_lookup_key():
    """Every index on payer_id, from_account_id or to_account_id is partial on SCHEDULED
    rows, which neither update leaves behind (the claim makes EXECUTING, the finish a
    terminal status or a retry): a non-HOT update writes an entry into every index whose
    predicate its new row version matches."""
    with connection.cursor() as cur:
        cur.execute("""
            SELECT c.relname, pg_get_expr(i.indpred, i.indrelid), array_agg(a.attname::text)
              FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
              JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
             WHERE i.indrelid = 'payments_scheduledpayment'::regclass
             GROUP BY 1, 2
        """)
        indexes = cur.fetchall()
    keyed = {name: predicate for name, predicate, columns in indexes
             if {"payer_id", "from_account_id", "to_account_id"} & set(columns)}
    assert keyed == {"payments_sender_due_idx": keyed.get("payments_sender_due_idx")}
    assert "'SCHEDULED'" in keyed["payments_sender_due_idx"]


def test_reconciliation_finds_a_lookup_row_missing_changed_or_left_over():
    source, target = funded_account(balance=100), funded_account()
    gone, moved, kept = (future_payment(source=source, target=target) for _ in range(3))
    with connection.cursor() as cur:
        cur.execute("DELETE FROM payments_paymentlookup WHERE payment_id = %s", [gone.id])
        cur.execute("UPDATE payments_paymentlookup SET execute_at = execute_at + interval '1 day' "
                    "WHERE payment_id = %s", [moved.id])
        cur.execute("INSERT INTO payments_paymentlookup VALUES ('pay_NOSUCHPAYMENT', %s, %s, NULL, now())",
                    [source.owner_id, source.id])
    assert sorted(lookup_violations()) == sorted([
        f"{gone.id}: no lookup row", f"{moved.id}: lookup row disagrees",
        "pay_NOSUCHPAYMENT: lookup row without its payment",
    ])
    assert kept.id not in " ".join(lookup_violations())


@pytest.fixture
def crowd():
    """20,000 payments of one payer over 50 accounts, and a user with three of their own;
    fresh statistics. With 3,000 the hash join that reads the whole month's partition was
    priced about as cheap as three index probes, and the planner took it now and then
    (rows_read 3,003 in two runs of tests/payments in parallel); a table that size is
    where the choice is real."""
    loader.load_accounts(accounts=50)
    loader.load_payments(payments=20_000, accounts=50, due_at=timezone.now() + timedelta(hours=1),
                         timing="even", window_seconds=3600)
    mine = funded_account(balance=100)
    other = funded_account()
    payments = [future_payment(source=mine, target=other, minutes=m) for m in (10, 20, 30)]
    with connection.cursor() as cur:
        cur.execute("ANALYZE payments_scheduledpayment")
        cur.execute("ANALYZE payments_paymentlookup")
    return {"user": mine.owner, "account": mine, "other": other, "payments": payments}


def nodes_of(queryset) -> list[dict]:
    """The plan of ``queryset``, run (EXPLAIN ANALYZE)."""
    query_sql, params = queryset.query.sql_with_params()
    return plan_nodes(query_sql, params, analyze=True)


def rows_read(nodes, relation: str = "payments_scheduledpayment") -> int:
    """Rows the scans of ``relation`` (any partition) read: returned or filtered out, every loop.
    A read of the whole table is 20,000 or more here; an empty partition's sequential scan, 0."""
    return sum((n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"]
               for n in nodes if n.get("Relation Name") == relation)


def test_a_users_payments_are_read_through_their_lookup_keys_never_the_whole_table(crowd):
    """Before the lookup table, "payer = me OR my account pays" joined the accounts in the
    OR, and the planner hashed every payment to answer it."""
    user = crowd["user"]
    listing = selectors.payment_list(user=user).order_by("-execute_at", "-id")[:50]
    assert sorted(p.id for p in listing) == sorted(p.id for p in crowd["payments"])
    nodes = nodes_of(listing)
    assert rows_read(nodes) == 3 and rows_read(nodes, "payments_paymentlookup") <= 6
    assert {n.get("Index Name") for n in nodes} >= {"payments_lookup_payer_idx", "payments_lookup_from_idx"}
    by_account = selectors.payment_list_for_account(user=user, account_id=crowd["other"].id)
    assert by_account.count() == 3
    assert rows_read(nodes_of(by_account)) == 3


def test_the_admin_lists_a_payers_payments_latest_due_first_by_walking_the_lookup_index(crowd, admin_user):
    """No sort of the payer's 20,000 payments: the lookup index is walked backwards and
    each payment read by primary key, a page's worth."""
    payer = crowd["payments"][0].payer_id
    bench_payer = ScheduledPayment.objects.exclude(payer_id=payer).values_list("payer_id", flat=True).first()
    request = RequestFactory().get("/", {"payer": str(bench_payer)})
    request.user = admin_user
    model_admin = ScheduledPaymentAdmin(ScheduledPayment, None)
    ordering = model_admin.get_ordering(request)
    queryset = PayerFilter(request, {"payer": [str(bench_payer)]}, ScheduledPayment, model_admin).queryset(
        request, ScheduledPayment.objects.all())
    page = queryset.order_by(*ordering)[:50]
    due = [p.execute_at for p in page]
    assert len(due) == 50 and due == sorted(due, reverse=True)
    nodes = nodes_of(page)
    assert [n["Node Type"] for n in nodes if "Sort" in n["Node Type"]] == []
    assert rows_read(nodes) == 50 and rows_read(nodes, "payments_paymentlookup") == 50
    assert "payments_lookup_payer_idx" in {n.get("Index Name") for n in nodes}


def test_the_limits_count_and_sum_a_payers_payments_through_the_lookup_keys(crowd):
    user = crowd["user"]
    assert pending_by_payer([user.pk]) == {user.pk: 3}
    today = timezone.now().date()
    days = outflow_by_payer_and_day([user.pk], since=timezone.now() - timedelta(days=1),
                                    until=timezone.now() + timedelta(days=1))
    assert sum(days[user.pk].values()) == 30 and set(days[user.pk]) <= {today, today + timedelta(days=1)}


def test_a_search_by_account_finds_both_sides_and_an_occurrence_search_still_works(crowd):
    condition = selectors.payment_search_condition(terms=[crowd["other"].id])
    found = ScheduledPayment.objects.filter(condition)
    assert sorted(found.values_list("id", flat=True)) == sorted(p.id for p in crowd["payments"])
    assert rows_read(nodes_of(found)) == 3
    with_series = ScheduledPayment.objects.filter(
        selectors.payment_search_condition(terms=[crowd["payments"][0].id, "rec_NOSUCHSERIES"]))
    assert list(with_series.values_list("id", flat=True)) == [crowd["payments"][0].id]


def test_users_with_no_accounts_see_only_what_they_created():
    nobody = UserFactory()
    assert list(selectors.payment_list(user=nobody)) == []


def test_the_date_drill_downs_bounds_of_a_payers_payments_stop_at_the_index_ends(crowd):
    """An aggregate over the join read every row of the payer's (1.1 s an arm at a
    million); the first row of each order stops at the first the join keeps."""
    from django.db.models import Max, Min
    from django.test.utils import CaptureQueriesContext

    bench_payer = ScheduledPayment.objects.exclude(payer_id=crowd["user"].pk).values_list("payer_id", flat=True)[0]
    rows = ScheduledPayment.objects.filter(lookup__payer_id=bench_payer)
    with CaptureQueriesContext(connection) as ctx:
        bounds = selectors.payment_execute_at_bounds(rows)
    assert bounds == ScheduledPayment.objects.filter(payer_id=bench_payer).aggregate(
        first=Min("execute_at"), last=Max("execute_at"))
    for query in ctx.captured_queries:
        assert rows_read(plan_nodes(query["sql"], None, analyze=True)) <= 50, query["sql"]
