"""payments/scaling.py: the worker processes the fleet needs (delaypay_workers_needed) and
the per-process rate it divides by. Pure functions; the gauge itself is tested through
/metrics in tests/ops/test_metrics.py."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.samples import Sample

from payments.scaling import ApplyTotals, apply_totals, measured_process_rate, workers_needed
from tests.scale import scaled

DEFAULTS = {"process_rate": 2000.0, "drain_seconds": 60.0, "target_utilization": 0.7, "minimum": 1, "maximum": 64}


def needed(inflow: float = 0.0, backlog: float = 0.0, **overrides) -> int:
    return workers_needed(inflow_per_second=inflow, backlog=backlog, **{**DEFAULTS, **overrides})


def test_nothing_due_needs_the_minimum():
    assert needed() == 1
    assert needed(minimum=0) == 0
    assert needed(minimum=3) == 3


def test_the_inflow_is_divided_by_what_a_process_carries_at_the_target_utilization():
    # One process carries 2000 x 0.7 = 1400 payments/s.
    assert needed(inflow=1) == 1
    assert needed(inflow=1400) == 1  # exactly one process's share: not rounded up to two
    assert needed(inflow=1401) == 2
    assert needed(inflow=14_000) == 10
    assert needed(inflow=14_000, target_utilization=1.0) == 7


def test_the_backlog_is_drained_within_the_drain_time():
    assert needed(backlog=84_000) == 1  # 84,000 / 60 s = 1400/s
    assert needed(backlog=84_001) == 2
    assert needed(backlog=84_000, drain_seconds=30) == 2
    # Both at once: 1400/s falling due and 1400/s of backlog to drain.
    assert needed(inflow=1400, backlog=84_000) == 2


def test_the_answer_is_bounded_by_the_maximum_whatever_the_inputs():
    assert needed(inflow=10**9) == 64
    assert needed(backlog=10**12, maximum=5) == 5
    assert needed(inflow=math.inf) == 64
    assert needed(inflow=math.nan) == 64  # an unreadable input scales out, not in


def test_negative_inputs_count_as_nothing_due():
    assert needed(inflow=-5, backlog=-100) == 1


@settings(max_examples=scaled(200))
@given(
    inflow=st.floats(0, 1e7), more_inflow=st.floats(0, 1e7),
    backlog=st.integers(0, 10**9), more_backlog=st.integers(0, 10**9),
    rate=st.floats(1, 1e5), utilization=st.floats(0.05, 1), minimum=st.integers(0, 10), span=st.integers(0, 100),
)
def test_more_work_never_needs_fewer_processes_and_stays_within_bounds(
    inflow, more_inflow, backlog, more_backlog, rate, utilization, minimum, span
):
    bounds = {"process_rate": rate, "target_utilization": utilization, "minimum": minimum, "maximum": minimum + span}
    less = needed(inflow=inflow, backlog=backlog, **bounds)
    more = needed(inflow=inflow + more_inflow, backlog=backlog + more_backlog, **bounds)
    assert minimum <= less <= more <= minimum + span


def test_apply_totals_count_the_payments_of_applied_batches_not_errors():
    samples = [
        Sample("delaypay_executed_total", {"outcome": "executed", "reason": ""}, 900),
        Sample("delaypay_executed_total", {"outcome": "failed", "reason": "insufficient_funds"}, 90),
        Sample("delaypay_executed_total", {"outcome": "stale", "reason": ""}, 10),
        Sample("delaypay_executed_total", {"outcome": "error", "reason": ""}, 7),
        Sample("delaypay_executed_created", {"outcome": "executed", "reason": ""}, 1.7e9),
        Sample("delaypay_batch_apply_seconds_sum", {}, 0.5),
        Sample("delaypay_batch_apply_seconds_count", {}, 2),
        Sample("delaypay_batch_apply_seconds_bucket", {"le": "+Inf"}, 2),
    ]
    assert apply_totals(samples) == ApplyTotals(payments=1000, seconds=0.5, batches=2)


@pytest.mark.parametrize(
    ("totals", "rate"),
    [
        (ApplyTotals(payments=30_000, seconds=12.0, batches=40), 2500.0),  # 750 a batch, 12 s: measured
        (ApplyTotals(payments=30_000, seconds=9.9, batches=40), None),  # too little applying yet
        (ApplyTotals(payments=300, seconds=30.0, batches=300), None),  # a quiet hour's one-payment batches
        (ApplyTotals(payments=0, seconds=0.0, batches=0), None),  # no worker on this host
    ],
)
def test_a_rate_is_measured_only_under_load(totals, rate):
    assert measured_process_rate(totals, full_batch=1000) == rate
