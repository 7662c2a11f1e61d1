"""Weighted, optionally sticky choice of a backend among a route's ready ones.

A sticky id (X-Request-ID or the `user` field) hashes into one of 100 buckets, and the buckets are laid
out along the cumulative weights, so the same id always lands on the same version while the weights
stay put, and a canary at 5% gets the ids of buckets 95..99 (about 5% of ids).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Collection, Sequence

from servlane_core.routing.routes import Backend, Route

BUCKETS = 100


def bucket_of(sticky_id: str) -> int:
    digest = hashlib.sha256(sticky_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def ready_backends(route: Route, exclude: Collection[str] = ()) -> list[Backend]:
    """Ready backends with a positive weight; if all ready ones have weight 0, they share equally, so a
    feature whose weighted backends are all down still answers from whatever is up."""
    if not exclude:
        return list(route.candidates[0])
    ready = [b for b in route.backends if b.ready and b.model not in exclude]
    weighted = [b for b in ready if b.weight > 0]
    return weighted or ready


def _weights(candidates: Sequence[Backend]) -> list[int]:
    return [b.weight for b in candidates] if any(b.weight > 0 for b in candidates) else [1] * len(candidates)


def effective_weights(route: Route) -> dict[str, float]:
    """Each backend's share in percent after renormalising over the ready ones (0 for the others)."""
    ready = ready_backends(route)
    weights = _weights(ready)
    total = sum(weights)
    shares = {b.model: 0.0 for b in route.backends}
    for backend, weight in zip(ready, weights, strict=True):
        shares[backend.model] = 100.0 * weight / total
    return shares


def pick_backend(
    route: Route,
    sticky_id: str | None = None,
    exclude: Collection[str] = (),
    rng: random.Random | None = None,
) -> Backend | None:
    """The backend for one request, or None when no backend is ready."""
    if exclude:
        candidates: Sequence[Backend] = ready_backends(route, exclude)
        weights: Sequence[int] = _weights(candidates)
    else:
        candidates, weights = route.candidates  # worked out once per route
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
