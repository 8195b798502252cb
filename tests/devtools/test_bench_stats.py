import pytest

from devtools.bench.stats import bucketed_percentiles, per_second, percentile, summarize


def test_percentile_interpolates_between_closest_ranks_like_numpy_linear():
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 100) == 4.0
    assert percentile(values, 95) == pytest.approx(3.85)


def test_percentile_ignores_input_order_and_handles_one_value():
    assert percentile([9.0, 1.0, 5.0], 50) == 5.0
    assert percentile([7.0], 99) == 7.0


def test_percentile_of_nothing_is_none_and_out_of_range_q_is_refused():
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_reports_p50_p95_p99_and_max():
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert summarize(values) == {"p50": 50.5, "p95": 95.05, "p99": 99.01, "max": 100.0}
    assert summarize([]) == {"p50": None, "p95": None, "p99": None, "max": None}


def test_per_second_counts_each_whole_second_from_the_start():
    assert per_second([10.0, 10.2, 10.99, 11.0, 13.5], start=10.0) == [3, 1, 0, 1]
    # early times fall in the first bucket; `end` pads trailing empty seconds
    assert per_second([9.5], start=10.0, end=12.5) == [1, 0, 0]


def test_bucketed_percentiles_leave_empty_seconds_empty():
    points = [(0.1, 1.0), (0.5, 3.0), (2.2, 10.0)]
    assert bucketed_percentiles(points, start=0.0, q=50) == [2.0, None, 10.0]
