"""How many examples the property tests draw and how many rounds the race tests run.

``make test`` (and CI) runs each at its full count. ``make test-fast`` sets
DELAYPAY_TEST_SCALE=0.2: every test still runs, each at a fifth of its count (at least
its ``least``), so the loop between two changes stays short; docs/reference/tests.md.
"""

import os

SCALE = float(os.environ.get("DELAYPAY_TEST_SCALE") or 1)
if not 0 < SCALE <= 1:
    raise ValueError(f"DELAYPAY_TEST_SCALE must be in (0, 1], not {SCALE}")


def scaled(count: int, least: int = 5) -> int:
    """``count`` at this run's scale: ``count`` itself in a full run."""
    return count if SCALE == 1 else max(min(least, count), round(count * SCALE))
