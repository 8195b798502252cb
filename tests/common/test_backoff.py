"""The retry policies (common/backoff.py): the curves, the jitters, and that each policy
reads its ladder from its setting at call time."""

import pytest

from common import backoff
from common.backoff import Backoff, equal, exponential_step, full, ladder_step, spread


def test_a_ladder_gives_the_nth_step_then_repeats_its_last_or_gives_up_when_final():
    steps = [1, 10, 100]
    assert [ladder_step(steps, n) for n in (0, 1, 2, 3, 4, 9)] == [1, 1, 10, 100, 100, 100]
    assert [ladder_step(steps, n, final=True) for n in (1, 3, 4)] == [1, 100, None]
    with pytest.raises(ValueError):
        ladder_step([], 1)


def test_the_exponential_curve_doubles_from_its_base_up_to_its_cap():
    assert [exponential_step(n, base=0.5, cap=10) for n in (0, 1, 2, 3, 4, 5, 6)] == [0.5, 0.5, 1, 2, 4, 8, 10]
    assert exponential_step(10_000, base=0.02) == 0.02 * 2**60  # bounded, no OverflowError
    assert exponential_step(3, base=1) == 4


@pytest.mark.parametrize(("jitter", "low", "high"), [(full, 0, 10), (equal, 5, 10), (spread(0.2), 8, 12)])
def test_each_jitter_stays_in_its_band_and_spreads_across_it(jitter, low, high):
    draws = [jitter(10) for _ in range(2000)]
    assert all(low <= d <= high for d in draws)
    # Spread over the band, not stuck at one value: both thirds of the band are hit.
    third = (high - low) / 3
    assert any(d < low + third for d in draws) and any(d > high - third for d in draws)


def test_a_ladder_policy_reads_its_setting_at_each_call(settings):
    settings.DELAYPAY_RETRY_DELAYS = [2, 4]
    assert 0 <= backoff.PAYMENT_RETRY.delay(1) <= 2
    settings.DELAYPAY_RETRY_DELAYS = [1000, 2000]
    assert 0 <= backoff.PAYMENT_RETRY.delay(5) <= 2000
    assert any(backoff.PAYMENT_RETRY.delay(5) > 1000 for _ in range(200))


def test_a_final_ladder_gives_up_past_its_end(settings):
    settings.DELAYPAY_WEBHOOK_RETRY_DELAYS = [10, 1000]
    assert 800 <= backoff.WEBHOOK_RETRY.delay(2) <= 1200
    assert backoff.WEBHOOK_RETRY.delay(3) is None


def test_the_follow_up_never_waits_less_than_half_its_step(settings):
    settings.DELAYPAY_RAIL_FOLLOWUP_DELAYS = [4]
    assert all(2 <= backoff.RAIL_FOLLOW_UP.delay(1) <= 4 for _ in range(200))


def test_the_task_and_conflict_curves():
    assert all(0 <= backoff.TASK_RETRY.delay(n) <= 10 for n in range(1, 40))
    assert all(0 <= backoff.LOCK_CONFLICT.delay(1) <= 0.02 for _ in range(100))
    assert all(0 <= backoff.LOCK_CONFLICT.delay(3) <= 0.08 for _ in range(100))


def test_every_policy_has_a_distinct_name_and_is_listed():
    names = [p.name for p in backoff.POLICIES]
    assert len(names) == len(set(names))
    listed = {id(p) for p in backoff.POLICIES}
    assert all(id(v) in listed for v in vars(backoff).values() if isinstance(v, Backoff))
