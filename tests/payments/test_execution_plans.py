"""The fence and the CAS must stay O(batch) however many payments are in flight, even
while the planner's statistics still say none are (a burst outruns autovacuum)."""

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from devtools.bench import loader
from payments import sql, sql_readings
from payments.execution import fence_params
from payments.models import ScheduledPayment as Payment
from payments.promoter import FairWalk, Shard, claim_due, claim_params
from payments.worker import run_batch

pytestmark = pytest.mark.django_db


def plan_nodes(sql: str, params: dict, *, analyze: bool = False) -> list[dict]:
    """Every node of ``sql``'s plan (``analyze``: run it, with the actual row counts). A
    scan of a partition (payments/partitions.py) names its table and its index by the
    partitioned table's and index's names, as the SQL does."""
    with connection.cursor() as cur:
        cur.execute(("EXPLAIN (ANALYZE, FORMAT JSON) " if analyze else "EXPLAIN (FORMAT JSON) ") + sql, params)
        plan = cur.fetchone()[0]
        cur.execute("""
            WITH RECURSIVE up(child, parent) AS (
                SELECT inhrelid, inhparent FROM pg_inherits
                UNION ALL
                SELECT up.child, i.inhparent FROM up JOIN pg_inherits i ON i.inhrelid = up.parent
            )
            SELECT c.relname, p.relname FROM up JOIN pg_class c ON c.oid = up.child JOIN pg_class p ON p.oid = up.parent
             WHERE NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = up.parent)
        """)
        parent_of = dict(cur.fetchall())
    plan = json.loads(plan) if isinstance(plan, str) else plan
    nodes, stack = [], [plan[0]["Plan"]]
    while stack:
        node = stack.pop()
        for field in ("Relation Name", "Index Name"):
            if node.get(field) in parent_of:
                node[field] = parent_of[node[field]]
        nodes.append(node)
        stack.extend(node.get("Plans", []))
    return nodes


def scans_of_payments(nodes: list[dict]) -> list[tuple[str, str | None]]:
    return [
        (n["Node Type"], n.get("Index Name")) for n in nodes if n.get("Relation Name") == "payments_scheduledpayment"
    ]


def test_fence_and_cas_look_payments_up_by_primary_key_under_stale_statistics():
    loader.load_accounts(accounts=50)
    loader.load_payments(payments=3000, accounts=50, due_at=timezone.now() - timedelta(seconds=1))
    with connection.cursor() as cur:
        cur.execute("ANALYZE payments_scheduledpayment")  # statistics: nothing is EXECUTING
    claims = [claim_due(batch=500, lease_seconds=60) for _ in range(5)]  # now 2,500 are
    pairs = claims[-1].fresh
    ids, attempts = [p[0] for p in pairs], [p[1] for p in pairs]

    lock_scans = scans_of_payments(plan_nodes(sql.LOCK_FENCED, fence_params(ids, attempts)))
    finish_scans = scans_of_payments(plan_nodes(sql.FINISH_FENCED, fence_params(
        ids, attempts, statuses=["EXECUTED"] * len(ids), reasons=[""] * len(ids),
        executed_ats=[timezone.now()] * len(ids), review_reasons=[""] * len(ids),
        next_attempt_ats=[None] * len(ids),
    )))
    # (On a table this small a sequential scan may be the cheapest plan; on a large one
    # the planner, which knows the table's size, uses the primary key.)
    for scans in (lock_scans, finish_scans):
        assert scans, "the plan reads the payments table"
        for _node_type, index in scans:
            assert index != "payments_lease_idx", "a scan of every in-flight payment"



def prepared(fragment: str, *, without: str = "") -> str:
    """The name under which this connection prepared the statement containing ``fragment``
    (and not ``without``): common.db.bound_cursor prepares every statement it runs."""
    with connection.cursor() as cur:
        cur.execute("SELECT name FROM pg_prepared_statements WHERE statement LIKE %s AND statement NOT LIKE %s",
                    [f"%{fragment}%", f"%{without}%" if without else ""])
        names = [row[0] for row in cur.fetchall()]
    assert len(names) == 1, (fragment, names)
    return names[0]


