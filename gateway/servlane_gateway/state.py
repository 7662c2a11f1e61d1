"""The gateway's shared state: what every request, the console and the batch worker read.

Kept apart from the request pipeline (forwarding) so that the console and the batch code reach the
state without importing the path a request takes. A field that has more than one implementation is
typed with its Protocol (the limiter: in memory or shared through Redis).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from servlane_core.protocol.limits import RequestLimits
from servlane_core.routing.routes import RouteTable
from servlane_core.routing.sticky_share import StickyShareGuard
from servlane_gateway.access import KeyRing
from servlane_gateway.cache.store import ResponseCacher
from servlane_gateway.console.recent import RequestLog
from servlane_gateway.gateway_metrics import GatewayMetrics
from servlane_gateway.http.proxy import Timeouts
from servlane_gateway.http.upstream import UpstreamPool
from servlane_gateway.limits.rates import DEFAULT_RESERVED_COMPLETION_TOKENS, Limiter
from servlane_gateway.routing.hold import HoldQueue
from servlane_gateway.routing.pods import PodRouter


@dataclass
class GatewayState:
    """Everything a request needs; the route table and key ring are swapped whole on reload."""

    metrics: GatewayMetrics
    limiter: Limiter  # in this replica's memory, or shared through Redis (--redis-url)
    timeouts: Timeouts
    limits: RequestLimits
    unavailable_retry_after: float
    pool: UpstreamPool | None = None
    table: RouteTable | None = None
    keys: KeyRing = field(default_factory=KeyRing)
    sticky_guard: StickyShareGuard = field(default_factory=StickyShareGuard)
    # Reserved at admission for a completion without max_tokens (see limits.rates.estimate_tokens).
    reserved_completion_tokens: int = DEFAULT_RESERVED_COMPLETION_TOKENS
    cache: ResponseCacher | None = None  # deterministic answers, for the features that opt in
    # Picks the pod of each attempt; without EndpointSlices it hands back the backend's Service URL.
    pods: PodRouter = field(default_factory=PodRouter)
    recent: RequestLog | None = None  # with the console on: its slow/failed requests and per-model rates
    hold: HoldQueue | None = None  # requests waiting for a model with no ready pod; None: 503 at once
