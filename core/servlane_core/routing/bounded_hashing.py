"""Consistent hashing with bounded loads (CHWBL, Mirrokni et al. 2016) for prefix affinity.

A request's key (a prompt prefix: servlane_core.routing.prompt_prefix) hashes onto a ring where every
endpoint has VNODES points; walking clockwise, the first endpoint whose load is under the bound takes it.
The bound is ceil(LOAD_FACTOR * (requests in flight + 1) / endpoints): so the same prefix (the same
conversation, the same long system prompt) lands on the same pod, whose KV cache holds it, as long as
that pod carries at most 25% more than its fair share; beyond, the overflow walks on to the next pods of
the ring (the same ones for the same key, so they warm up too). Removing a pod moves only the keys it
owned (consistent hashing); adding one takes only the keys it now owns.

The walk always finds an endpoint under the bound (the average load is below it); least-load stands in
only if that ever fails (loads that do not add up, e.g. counted for other endpoints).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from servlane_core.routing.endpoint_pick import Endpoint, least_loaded

VNODES = 100  # points per endpoint: spreads keys evenly over few endpoints (stddev ~10% of a share)
LOAD_FACTOR = 1.25


def key_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True)
class HashRing:
    points: tuple[int, ...]  # sorted
    owners: tuple[str, ...]  # the address owning each point
    size: int  # distinct addresses

    def walk(self, key: int) -> Iterator[str]:
        """Each address once, in ring order from the key's position."""
        if not self.points:
            return
        start = bisect.bisect_left(self.points, key)
        seen: set[str] = set()
        count = len(self.points)
        for step in range(count):
            owner = self.owners[(start + step) % count]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == self.size:
                    return


@functools.lru_cache(maxsize=256)
def ring_of(addresses: tuple[str, ...], vnodes: int = VNODES) -> HashRing:
    """The ring of these addresses (cached: a version's endpoints change rarely, requests often)."""
    placed = sorted((key_hash(f"{address}#{i}"), address) for address in set(addresses) for i in range(vnodes))
    return HashRing(tuple(p for p, _ in placed), tuple(a for _, a in placed), len(set(addresses)))


def load_bound(total_load: int, endpoints: int, factor: float = LOAD_FACTOR) -> int:
    """The most requests in flight an endpoint may hold to take one more (the new one counted)."""
    return math.ceil(factor * (total_load + 1) / max(endpoints, 1))


def home(ring: HashRing, key: str, candidates: Sequence[Endpoint]) -> Endpoint | None:
    """The key's endpoint among the candidates, loads aside."""
    by_address = {e.address: e for e in candidates}
    for address in ring.walk(key_hash(key)):
        if address in by_address:
            return by_address[address]
    return None


def pick_bounded(
    ring: HashRing,
    key: str,
    candidates: Sequence[Endpoint],
    load: Mapping[str, int],
    factor: float = LOAD_FACTOR,
    rng: random.Random | None = None,
) -> Endpoint | None:
    """The first candidate in the key's ring order that is under the load bound. The ring may hold more
    addresses than the candidates (ejected, not ready, tried): those are walked past, so the keys of the
    others do not move."""
    by_address = {e.address: e for e in candidates}
    if not by_address:
        return None
    bound = load_bound(sum(load.get(a, 0) for a in by_address), len(by_address), factor)
    for address in ring.walk(key_hash(key)):
        endpoint = by_address.get(address)
        if endpoint is not None and load.get(address, 0) < bound:
            return endpoint
    return least_loaded(list(by_address.values()), load, rng)
