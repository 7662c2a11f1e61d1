"""Canary rollouts for AIFeatures: a pure state machine (decide), GPU budgets, and canary metric readers.

`decide.plan` and `budget` do no I/O and read no clock, so the controller can be restarted at any time
and resume from the AIFeature's status alone. The readers (`prometheus_reader`, `scrape_reader`) are the
only parts that talk to the network.
"""

from modelplane_operator.rollout.budget import ReplicaSplit, budget_replicas, split_budget
from modelplane_operator.rollout.decide import (
    ROLLOUT_ANNOTATION,
    RolloutEvent,
    RolloutPlan,
    analysis_due,
    models_to_measure,
    plan,
)
from modelplane_operator.rollout.metrics import MetricsReader, MetricsUnavailableError, ModelWindow, WindowMetrics

__all__ = [
    "ROLLOUT_ANNOTATION",
    "MetricsReader",
    "MetricsUnavailableError",
    "ModelWindow",
    "ReplicaSplit",
    "RolloutEvent",
    "RolloutPlan",
    "WindowMetrics",
    "analysis_due",
    "budget_replicas",
    "models_to_measure",
    "plan",
    "split_budget",
]
