"""Quantiles from cumulative histogram buckets, the way Prometheus' histogram_quantile() estimates them.

Both readers must agree with each other and with dashboards, so this mirrors Prometheus' bucketQuantile:
linear interpolation inside the bucket that holds the rank, the lowest bucket starting at 0, and the
highest finite bound returned when the rank falls into +Inf.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def bucket_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """q-quantile of (upper bound, cumulative count) pairs; None when the histogram holds nothing."""
    ordered = sorted(buckets)
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]):
        return None
    # Counts can dip between buckets when a window straddles a scrape; force them monotonic like Prometheus.
    monotonic: list[tuple[float, float]] = []
    running = 0.0
    for bound, count in ordered:
        running = max(running, count)
        monotonic.append((bound, running))
    total = monotonic[-1][1]
    if total <= 0:
        return None
    rank = q * total
    index = next(i for i, (_, count) in enumerate(monotonic) if count >= rank)
    if index == len(monotonic) - 1:
        return monotonic[-2][0]
    upper, count = monotonic[index]
    if index == 0 and upper <= 0:
        return upper
    lower, below = (0.0, 0.0) if index == 0 else monotonic[index - 1]
    in_bucket = count - below
    if in_bucket <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / in_bucket
