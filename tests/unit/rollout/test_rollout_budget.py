"""Fixed GPU budgets: the replica table, and the replicas a whole rollout asks for step by step."""

from __future__ import annotations

import pytest

from servlane_core.rollout import ROLLOUT_ANNOTATION, ReplicaSplit, budget_replicas, split_budget
from tests.unit.rollout.rollout_helpers import MINUTE, T0, Feature, at_first_step, canary_metrics, feature_spec, window


@pytest.mark.parametrize(
    ("total", "weight", "min_stable", "stable", "canary"),
    [
        (4, 0, 1, 3, 1),  # waiting for Ready: one canary replica, no traffic yet
        (4, 5, 1, 3, 1),  # ceil(0.2) = 1
        (4, 25, 1, 3, 1),
        (4, 50, 1, 2, 2),
        (4, 60, 1, 1, 3),  # ceil(2.4) = 3
        (4, 100, 1, 1, 4),  # the stable stays warm for a rollback
        (4, 100, 0, 0, 4),  # ...unless minStableReplicas is 0 and it carries no traffic
        (4, 90, 0, 1, 4),  # carrying 10% of traffic: never 0
        (4, 75, 2, 2, 3),  # minStableReplicas wins over N - canary
        (10, 5, 1, 9, 1),
        (10, 33, 3, 6, 4),
        (10, 80, 3, 3, 8),
        (1, 5, 1, 1, 1),  # a budget of 1 cannot hold both: the floors go over it
        (0, 50, 0, 1, 1),
    ],
)
def test_split_budget(total: int, weight: int, min_stable: int, stable: int, canary: int) -> None:
    assert split_budget(total, weight, min_stable) == ReplicaSplit(stable=stable, canary=canary)


@pytest.mark.parametrize(("total", "weight", "min_stable"), [(-1, 5, 1), (4, 101, 1), (4, -1, 1), (4, 5, -1)])
def test_split_budget_rejects_nonsense(total: int, weight: int, min_stable: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        split_budget(total, weight, min_stable)


def test_fixed_budget_through_a_rollout() -> None:
    feature = Feature(feature_spec("a", steps=[25, 50, 100], fixedGpuBudget=True, minStableReplicas=1))
    feature.reconcile(T0 - MINUTE)
    assert budget_replicas(feature.spec, feature.status, 4) == {"a": 4}
    feature.change_model("b")
    feature.ready["b"] = False
    feature.reconcile(T0)
    seen = [budget_replicas(feature.spec, feature.status, 4)]
    feature.ready["b"] = True
    feature.reconcile(T0)
    seen.append(budget_replicas(feature.spec, feature.status, 4))
    for minute in (1, 2, 3):
        feature.reconcile(T0 + minute * MINUTE, metrics=canary_metrics(window()))
        seen.append(budget_replicas(feature.spec, feature.status, 4))
    assert seen == [
        {"a": 3, "b": 1},  # waiting for Ready
        {"a": 3, "b": 1},  # 25%
        {"a": 2, "b": 2},  # 50%
        {"a": 1, "b": 4},  # 100%, stable still warm
        {"b": 4},  # promoted: the budget is the new stable's
    ]


def test_fixed_budget_after_rollback_gives_everything_back_to_stable() -> None:
    feature = at_first_step(fixedGpuBudget=True)
    feature.reconcile(T0, annotations={ROLLOUT_ANNOTATION: "abort"})
    assert budget_replicas(feature.spec, feature.status, 4) == {"a": 4, "b": 0}


def test_no_budget_without_fixed_gpu_budget_or_with_a_split() -> None:
    feature = at_first_step()
    assert budget_replicas(feature.spec, feature.status, 4) == {}
    split = Feature(
        feature_spec(split=[{"model": "a", "weight": 50}, {"model": "b", "weight": 50}], fixedGpuBudget=True)
    )
    split.reconcile(T0)
    assert budget_replicas(split.spec, split.status, 4) == {}
