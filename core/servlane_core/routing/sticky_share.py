"""Sticky routing that no single client can turn into a steering wheel for canary verdicts.

A sticky id (X-Request-ID or `user`) pins a client to one version. Chosen on purpose, it pins a client to
a canary, and that client can then dilute a failing canary's error rate with its own good requests,
hurry a promotion, or push a rollback. This guard keeps the stickiness but caps it: a client (its API
key's name when it has one, else its sticky id) is pinned to a backend only while its share of that
backend's recent requests stays within MAX_EXCESS_SHARE of its share of the whole route's recent
requests; beyond that its requests are routed by weight, like a request without an id. A client that
sends most of all traffic still gets its fair part of the canary; one that sends little cannot fill it.

Pure and in memory (no clock: the windows are the last requests), one per gateway process. With several
gateway replicas each caps its own traffic, so the cap holds for the sum too.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import NamedTuple

from servlane_core.routing.picking import pick_backend
from servlane_core.routing.routes import Backend, Route

MAX_EXCESS_SHARE = 0.2  # a client's share of a backend may exceed its share of the route by this much
ROUTE_WINDOW = 1000  # recent requests per route that define each client's overall share
BACKEND_WINDOW = 200  # recent requests per backend that define each client's share of it
PIN_FLOOR = 5  # pins always allowed below this many of a backend's recent requests (one conversation)


@dataclass
class _Recent:
    """The identities of the last `size` requests, with their counts."""

    size: int
    order: deque[str | None] = field(default_factory=deque)
    counts: Counter[str | None] = field(default_factory=Counter)

    def add(self, client: str | None) -> None:
        order, counts = self.order, self.counts
        order.append(client)
        counts[client] = counts.get(client, 0) + 1
        if len(order) > self.size:
            gone = order.popleft()
            left = counts[gone] - 1
            if left > 0:
                counts[gone] = left
            else:
                del counts[gone]

    def share(self, client: str, extra: int = 0) -> float:
        total = len(self.order) + extra
        return 0.0 if total == 0 else (self.counts[client] + extra) / total


class Pick(NamedTuple):  # made per request: a tuple, not a frozen dataclass's setattr per field
    backend: Backend | None
    unpinned: bool  # a sticky id was not honoured because its client was over its share


@dataclass
class StickyShareGuard:
    max_excess_share: float = MAX_EXCESS_SHARE
    # Keyed by namespace too: a feature of the same name in another namespace is another tenant's traffic,
    # and must not move this one's shares.
    _routes: dict[tuple[str, str], _Recent] = field(default_factory=dict)
    _backends: dict[tuple[str, str, str], _Recent] = field(default_factory=dict)

    def pick(self, route: Route, sticky_id: str | None, client: str | None, rng: random.Random | None = None) -> Pick:
        """The backend for one request; `client` identifies who sends it (key name, else the sticky id)."""
        backend = pick_backend(route, sticky_id, rng=rng)
        unpinned = False
        if backend is not None and sticky_id and client and not self._may_pin(route, backend, client):
            backend = pick_backend(route, None, rng=rng)
            unpinned = True
        # get() before creating: setdefault() would build a window (a deque and a Counter) per request.
        route_key = (route.namespace, route.name)
        if (route_recent := self._routes.get(route_key)) is None:
            route_recent = self._routes[route_key] = _Recent(ROUTE_WINDOW)
        route_recent.add(client)
        if backend is not None:
            backend_key = (route.namespace, route.name, backend.model)
            if (backend_recent := self._backends.get(backend_key)) is None:
                backend_recent = self._backends[backend_key] = _Recent(BACKEND_WINDOW)
            backend_recent.add(client)
        return Pick(backend, unpinned)

    def _may_pin(self, route: Route, backend: Backend, client: str) -> bool:
        recent = self._backends.get((route.namespace, route.name, backend.model))
        if recent is None or recent.counts[client] < PIN_FLOOR:
            return True
        route_recent = self._routes.get((route.namespace, route.name))
        overall = route_recent.share(client, extra=1) if route_recent is not None else 1.0
        return recent.share(client, extra=1) <= overall + self.max_excess_share