def generic_plan(name: str, params: list) -> list[dict]:
    """The nodes of the generic plan of prepared statement ``name`` (the plan PostgreSQL
    may keep for every later run, whatever the parameters), run with these parameters
    (inside the test's transaction) for the rows each node read."""
    with connection.cursor() as cur:
        cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
    try:
        return plan_nodes(f"EXECUTE {name}({', '.join(['%s'] * len(params))})", params, analyze=True)
    finally:
        with connection.cursor() as cur:
            cur.execute("SET LOCAL plan_cache_mode = auto")


def test_the_prepared_statements_generic_plans_stay_o_batch_as_the_tables_grow():
    # The executor's statements are prepared (common.db.bound_cursor) and run with the
    # plans made for them; PostgreSQL may keep one generic plan, made before the
    # in-flight rows and the start markers grew. Made here on statistics that say no
    # payment is executing, and read after 2,500 are: no statement reads the lease
    # index or the whole payments table, and the account lock probes the accounts' primary
    # key once per id (a bitmap of "id = ANY($1)" rechecks each row it locks against the
    # whole array: docs/decisions/0013-prepared-statements-accounts-by-join.md, "Measured").
    loader.load_accounts(accounts=2000)
    loader.load_payments(payments=3000, accounts=2000, due_at=timezone.now() - timedelta(seconds=1))
    with connection.cursor() as cur:
        cur.execute("ANALYZE payments_scheduledpayment")
        cur.execute("ANALYZE ledger_account")
    first = claim_due(batch=100, lease_seconds=60)
    run_batch(first.fresh, worker="plans")  # prepares the statements
    claims = [claim_due(batch=500, lease_seconds=60) for _ in range(5)]  # now 2,500 are in flight
    pairs = claims[-1].fresh
    ids, attempts = [p[0] for p in pairs], [p[1] for p in pairs]
    expected = ["EXECUTING"] * len(ids)

    fence = generic_plan(prepared("FOR NO KEY UPDATE OF p"), [ids, attempts, expected])
    finish = generic_plan(prepared("SET status = v.status"), [
        ids, attempts, expected, ["EXECUTED"] * len(ids), [""] * len(ids), [timezone.now()] * len(ids),
        [""] * len(ids), [None] * len(ids),
    ])
    for nodes in (fence, finish):
        assert scans_of_payments(nodes), "the plan reads the payments table"
        assert "payments_lease_idx" not in {index for _node, index in scans_of_payments(nodes)}
        # The generic plan cannot prune the partitions when it is made: it may scan those
        # that hold no rows, never one that does.
        read = [n["Actual Rows"] + n.get("Rows Removed by Filter", 0) for n in nodes
                if n.get("Relation Name") == "payments_scheduledpayment" and n["Node Type"] == "Seq Scan"]
        assert not any(read), read

    accounts = sorted({a for p in Payment.objects.filter(pk__in=ids) for a in (p.from_account_id, p.to_account_id)})
    reads_of_accounts = "a.kind, a.status, a.balance"
    for name in (prepared(reads_of_accounts, without="FOR NO KEY"), prepared("FOR NO KEY UPDATE OF a")):
        nodes = generic_plan(name, [accounts])
        reads = [(n["Node Type"], n.get("Index Name")) for n in nodes if n.get("Relation Name") == "ledger_account"]
        assert reads == [("Index Scan", "ledger_account_pkey")], reads


