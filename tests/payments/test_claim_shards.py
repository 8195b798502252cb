"""Claim shards (issue 17; DELAYPAY_CLAIM_SHARDS, promoter.Shard, sql.CLAIM_DUE_SHARD).

With K shards the beat sends K ticks a period and each claims only the due rows whose id
hashes to its shard, so several promoter processes claim side by side. What must hold:
the shards split the due rows exactly (every row in one shard, none in two), each shard's
claim keeps due order and the fence and audit of the plain claim, a tick of one shard
takes at most its share of the in-flight cap, and a tick of every shard (degraded mode)
still claims everything.
"""

import json
import subprocess  # nosec B404: only for the CompletedProcess type
from datetime import timedelta
from functools import partial

import pytest
from django.db import connection
from django.utils import timezone

from payments import collector, promoter, sql, tasks
from payments.models import Heartbeat, PaymentEvent, PaymentStatus, ScheduledPayment
from payments.promoter import FairWalk, Shard, claim_and_publish, claim_due, claim_params, run_tick
from tests.concurrency import Racers
from tests.factories import bulk_due_payments, funded_account
from tests.payments.test_execution_plans import plan_nodes
from tests.settings_child import settings_in_child


@pytest.fixture(autouse=True)
def _no_carried_walk():
    promoter._carried.walks = {}
    yield
    promoter._carried.walks = {}


def shard_of_each(shards: int, *, status: str = "SCHEDULED") -> dict[str, int]:
    """Every payment's shard (of those in ``status``), from the hash the claim filters on."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT id, {sql.SHARD_HASH} FROM payments_scheduledpayment WHERE status = %s", [status])
        hashes = dict(cur.fetchall())
    bounds = [(index, Shard(index, shards).params()) for index in range(shards)]
    return {
        pid: next(index for index, b in bounds if b["shard_low"] <= h < b["shard_high"]) for pid, h in hashes.items()
    }


def drain(shard: Shard, *, batch: int = 50, fair: bool = False) -> list[list[tuple[str, int]]]:
    walk = FairWalk(cap=10) if fair else None
    claims = []
    while True:
        claim = claim_due(batch=batch, lease_seconds=60, fair=walk, shard=shard)
        if not claim and not (walk is not None and walk.more):
            return claims
        claims.append(claim.fresh + claim.reclaimed)


def due_rows(count: int = 400):
    source, target = funded_account(), funded_account()
    bulk_due_payments(source=source, target=target, count=count)
    return source, target


@pytest.mark.django_db
@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])
def test_the_shards_split_the_due_rows_exactly_each_in_due_order(fair):
    due_rows(400)
    expected = shard_of_each(4)
    seen: dict[str, int] = {}
    for index in range(4):
        claims = drain(Shard(index, 4), fair=fair)
        taken = [pid for claim in claims for pid, _ in claim]
        assert taken, f"shard {index} of 4 claimed nothing out of 400 rows"
        assert all(expected[pid] == index for pid in taken)
        assert not set(taken) & set(seen)
        seen.update(dict.fromkeys(taken, index))
        rows = ScheduledPayment.objects.filter(pk__in=taken).order_by("execute_at", "id").values_list("id", flat=True)
        assert taken == list(rows), "a shard's claims are not in due order"
    assert seen.keys() == expected.keys()
    assert not ScheduledPayment.objects.filter(status=PaymentStatus.SCHEDULED).exists()
    # Fenced and audited as the plain claim: attempt 1, and no claim event (a first claim
    # writes none; a second would have raised the attempt and written "reclaimed").
    assert set(ScheduledPayment.objects.values_list("attempt", flat=True)) == {1}
    assert not PaymentEvent.objects.filter(kind__in=[PaymentEvent.Kind.CLAIMED, PaymentEvent.Kind.RECLAIMED]).exists()


@pytest.mark.django_db
def test_a_shard_reclaims_only_its_own_expired_leases():
    due_rows(100)
    claim_due(batch=100, lease_seconds=60)  # everything EXECUTING, unsharded
    ScheduledPayment.objects.update(lease_until=timezone.now() - timedelta(hours=1))  # expired
    by_shard = shard_of_each(2, status="EXECUTING")
    claim = claim_due(batch=100, lease_seconds=60, shard=Shard(1, 2))
    assert claim.reclaimed and not claim.fresh
    assert {pid for pid, _ in claim.reclaimed} == {pid for pid, s in by_shard.items() if s == 1}
    assert {attempt for _, attempt in claim.reclaimed} == {2}


@pytest.mark.django_db(transaction=True)
def test_shards_claimed_at_once_by_several_promoters_take_each_payment_once():
    due_rows(1200)
    # Two promoters per shard: a shard's tick taken twice (a slow tick and the next) is
    # harmless too, SKIP LOCKED as ever.
    shards = [Shard(index, 2) for index in (0, 1, 0, 1)]
    with Racers(4) as racers:
        results = racers.run(*[partial(drain, shard) for shard in shards])
    assert not any(isinstance(r, Exception) for r in results), results
    taken = [pid for claims in results for claim in claims for pid, _ in claim]
    assert len(taken) == len(set(taken)) == 1200
    assert not ScheduledPayment.objects.filter(status=PaymentStatus.SCHEDULED).exists()


@pytest.mark.django_db
def test_a_shard_tick_takes_its_share_of_the_in_flight_cap_and_no_more():
    due_rows(400)
    published = []
    result = claim_and_publish(publish=published.extend, execute_in_process=None, batch=50, in_flight_cap=100,
                           shard=Shard(0, 4))
    assert result.claimed == 25  # a quarter of the room
    assert result.in_flight == 25
    # With 25 in flight, the next shard's share is a quarter of the 75 left.
    result = claim_and_publish(publish=published.extend, execute_in_process=None, batch=50, in_flight_cap=100,
                           shard=Shard(1, 4))
    assert result.claimed == 18


@pytest.mark.django_db
def test_a_tick_of_every_shard_claims_everything_and_beats_for_each(settings):
    """Degraded mode ticks unsharded whatever DELAYPAY_CLAIM_SHARDS says: nothing is left
    in a shard nobody serves, and every shard's heartbeat says it was served."""
    settings.DELAYPAY_CLAIM_SHARDS = 3
    due_rows(120)
    result = run_tick(degraded=True)
    assert result.claimed == result.executed_in_process == 120
    assert not ScheduledPayment.objects.filter(status__in=[PaymentStatus.SCHEDULED, PaymentStatus.EXECUTING]).exists()
    names = set(Heartbeat.objects.values_list("name", flat=True))
    assert {Heartbeat.shard_name(index) for index in range(3)} <= names


