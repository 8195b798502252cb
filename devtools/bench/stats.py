"""Percentiles and per-second series: plain functions over lists of floats."""

import math
from collections.abc import Iterable, Sequence

QUANTILES = (("p50", 50.0), ("p95", 95.0), ("p99", 99.0))


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by linear interpolation between closest ranks
    (numpy's default, "linear"); None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0-100")
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    if low == high:
        return float(ordered[low])
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: Sequence[float], *, digits: int = 3) -> dict[str, float | None]:
    """``{p50, p95, p99, max}`` of ``values``, rounded; every field None for no values."""
    ordered = sorted(values)
    out: dict[str, float | None] = {}
    for name, q in QUANTILES:
        p = percentile(ordered, q)
        out[name] = None if p is None else round(p, digits)
    out["max"] = round(float(ordered[-1]), digits) if ordered else None
    return out


def per_second(times: Iterable[float], *, start: float, end: float | None = None) -> list[int]:
    """How many of ``times`` (seconds) fall in each whole second from ``start``:
    bucket i counts start+i <= t < start+i+1. Times before ``start`` go to bucket 0."""
    counts: list[int] = []
    for t in times:
        i = max(0, math.floor(t - start))
        if i >= len(counts):
            counts.extend([0] * (i + 1 - len(counts)))
        counts[i] += 1
    if end is not None:
        needed = max(0, math.ceil(end - start))
        counts.extend([0] * (needed - len(counts)))
    return counts


def bucketed_percentiles(
    points: Iterable[tuple[float, float]], *, start: float, q: float
) -> list[float | None]:
    """For (time, value) points, the ``q``-th percentile of the values in each whole
    second from ``start`` (None for an empty second)."""
    buckets: list[list[float]] = []
    for t, value in points:
        i = max(0, math.floor(t - start))
        if i >= len(buckets):
            buckets.extend([] for _ in range(i + 1 - len(buckets)))
        buckets[i].append(value)
    return [percentile(b, q) for b in buckets]
