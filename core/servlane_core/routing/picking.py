"""Weighted, optionally sticky choice of a backend among a route's ready ones.

A sticky id (X-Request-ID or the `user` field) hashes into one of 100 buckets, and the buckets are laid
out along the cumulative weights, so the same id always lands on the same version while the weights
stay put, and a canary at 5% gets the ids of buckets 95..99 (about 5% of ids).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Collection

from servlane_core.routing.routes import Backend, Route, weighted_candidates

BUCKETS = 100


def bucket_of(sticky_id: str) -> int:
    digest = hashlib.sha256(sticky_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def _candidates(route: Route, exclude: Collection[str]) -> tuple[tuple[Backend, ...], tuple[int, ...]]:
    if not exclude:
        return route.candidates  # worked out once per route
    return weighted_candidates(b for b in route.backends if b.model not in exclude)


def ready_backends(route: Route, exclude: Collection[str] = ()) -> list[Backend]:
    """Ready backends with a positive weight; if all ready ones have weight 0, they share equally, so a
    feature whose weighted backends are all down still answers from whatever is up."""
    return list(_candidates(route, exclude)[0])


def effective_weights(route: Route) -> dict[str, float]:
    """Each backend's share in percent after renormalising over the ready ones (0 for the others); a model a
    split names twice gets both its weights (it takes both shares of the traffic)."""
    ready, weights = route.candidates
    total = sum(weights)
    shares = {b.model: 0.0 for b in route.backends}
    for backend, weight in zip(ready, weights, strict=True):
        shares[backend.model] += 100.0 * weight / total
    return shares


def pick_backend(
    route: Route,
    sticky_id: str | None = None,
    exclude: Collection[str] = (),
    rng: random.Random | None = None,
) -> Backend | None:
    """The backend for one request, or None when no backend is ready."""
    candidates, weights = _candidates(route, exclude)
    if len(candidates) <= 1:
        return candidates[0] if candidates else None  # one: whatever the sticky id or the draw
    total = sum(weights)
    # Sticky: the bucket's midpoint, scaled onto the weights (bucket k covers [k, k+1) percent of the total).
    point = (bucket_of(sticky_id) + 0.5) * total / BUCKETS if sticky_id else (rng or random).random() * total
    cumulative = 0.0
    for backend, weight in zip(candidates, weights, strict=True):
        cumulative += weight
        if point < cumulative:
            return backend
    return candidates[-1]
