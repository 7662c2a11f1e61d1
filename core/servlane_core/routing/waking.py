"""Requests for a model with no ready pod: which models wake, which one a held request waits for, and
whether a queue has room. Pure: the gateway's hold queue (servlane_gateway.routing.hold) acts on these.

A model wakes (routes.can_wake) when its pods are on their way (phase Pending or Deploying: scaled to zero with
autoscaling, being created, or starting) and it has an endpoint (its Service). A model that is Degraded
(unschedulable, crash-looping, a child name taken) or Failed does not: waiting for it would only turn a
503 now into a 503 minutes later. Nor does a model fixed at `spec.replicas: 0`: nothing scales it back
(the operator wakes autoscaled models only), so a request for it is refused at once.

A held request is given its model by the route's weights among the waking backends when it is held
(sticky ids as for ready ones), and waits for that model: requests held during a canary are released
along the feature's weights, not all onto whichever version woke first.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from servlane_core.routing.picking import pick_backend
from servlane_core.routing.routes import Backend, Route
from servlane_core.routing.routes import can_wake as can_wake  # the rule, next to is_ready

DEMAND_LEASE_PREFIX = "servlane-demand-"
# The labels of a demand Lease: the operator watches Leases by them and wakes only the AIModel named by
# `servlane.dev/model` in the Lease's own namespace.
DEMAND_MODEL_LABEL = "servlane.dev/model"
DEMAND_MANAGED_BY = ("app.kubernetes.io/managed-by", "servlane-gateway")

# Why a request was not held (or stopped being held): the `reason` label of the rejections counter.
MODEL_QUEUE_FULL = "model_queue_full"
NAMESPACE_QUEUE_FULL = "namespace_queue_full"
WAIT_EXCEEDED = "wait_exceeded"
MODEL_GONE = "model_gone"


def demand_lease_name(model: str) -> str:
    """The demand Lease of an AIModel (in its namespace). AIModel names are at most 57 characters and a
    Lease's name may have 253, so the name is never cut."""
    return DEMAND_LEASE_PREFIX + model


def waking_pick(route: Route, sticky_id: str | None = None, rng: random.Random | None = None) -> Backend | None:
    """The model a held request waits for: by weight among the route's waking backends (None: none wakes,
    refuse now). Only called when no backend of the route is ready."""
    if not any(b.wakes for b in route.backends):
        return None
    as_ready = tuple(dataclasses.replace(b, ready=b.wakes) for b in route.backends)
    return pick_backend(dataclasses.replace(route, backends=as_ready), sticky_id, rng=rng)


@dataclass(frozen=True)
class HoldLimits:
    per_model: int = 100  # requests held for one AIModel (namespace/name) at once, in this process
    per_namespace: int = 200  # requests held for all of one namespace's models at once
    max_wait: float = 300.0  # seconds a request is held at most; then 503 with Retry-After
    keep_alive: float = 10.0  # seconds between SSE comments to a held stream
    probe_interval: float = 0.05  # how often the not-yet-ready pods of a held model are asked /ready
    demand_renew: float = 5.0  # the demand Lease is renewed at most this often while requests are held


def hold_refusal(held_for_model: int, held_in_namespace: int, limits: HoldLimits) -> str | None:
    """Why one more request cannot be held (a reason label), or None when it can. Bounded per namespace as
    well as per model, so one team's flood takes only its own namespace's places, never another's."""
    if held_for_model >= limits.per_model:
        return MODEL_QUEUE_FULL
    if held_in_namespace >= limits.per_namespace:
        return NAMESPACE_QUEUE_FULL
    return None