def test_no_plain_index_leads_with_execute_at():
    # The claim's "status = 'SCHEDULED' AND execute_at <= now() ORDER BY execute_at, id"
    # must walk the partial due index. Give the planner a plain index leading with
    # execute_at and, under statistics taken before a burst (every row SCHEDULED), it
    # may pick that one and filter its way through every executed row of the past: the
    # 2M-row backlog benchmark measured exactly that (claim 1.38x slower). Nothing but a
    # partial index may lead with execute_at.
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT i.relname
              FROM pg_index x
              JOIN pg_class i ON i.oid = x.indexrelid
              JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0]
             WHERE x.indrelid = 'payments_scheduledpayment'::regclass
               AND a.attname = 'execute_at' AND x.indpred IS NULL
            """
        )
        assert cur.fetchall() == []


def test_the_claim_reads_only_its_partial_indexes_under_stale_statistics():
    # payments_finished_idx (execute_at of every finished row, for the admin) must never
    # serve the claim: its predicate contradicts both of the claim's scans. (One on
    # "status <> 'SCHEDULED'" served the expired-lease scan, which under these
    # statistics believes it empty, and would walk every executed row of the past.)
    loader.load_accounts(accounts=50)
    loader.load_payments(payments=3000, accounts=50, due_at=timezone.now() - timedelta(seconds=1))
    with connection.cursor() as cur:
        cur.execute("ANALYZE payments_scheduledpayment")  # statistics: every row SCHEDULED
    claim_due(batch=2500, lease_seconds=60)
    scans = scans_of_payments(plan_nodes(sql.CLAIM_DUE, claim_params(batch=500, lease_seconds=60, actor="t")))
    indexes = {index for _node, index in scans if index}
    assert "payments_due_idx" in indexes
    assert indexes <= {"payments_due_idx", "payments_retry_idx", "payments_lease_idx", "payments_scheduledpayment_pkey"}


@pytest.mark.parametrize("statement", [sql.CLAIM_DUE, sql.CLAIM_DUE_SHARD])
def test_the_claim_updates_its_rows_by_primary_key_never_reading_the_whole_table(statement):
    # Joined to its due rows alone, the claim's UPDATE was planned (statistics of a
    # small table, sorting priced last by CLAIM_SESSION) as a hash of every row of every
    # partition: 20,000 rows read to update 500, on every claim.
    loader.load_accounts(accounts=50)
    loader.load_payments(payments=5000, accounts=50, due_at=timezone.now() - timedelta(seconds=1))
    with connection.cursor() as cur:
        cur.execute("ANALYZE payments_scheduledpayment")
        cur.execute(sql.CLAIM_SESSION)
    params = {**claim_params(batch=500, lease_seconds=60, actor="t"), "shard_low": 0, "shard_high": 2**31}
    nodes = plan_nodes(statement, params, analyze=True)
    read = [(n["Node Type"], n["Actual Rows"]) for n in nodes
            if n.get("Relation Name") == "payments_scheduledpayment" and n["Node Type"] == "Seq Scan"]
    assert all(rows <= 500 for _node, rows in read), read


PARTIAL_INDEXES = {"payments_due_idx", "payments_retry_idx", "payments_lease_idx", "payments_finished_idx"}


def whole_table_reads(queryset) -> list[tuple[str, str | None]]:
    """The scans of the payments table in ``queryset``'s plan, sequential scans priced
    out, that read every row: a sequential scan (no index could serve the query), or any
    index but the partial indexes of the due-time views and primary-key lookups (another
    index is walked whole, its condition on a column that does not lead it). A partial
    index whose predicate a query does not repeat cannot serve it; what remains reads
    the whole table at any size."""
    from django.db import transaction

    query_sql, params = queryset.query.sql_with_params()
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        nodes = plan_nodes(query_sql, params)
    whole = []
    for n in nodes:
        if n.get("Relation Name") != "payments_scheduledpayment" and n["Node Type"] != "Bitmap Index Scan":
            continue
        index = n.get("Index Name")
        if n["Node Type"] == "Seq Scan":
            whole.append((n["Node Type"], None))
        elif index and index not in PARTIAL_INDEXES and not (index.endswith("_pkey") and "Index Cond" in n):
            whole.append((n["Node Type"], index))  # e.g. (from_account_id, execute_at) walked for execute_at
    return whole


def test_the_consoles_due_time_views_are_served_by_partial_indexes():
    """The overdue filter, "due today" and the date drill-down's bounds read
    payments_due_idx, payments_retry_idx, payments_lease_idx and payments_finished_idx,
    never the whole table: each arm repeats its index's predicate (SCHEDULED rows are two
    arms, with and without a next attempt). Without the split the overdue filter and the
    bounds read all 1M rows (180 ms each)."""
    from payments.models import ScheduledPayment
    from payments.selectors import _execute_at_arms, payment_due_today_condition, payment_overdue_condition

    # Statistics of a table with rows, taken here: on an empty table's the planner walks
    # the primary key instead, and the statistics a test found were those another test's
    # rolled-back burst had left (ANALYZE's row estimate outlives a rollback) or none, in a
    # fresh database: the test passed or failed with the order the tests ran in.
    loader.load_accounts(accounts=20)
    loader.load_payments(payments=20000, accounts=20, due_at=timezone.now() + timedelta(hours=1))
    with connection.cursor() as cur:
        cur.execute("ANALYZE payments_scheduledpayment")
    rows = ScheduledPayment.objects.all()
    assert whole_table_reads(rows.filter(payment_overdue_condition())) == []
    assert whole_table_reads(rows.filter(payment_due_today_condition())) == []
    for arm in _execute_at_arms(rows):
        assert whole_table_reads(arm.order_by("execute_at")[:1]) == [], arm.query
        assert whole_table_reads(arm.order_by("-execute_at")[:1]) == [], arm.query


def test_the_due_inflow_reads_only_the_due_index():
    """delaypay_due_inflow_per_second is read at every scrape: its count repeats
    payments_due_idx's predicate, so it walks one range of that index (sequential scans
    priced out, as whole_table_reads does: on an empty table the planner would take one)."""
    from django.db import transaction

    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        scans = scans_of_payments(plan_nodes(sql_readings.DUE_INFLOW, [120]))
    assert scans and {index for _node, index in scans} == {"payments_due_idx"}


@pytest.mark.parametrize("session", [sql.CLAIM_SESSION, None])
def test_the_fair_claim_walks_the_partitions_in_due_order_never_sorting_the_backlog(session, settings):
    """The schedule is partitioned (payments/partitions.py): the fair claim's walk merges
    every partition's due index in order (sql.CLAIM_SESSION). Under statistics taken before
    the burst the planner otherwise prices "read every due row, then sort" as cheap, and
    the walk reads and sorts the whole backlog to take its entries."""
    loader.load_accounts(accounts=20)
    loader.load_payments(payments=20000, accounts=20, due_at=timezone.now() - timedelta(seconds=1))
    with connection.cursor() as cur:
        cur.execute("ANALYZE payments_scheduledpayment")
    fair = FairWalk(cap=50)
    for _ in range(2):  # the hot senders found, the walk's cursor moved on
        claim_due(batch=500, lease_seconds=60, fair=fair)
    params = {**claim_params(batch=500, lease_seconds=60, actor="t"), **Shard.ALL.params(), **fair.params(500)}
    if session:
        with connection.cursor() as cur:
            cur.execute(session)
    sorted_rows = max((n["Actual Rows"] for n in plan_nodes(sql.CLAIM_DUE_FAIR, params, analyze=True)
                       if n["Node Type"] == "Sort"), default=0)
    if session:
        assert sorted_rows <= 500  # the claimed rows, for the answer; never the backlog
    else:
        assert sorted_rows > 500  # what the setting prevents (the test would pass for nothing else)


def test_the_claims_planner_setting_does_not_outlive_the_claim():
    loader.load_accounts(accounts=5)
    loader.load_payments(payments=50, accounts=5, due_at=timezone.now() - timedelta(seconds=1))
    for fair in (None, FairWalk(cap=50)):
        claim_due(batch=10, lease_seconds=60, fair=fair)  # inside the test's transaction
        with connection.cursor() as cur:
            cur.execute("SHOW enable_sort")
            assert cur.fetchone()[0] == "on"
