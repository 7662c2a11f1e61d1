"""Canary rollouts for AIFeatures: a pure state machine (decide, on a draft status, timed by schedule)
that also decides the fixed GPU budget's replica pins (budget), and the canary metric readers' interface.

`decide.plan`, `analysis` and `budget` do no I/O and read no clock, so the controller can be restarted at
any time and resume from the AIFeature's status alone. The readers (servlane_operator.metric_readers) are
the only parts that talk to the network.
"""

from servlane_core.rollout.budget import (
    ReplicaSplit,
    budget_replicas,
    combine_overrides,
    models_in_use,
    split_budget,
)
from servlane_core.rollout.decide import ROLLOUT_ANNOTATION, RolloutPlan, models_to_measure, plan, referenced_models
from servlane_core.rollout.draft import RolloutEvent
from servlane_core.rollout.rollout_pass import PassOutcome, rollout_pass
from servlane_core.rollout.schedule import analysis_due, analysis_window_seconds, progress_deadline_seconds
from servlane_core.rollout.window import (
    MetricsOutage,
    MetricsReader,
    MetricsUnavailableError,
    ModelWindow,
    WindowMetrics,
)

__all__ = [
    "ROLLOUT_ANNOTATION",
    "MetricsOutage",
    "MetricsReader",
    "MetricsUnavailableError",
    "ModelWindow",
    "PassOutcome",
    "ReplicaSplit",
    "RolloutEvent",
    "RolloutPlan",
    "WindowMetrics",
    "analysis_due",
    "analysis_window_seconds",
    "budget_replicas",
    "combine_overrides",
    "models_in_use",
    "models_to_measure",
    "plan",
    "progress_deadline_seconds",
    "referenced_models",
    "rollout_pass",
    "split_budget",
]
