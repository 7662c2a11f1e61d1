"""The gateway's per-request metric writers (gateway_metrics.Observe, Increment) write exactly what
prometheus_client's own observe() and inc() write: they reach into its children, so a library change that
moves those internals fails here, not in a dashboard."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from servlane_api import metric_names as contract
from servlane_gateway.gateway_metrics import Increment, Observe

# Both sides of every bound, the bounds themselves, zero, negatives, the largest and NaN.
BOUNDS = contract.LATENCY_BUCKETS
AMOUNTS = [0.0, -1.0, 1e-9, 1e9, math.inf, math.nan] + [
    b for bound in BOUNDS for b in (bound * 0.999, bound, bound * 1.001)
]


def _exposition(fill: str) -> bytes:
    registry = CollectorRegistry()
    histogram = Histogram("h", "h", ["a"], buckets=BOUNDS, registry=registry)
    counter = Counter("c", "c", ["a"], registry=registry)
    child, count = histogram.labels("x"), counter.labels("x")
    observe = Observe(child).observe if fill == "ours" else child.observe
    inc = Increment(count).inc if fill == "ours" else count.inc
    for amount in AMOUNTS:
        observe(amount)
    inc()  # one, as the gateway counts a request
    for amount in (1, 7, 0, 3.5):
        inc(amount)
    return b"\n".join(line for line in generate_latest(registry).splitlines() if b"_created" not in line)


def test_observations_and_increments_match_prometheus_client() -> None:
    ours, theirs = _exposition("ours"), _exposition("theirs")
    assert b'h_bucket{a="x",le="+Inf"}' in theirs
    assert ours == theirs


def test_an_observation_with_an_exemplar_keeps_it() -> None:
    registry = CollectorRegistry()
    child = Histogram("h", "h", ["a"], buckets=BOUNDS, registry=registry).labels("x")
    Observe(child).observe(0.2, {"trace_id": "abc"})
    exemplars = [s.exemplar for m in registry.collect() for s in m.samples if s.exemplar is not None]
    assert [e.labels for e in exemplars] == [{"trace_id": "abc"}]
