"""The operator's autoscaler, decided purely: signals, bounds, windows and times in, replicas and a reason out."""

from servlane_core.scaling.decide import (
    Decision,
    PodSignals,
    ScalingPolicy,
    ScalingState,
    autoscaled_replicas,
    decide,
    held_by_rollout,
    released_by_rollout,
    saw_activity,
)

__all__ = [
    "Decision",
    "PodSignals",
    "ScalingPolicy",
    "ScalingState",
    "autoscaled_replicas",
    "decide",
    "held_by_rollout",
    "released_by_rollout",
    "saw_activity",
]
