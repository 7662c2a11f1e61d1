"""Fixed GPU budgets: during a canary, the canary's replicas come out of the stable's, step by step.

The stable AIModel's replica count N is the budget. At canary weight w the canary gets ceil(N*w/100)
replicas (at least 1 from the moment a canary exists, so it can become Ready before any traffic) and the
stable keeps the rest, but never fewer than minStableReplicas (kept warm so a rollback can move all
traffic back at once) and never 0 while it still carries traffic. Those floors are the only way the
total can exceed N, e.g. N=1 during a canary runs 1 + 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servlane_api.aifeature import AIFeatureSpec, AIFeatureStatus


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


def budget_replicas(spec: AIFeatureSpec, status: AIFeatureStatus, total: int) -> dict[str, int]:
    """Replicas per AIModel for a feature with rollout.fixedGpuBudget, from the plan's status.

    Empty when the budget does not apply (no fixedGpuBudget, a fixed split, or no stable yet): the
    AIModels keep their own replicas. A rolled-back canary is scaled to 0 and the stable back to N.
    """
    if not spec.rollout.fixed_gpu_budget or spec.split is not None or status.stable_model is None:
        return {}
    replicas = {status.stable_model: total}
    if status.canary_model is not None:
        split = split_budget(total, status.canary_weight or 0, spec.rollout.min_stable_replicas)
        replicas = {status.stable_model: split.stable, status.canary_model: split.canary}
    elif status.rolled_back_model is not None:
        replicas[status.rolled_back_model] = 0
    return replicas
