"""How many worker processes the fleet needs now: ``delaypay_workers_needed``, read by an
autoscaler (deploy/kubernetes/: KEDA or a Kubernetes HPA on an external metric).

The work to do, in payments per second, is what falls due next plus the backlog:

    demand   = inflow_per_second + backlog / drain_seconds
    capacity = process_rate * target_utilization            (per worker process)
    needed   = clamp(ceil(demand / capacity), minimum, maximum)

* ``inflow_per_second``: SCHEDULED payments whose execute_at falls within the next
  DELAYPAY_SCALE_INFLOW_WINDOW_SECONDS, divided by that window (a forecast, exact but for
  payments scheduled or cancelled meanwhile: nothing leaves SCHEDULED before it is due).
  Looking ahead lets the fleet grow before a burst rather than after it.
* ``backlog``: what is already due and waiting: overdue SCHEDULED payments and EXECUTING
  ones whose lease expired, to drain within DELAYPAY_SCALE_DRAIN_SECONDS (by default the
  60 s dispatch SLO).
* ``process_rate``: payments one worker process (a prefork child) applies per second of
  applying. Measured from this host's batches (``delaypay_batch_apply_seconds`` and
  ``delaypay_executed_total``) when they were taken under load, else the configured
  DELAYPAY_SCALE_PROCESS_RATE (``measured_process_rate``).
* ``target_utilization``: the share of a process's time the fleet should be busy
  (DELAYPAY_SCALE_TARGET_UTILIZATION), headroom for spikes and for pods still starting.

Nothing due gives ``minimum``; no input, however large, gives more than ``maximum``.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass

# A measurement is trusted after this much applying (seconds, summed over processes).
MIN_MEASURED_APPLY_SECONDS = 10.0
# Outcomes of executed_total that are not payments of an applied batch.
_NOT_APPLIED = {"error"}


@dataclass(frozen=True)
class ApplyTotals:
    """This host's totals since its metrics directory started."""

    payments: float  # payments in the batches applied (delaypay_executed_total, errors aside)
    seconds: float  # time spent applying them (delaypay_batch_apply_seconds_sum)
    batches: float  # batches applied (delaypay_batch_apply_seconds_count)


def apply_totals(samples: Iterable) -> ApplyTotals:
    """``ApplyTotals`` from prometheus_client samples of delaypay_executed and
    delaypay_batch_apply_seconds (common.prometheus.host_samples)."""
    payments = seconds = batches = 0.0
    for sample in samples:
        if sample.name == "delaypay_executed_total" and sample.labels.get("outcome") not in _NOT_APPLIED:
            payments += sample.value
        elif sample.name == "delaypay_batch_apply_seconds_sum":
            seconds += sample.value
        elif sample.name == "delaypay_batch_apply_seconds_count":
            batches += sample.value
    return ApplyTotals(payments=payments, seconds=seconds, batches=batches)


def measured_process_rate(totals: ApplyTotals, *, full_batch: int) -> float | None:
    """Payments a process applied per second of applying, when measured under load: at
    least MIN_MEASURED_APPLY_SECONDS of applying, in batches averaging at least half a full
    claim batch. None otherwise. A batch has a fixed cost (about 25 ms of worker and
    PostgreSQL time, docs/explanation/capacity.md) whatever its size, so the rate of the
    one-payment batches of a quiet hour says little of what a process does in a burst."""
    if totals.seconds < MIN_MEASURED_APPLY_SECONDS or totals.batches <= 0 or totals.payments <= 0:
        return None
    if totals.payments / totals.batches < full_batch / 2:
        return None
    return totals.payments / totals.seconds


def workers_needed(
    *,
    inflow_per_second: float,
    backlog: float,
    process_rate: float,
    drain_seconds: float,
    target_utilization: float,
    minimum: int,
    maximum: int,
) -> int:
    """Worker processes needed to apply the inflow and drain the backlog in time (the
    formula in the module's docstring). ``process_rate``, ``drain_seconds`` and
    ``target_utilization`` are positive (the settings check it)."""
    demand = max(inflow_per_second, 0.0) + max(backlog, 0.0) / drain_seconds
    capacity = process_rate * target_utilization
    if not math.isfinite(demand) or capacity <= 0:
        return maximum
    # The epsilon keeps a demand of exactly n processes (up to float noise) at n, not n + 1.
    needed = math.ceil(demand / capacity - 1e-9)
    return min(max(needed, minimum), maximum)
