"""Fixed GPU budgets: during a canary, the canary's replicas come out of the stable's, step by step.

The stable AIModel's own replica count N (spec.replicas, or autoscaling.minReplicas) is the budget. At
canary weight w the canary gets ceil(N*w/100) replicas (at least 1 from the moment a canary exists, so it
can become Ready before any traffic) and the stable keeps the rest, but never fewer than
minStableReplicas (kept warm so a rollback can move all traffic back at once) and never 0 while it still
carries traffic. Those floors are the only way the total can exceed N, e.g. N=1 during a canary runs 1 + 1.

Overrides pin only what the rollout needs, and only while it needs it. The model that wins a rollout
(the promoted canary, or the stable after a rollback, abort or cancel) is released: its Deployment goes
back to its own replicas and its HPA comes back. Every model the feature pinned before and no longer
uses (the old stable after a promotion, a rolled-back or replaced canary) is pinned to 0 so it cannot
spring back to its own count on top of the winner; it stays there until the feature uses it again, drops
fixedGpuBudget, or the AIModel is deleted.

Pins are per AIModel, whatever target names it: `x:sql` (an adapter of x) runs on x's pods, so a feature that
serves it uses x, and a rollout between x and x:sql moves no pods (nothing to carve: x is not pinned).

Overrides are per (feature, model): each feature writes its own in its status and never sees another's.
`combine_overrides` merges them per model so that no feature can starve a model another one serves: a
model any feature uses without pinning it runs at its own count, otherwise the largest pin wins.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from servlane_api.aifeature import AIFeatureSpec, AIFeatureStatus
from servlane_api.targets import parse_target


@dataclass(frozen=True)
class ReplicaSplit:
    stable: int
    canary: int


def split_budget(total: int, canary_weight: int, min_stable_replicas: int) -> ReplicaSplit:
    """Replicas for a canary in flight at `canary_weight` percent (0 while it is not yet Ready)."""
    if total < 0 or not 0 <= canary_weight <= 100 or min_stable_replicas < 0:
        raise ValueError("total and min_stable_replicas must be >= 0 and canary_weight in 0..100")
    canary = max(1, math.ceil(total * canary_weight / 100))
    carries_traffic = 1 if canary_weight < 100 else 0
    stable = max(total - canary, min_stable_replicas, carries_traffic)
    return ReplicaSplit(stable=stable, canary=canary)


def budget_replicas(
    spec: AIFeatureSpec, status: AIFeatureStatus, previous: AIFeatureStatus, own_replicas: Mapping[str, int]
) -> dict[str, int]:
    """This feature's replica pins for the new `status` (decided by plan() from `previous`).

    `own_replicas`: each existing AIModel of the namespace by name, with the replicas it asks for itself.
    A model missing from it does not exist (or cannot be read): nothing is pinned for it. Empty when the
    budget does not apply (no fixedGpuBudget, a fixed split, or no stable yet): every model is released.
    """
    if not spec.rollout.fixed_gpu_budget or spec.split is not None or status.stable_model is None:
        return {}
    stable = model_of(status.stable_model)
    canary = model_of(status.canary_model) if status.canary_model is not None else None
    pins: dict[str, int] = {}
    if canary is not None and canary != stable:
        # An unknown stable leaves no budget to carve from: the canary gets its one replica and no more.
        split = split_budget(own_replicas.get(stable, 0), status.canary_weight or 0, spec.rollout.min_stable_replicas)
        pins = {stable: split.stable, canary: split.canary}
    # Whatever this feature pinned before and no longer uses lost the rollout: it must not come back at
    # its own size on top of the winner. The stable outside a rollout is the winner, hence released.
    for old in previous.replica_overrides:
        if old.model not in (stable, canary):
            pins[old.model] = 0
    return {model: replicas for model, replicas in sorted(pins.items()) if model in own_replicas}


def model_of(target: str) -> str:
    """The AIModel whose pods serve a target (`x` and its adapters `x:sql`)."""
    return parse_target(target).model


def models_in_use(status: AIFeatureStatus) -> set[str]:
    """The AIModels a feature needs serving: its stable's, its canary's and those of everything it sends
    traffic to."""
    used = {model_of(w.model) for w in status.weights if w.weight > 0}
    used.update(model_of(m) for m in (status.stable_model, status.canary_model) if m is not None)
    return used


def combine_overrides(statuses: Iterable[AIFeatureStatus]) -> dict[str, int | None]:
    """Per model, the replicas its Deployment runs given every feature of the namespace (None: its own
    count and HPA). Every model any feature pins or uses has an entry; order of the features is irrelevant.

    A model some feature uses without pinning it is released: another feature's rollout (its canary share,
    or 0 after its own rollback) must never scale down a model that serves someone else at full size.
    Otherwise the largest pin wins, so a model two rollouts share keeps what the larger one needs."""
    pins: dict[str, int] = {}
    released: set[str] = set()
    for status in statuses:
        own = {o.model: o.replicas for o in status.replica_overrides}
        for model, replicas in own.items():
            pins[model] = max(pins.get(model, 0), replicas)
        released.update(models_in_use(status) - own.keys())
    out: dict[str, int | None] = dict.fromkeys(released)
    for model, replicas in pins.items():
        if model not in released:
            out[model] = replicas
    return dict(sorted(out.items()))