@pytest.mark.django_db
def test_every_tick_records_its_shard_heartbeat_and_the_metrics_read_them(settings):
    settings.DELAYPAY_CLAIM_SHARDS = 3
    tasks.promoter_tick(shard=1, shards=3)
    names = set(Heartbeat.objects.values_list("name", flat=True))
    assert {Heartbeat.PROMOTER, Heartbeat.shard_name(1)} <= names
    assert Heartbeat.shard_name(0) not in names
    families = {f.name: f for f in collector.ScheduleCollector(counts_max_age=0).collect()}
    ages = {s.labels["shard"]: s.value for s in families["delaypay_promoter_shard_last_tick_age_seconds"].samples}
    assert ages["1"] < 60
    assert ages["0"] == ages["2"] == float("inf")
    settings.DELAYPAY_CLAIM_SHARDS = 1
    families = {f.name for f in collector.ScheduleCollector(counts_max_age=0).collect()}
    assert "delaypay_promoter_shard_last_tick_age_seconds" not in families


@pytest.mark.django_db
def test_only_the_first_shard_generates_recurring_payments_and_claims_payouts(monkeypatch):
    calls = []
    monkeypatch.setattr(promoter, "FIRST_SHARD_HOOKS", [lambda: calls.append("recurring")])
    monkeypatch.setattr(promoter, "payouts_tick", lambda **_: calls.append("payouts"))
    run_tick(shard=Shard(1, 2))
    assert calls == []
    run_tick(shard=Shard(0, 2))
    assert calls == ["recurring", "payouts"]


@pytest.mark.django_db
def test_a_sharded_claim_walks_the_due_index_in_order_not_every_due_row():
    """With the hash's statistics (migration 0016) the planner knows a shard holds ~1/K of
    the due rows and walks payments_due_idx in order, stopping after the batch; under its
    default guess (0.5 %) it bitmap-scans every due row and sorts them: O(backlog)."""
    due_rows(3000)
    with connection.cursor() as cur:
        cur.execute("ANALYZE payments_scheduledpayment")
    params = {**claim_params(batch=50, lease_seconds=60), **Shard(2, 4).params()}
    nodes = plan_nodes(sql.CLAIM_DUE_SHARD, params, analyze=True)
    scans = [n for n in nodes if n.get("Relation Name") == "payments_scheduledpayment"]
    assert not [n for n in scans if n["Node Type"].startswith("Bitmap")]
    fresh = [n for n in scans if n.get("Index Name") == "payments_due_idx"]
    # One ordered index scan per partition (payments/partitions.py), merged in due order.
    assert fresh and {n["Node Type"] for n in fresh} == {"Index Scan"}
    # About K entries visited per row taken (the filter drops the other shards' rows).
    assert sum(n["Actual Rows"] for n in fresh) == 50
    assert sum(n["Actual Rows"] + n.get("Rows Removed by Filter", 0) for n in fresh) < 50 * 4 * 2


def test_a_shard_outside_the_count_is_refused():
    for index, count in ((2, 2), (-1, 2), (0, 0)):
        with pytest.raises(ValueError, match="does not exist"):
            Shard(index, count)


def beat_schedule(value: str | None) -> subprocess.CompletedProcess:
    code = ("import json; from django.conf import settings; print(json.dumps({k: v.get('kwargs') "
            "for k, v in settings.CELERY_BEAT_SCHEDULE.items() if v['task'] == 'payments.tasks.promoter_tick'}))")
    return settings_in_child(code, DELAYPAY_CLAIM_SHARDS=value)


@pytest.mark.processes
def test_the_beat_sends_one_tick_per_shard_each_naming_its_shard_and_the_count():
    result = beat_schedule(None)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"promoter-tick": {"shard": 0, "shards": 1}}
    result = beat_schedule("3")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "promoter-tick": {"shard": 0, "shards": 3},
        "promoter-tick-shard-1": {"shard": 1, "shards": 3},
        "promoter-tick-shard-2": {"shard": 2, "shards": 3},
    }


@pytest.mark.processes
@pytest.mark.parametrize("value", ["0", "65", "two"])
def test_the_shard_count_setting_refuses_anything_else(value):
    result = beat_schedule(value)
    assert result.returncode != 0
    assert "DELAYPAY_CLAIM_SHARDS" in result.stderr
