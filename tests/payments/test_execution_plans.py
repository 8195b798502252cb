"""The fence and the CAS must stay O(batch) however many payments are in flight, even
while the planner's statistics still say none are (a burst outruns autovacuum)."""

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from devtools.bench import loader
from payments import sql
from payments.execution import fence_params
from payments.promoter import claim_due, claim_params

pytestmark = pytest.mark.django_db


def plan_nodes(sql: str, params: dict) -> list[dict]:
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        plan = cur.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    nodes, stack = [], [plan[0]["Plan"]]
    while stack:
        node = stack.pop()
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
