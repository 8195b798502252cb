"""How long to wait before trying again: every retry policy of the product, in one place.

A policy is a *curve* and a *jitter*. The curve gives the step after the n-th failed try
(n counts from 1): a ladder read from a setting (the n-th step; past the end the last
step again, or nothing when the ladder is final and the work is given up), or an
exponential ``base * 2**(n - 1)`` capped. The jitter draws the actual wait around the
step, so that work that failed together does not come back together (the AWS
architecture blog's "Exponential Backoff And Jitter": *full* is uniform in [0, step],
*equal* in [step/2, step]; *spread* is uniform within a fraction either side).

Oban keeps its retry arithmetic in one ``Backoff`` module; so do we. To add a policy,
add a line to the table at the end and call ``POLICY.delay(n)`` where the retry is
decided; the setting a ladder reads is documented in docs/reference/configuration.md.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.conf import settings

Jitter = Callable[[float], float]


def full(step: float) -> float:
    """Uniform in [0, step]: the least synchronised, and some waits are nearly nothing."""
    return random.uniform(0, step)


def equal(step: float) -> float:
    """Uniform in [step/2, step]: never less than half the step."""
    return random.uniform(step / 2, step)


def spread(fraction: float) -> Jitter:
    """Uniform within ``fraction`` of the step either side (0.2: 80 % to 120 %)."""

    def draw(step: float) -> float:
        return random.uniform(step * (1 - fraction), step * (1 + fraction))

    return draw


def ladder_step(steps: Sequence[float], n: int, *, final: bool = False) -> float | None:
    """The step after the ``n``-th failed try (n < 1 counts as 1). Past the ladder's end:
    its last step again, or None when the ladder is ``final``."""
    if not steps:
        raise ValueError("a ladder needs at least one step")
    n = max(n, 1)
    if n > len(steps):
        return None if final else float(steps[-1])
    return float(steps[n - 1])


def exponential_step(n: int, *, base: float, cap: float = math.inf) -> float:
    """``base * 2**(n - 1)`` after the ``n``-th failed try (n < 1 counts as 1), at most ``cap``."""
    n = max(n, 1)
    # 2**(n - 1) grows without bound; past 2**60 every cap we use is reached anyway.
    return min(cap, base * 2 ** min(n - 1, 60))


@dataclass(frozen=True)
class Backoff:
    """A retry policy: ``delay(n)`` is the wait in seconds after the n-th failed try, or
    None when the policy gives up."""

    name: str
    step: Callable[[int], float | None]
    jitter: Jitter

    def delay(self, n: int) -> float | None:
        step = self.step(n)
        return None if step is None else self.jitter(step)

    @classmethod
    def ladder(cls, name: str, setting: str, *, jitter: Jitter, final: bool = False) -> Backoff:
        """Steps read from ``settings.<setting>`` at each call (tests and deployments change it)."""
        return cls(name, lambda n: ladder_step(getattr(settings, setting), n, final=final), jitter)

    @classmethod
    def exponential(cls, name: str, *, base: float, cap: float = math.inf, jitter: Jitter = full) -> Backoff:
        return cls(name, lambda n: exponential_step(n, base=base, cap=cap), jitter)


# --- the policies ------------------------------------------------------------------------
# A payment whose try errored waits for its next try (the executor; decision 0004).
PAYMENT_RETRY = Backoff.ladder("payment_retry", "DELAYPAY_RETRY_DELAYS", jitter=full)
# A payout whose rail answered ambiguously is looked up again (docs/reference/payouts.md).
RAIL_FOLLOW_UP = Backoff.ladder("rail_follow_up", "DELAYPAY_RAIL_FOLLOWUP_DELAYS", jitter=equal)
# A webhook delivery that failed is tried again; past the ladder the delivery fails.
WEBHOOK_RETRY = Backoff.ladder("webhook_retry", "DELAYPAY_WEBHOOK_RETRY_DELAYS", jitter=spread(0.2), final=True)
# A Celery task that hit a transient database error is retried (seconds, not minutes).
TASK_RETRY = Backoff.exponential("task_retry", base=0.5, cap=10.0)
# A batch the database aborted as a deadlock victim is applied again at once, after a pause.
LOCK_CONFLICT = Backoff.exponential("lock_conflict", base=0.02)

POLICIES = (PAYMENT_RETRY, RAIL_FOLLOW_UP, WEBHOOK_RETRY, TASK_RETRY, LOCK_CONFLICT)
