"""The fault plan of the chaos run: a pure function of the seed, covering every fault."""

import itertools
import socket

import pytest

from devtools.chaos import (
    MINIMUM_FAULTS,
    OUTAGE_KINDS,
    PAYOUT_FAULTS,
    REPLICA_FAULTS,
    WEBHOOK_FAULTS,
    Options,
    fault_plan,
    plan_digest,
)
from devtools.sandbox import pick_port


def test_a_seed_replays_the_same_fault_schedule():
    assert fault_plan(Options(seed=1234)) == fault_plan(Options(seed=1234))
    assert plan_digest(fault_plan(Options(seed=1234))) != plan_digest(fault_plan(Options(seed=1235)))


@pytest.mark.parametrize("seed", range(20))
def test_every_plan_has_every_fault_and_no_overlapping_outage_of_one_service(seed):
    options = Options(seed=seed, faults=20, window=30)
    plan = fault_plan(options)
    assert len(plan) == 20 + sum(WEBHOOK_FAULTS.values()) + sum(PAYOUT_FAULTS.values())
    for kind, minimum in {**MINIMUM_FAULTS, **WEBHOOK_FAULTS, **PAYOUT_FAULTS}.items():
        assert sum(f.kind == kind for f in plan) >= minimum, kind
    for kinds in OUTAGE_KINDS.values():  # a long broker outage and a Redis restart are one service
        outages = sorted((f.at, f.at + f.duration) for f in plan if f.kind in kinds)
        assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(outages))
    (long_outage,) = (f for f in plan if f.kind == "long_broker_outage")
    assert long_outage.duration == options.broker_outage_seconds
    (gateway_down,) = (f for f in plan if f.kind == "gateway_down")
    assert gateway_down.duration == options.gateway_outage_seconds  # "a minute down"
    pause = next(f for f in plan if f.kind == "pause_worker")
    assert pause.duration > 2 * options.lease_seconds  # the zombie outlives its lease


def test_without_payouts_or_webhooks_the_core_plan_is_the_same():
    core = [f for f in fault_plan(Options(seed=7)) if f.kind in MINIMUM_FAULTS or f.kind in ("kill_child",)]
    alone = fault_plan(Options(seed=7, payouts=0, webhooks=False))
    assert core == alone


def test_too_few_faults_to_cover_every_kind_is_refused():
    assert fault_plan(Options(faults=0)) == []
    with pytest.raises(ValueError, match="at least"):
        fault_plan(Options(faults=sum(MINIMUM_FAULTS.values()) - 1))


def test_pick_port_skips_a_port_in_use():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert pick_port(port) != port


@pytest.mark.parametrize("seconds", [20, 120])
def test_the_long_broker_outage_lasts_as_long_as_asked(seconds):
    plan = fault_plan(Options(seed=3, faults=20, window=30, broker_outage_seconds=seconds))
    (outage,) = (f for f in plan if f.kind == "long_broker_outage")
    assert outage.duration == seconds
    redis_restarts = [f for f in plan if f.kind == "restart_redis"]
    assert all(f.at >= outage.at + seconds or f.at + f.duration <= outage.at for f in redis_restarts)


def test_workers_down_is_one_extra_fault_of_whole_leases_from_the_start():
    alone = fault_plan(Options(faults=0, lease_seconds=5.0, workers_down_leases=10))
    assert [(f.kind, f.at, f.duration) for f in alone] == [("workers_down", 0.5, 50.0)]
    planned = fault_plan(Options(seed=3, lease_seconds=5.0, workers_down_leases=2))
    assert [f.kind for f in planned].count("workers_down") == 1
    assert "workers_down" not in {f.kind for f in fault_plan(Options(seed=3))}


@pytest.mark.parametrize("seed", range(5))
def test_webhook_faults_come_on_top_of_the_same_core_plan(seed):
    """A seed replays the same core plan with or without webhooks: their faults are drawn
    from their own stream."""
    with_hooks = fault_plan(Options(seed=seed, faults=20, window=30))
    without = fault_plan(Options(seed=seed, faults=20, window=30, webhooks=False))
    assert [f for f in with_hooks if f.kind not in WEBHOOK_FAULTS] == without
    assert sorted(f.kind for f in with_hooks if f.kind in WEBHOOK_FAULTS) == sorted(
        kind for kind, n in WEBHOOK_FAULTS.items() for _ in range(n)
    )
    assert all(0.5 <= f.at <= 30 for f in with_hooks if f.kind in WEBHOOK_FAULTS)
    assert [f.kind for f in fault_plan(Options(seed=seed, faults=0))] == []


@pytest.mark.parametrize("seed", range(5))
def test_replica_faults_come_on_top_of_the_same_plan_and_never_overlap(seed):
    """--replica adds its two faults, from their own stream: the replay paused in the first
    half of the window, the standby stopped in the second, so they never overlap."""
    plain = fault_plan(Options(seed=seed, faults=20, window=30))
    with_replica = fault_plan(Options(seed=seed, faults=20, window=30, replica=True))
    assert [f for f in with_replica if f.kind not in REPLICA_FAULTS] == plain
    lag, down = (next(f for f in with_replica if f.kind == kind) for kind in ("replica_lag", "replica_down"))
    assert lag.at + lag.duration < down.at <= 30
    assert [f.kind for f in fault_plan(Options(seed=seed, faults=0, replica=True))] == []

