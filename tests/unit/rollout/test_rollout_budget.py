"""Fixed GPU budgets: the replica table, and the replicas a whole rollout asks for step by step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from servlane_api.aifeature import AIFeatureSpec, AIFeatureStatus
from servlane_api.aimodel import AIModel
from servlane_core.rollout import ROLLOUT_ANNOTATION, ReplicaSplit, combine_overrides, split_budget
from servlane_operator.aifeature_reconciler import overrides_to_apply, replica_overrides
from servlane_operator.builders.deployment import build_deployment
from servlane_operator.settings import OperatorSettings
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


FOUR = {"a": 4, "b": 4, "c": 4}


def test_fixed_budget_through_a_rollout() -> None:
    feature = Feature(
        feature_spec("a", steps=[25, 50, 100], fixedGpuBudget=True, minStableReplicas=1), replicas=dict(FOUR)
    )
    feature.reconcile(T0 - MINUTE)
    # Outside a rollout nothing is pinned: the stable runs its own replicas and keeps its HPA.
    assert feature.overrides() == {}
    feature.change_model("b")
    feature.ready["b"] = False
    feature.reconcile(T0)
    seen = [feature.overrides()]
    feature.ready["b"] = True
    feature.reconcile(T0)
    seen.append(feature.overrides())
    for minute in (1, 2, 3):
        feature.reconcile(T0 + minute * MINUTE, metrics=canary_metrics(window()))
        seen.append(feature.overrides())
    feature.reconcile(T0 + 4 * MINUTE)
    seen.append(feature.overrides())
    assert seen == [
        {"a": 3, "b": 1},  # waiting for Ready
        {"a": 3, "b": 1},  # 25%
        {"a": 2, "b": 2},  # 50%
        {"a": 1, "b": 4},  # 100%, stable still warm
        # Promoted: the new stable is released (own replicas, HPA back); the old one must not spring back
        # to its own 4 on top of it. (The old behaviour pinned b for good and released a: 8 in all.)
        {"a": 0},
        {"a": 0},  # and it stays so on later passes
    ]


def test_fixed_budget_after_rollback_gives_everything_back_to_stable() -> None:
    feature = at_first_step(fixedGpuBudget=True, replicas=dict(FOUR))
    assert feature.overrides() == {"a": 3, "b": 1}
    feature.reconcile(T0, annotations={ROLLOUT_ANNOTATION: "abort"})
    # The stable is released (its own 4, its HPA restored), the canary held at 0.
    assert feature.overrides() == {"b": 0}


def test_a_replaced_or_cancelled_canary_is_held_at_zero() -> None:
    feature = at_first_step(fixedGpuBudget=True, replicas=dict(FOUR))
    feature.change_model("c")
    feature.reconcile(T0)
    assert feature.overrides() == {"a": 3, "b": 0, "c": 1}
    feature.change_model("a")
    feature.reconcile(T0)
    assert feature.overrides() == {"b": 0, "c": 0}
    # Used again as a canary, a held model gets its share back.
    feature.change_model("b")
    feature.reconcile(T0)
    assert feature.overrides() == {"a": 3, "b": 1, "c": 0}


def test_a_deleted_model_is_forgotten_and_an_unknown_stable_leaves_the_canary_one_replica() -> None:
    feature = at_first_step(fixedGpuBudget=True, replicas={"b": 4})
    assert feature.overrides() == {"b": 1}
    feature.reconcile(T0, annotations={ROLLOUT_ANNOTATION: "abort"})
    feature.replicas = {"a": 4}  # b deleted
    feature.reconcile(T0)
    assert feature.overrides() == {}


def test_turning_the_budget_off_releases_everything() -> None:
    feature = at_first_step(fixedGpuBudget=True, replicas=dict(FOUR))
    feature.spec = feature.spec.model_copy(
        update={"rollout": feature.spec.rollout.model_copy(update={"fixed_gpu_budget": False})}
    )
    feature.reconcile(T0)
    assert feature.overrides() == {}


def test_no_budget_without_fixed_gpu_budget_or_with_a_split() -> None:
    feature = at_first_step(replicas=dict(FOUR))
    assert feature.overrides() == {}
    split = Feature(
        feature_spec(split=[{"model": "a", "weight": 50}, {"model": "b", "weight": 50}], fixedGpuBudget=True),
        replicas=dict(FOUR),
    )
    split.reconcile(T0)
    assert split.overrides() == {}


def test_standalone_pins_nothing() -> None:
    feature = at_first_step(fixedGpuBudget=True)  # no AIModels: nothing to scale
    assert feature.overrides() == {}


def _status(**fields: Any) -> AIFeatureStatus:
    return AIFeatureStatus.model_validate(fields)


def test_combined_overrides_never_starve_a_model_another_feature_serves() -> None:
    # F1 rolled canary b back (b held at 0); F2 serves b as its stable, unpinned.
    f1 = _status(
        stableModel="a", weights=[{"model": "a", "weight": 100}], replicaOverrides=[{"model": "b", "replicas": 0}]
    )
    f2 = _status(stableModel="b", weights=[{"model": "b", "weight": 100}])
    assert combine_overrides([f1, f2]) == {"a": None, "b": None}
    assert combine_overrides([f2, f1]) == {"a": None, "b": None}
    # Alone, F1's hold applies.
    assert combine_overrides([f1]) == {"a": None, "b": 0}


def test_combined_overrides_keep_the_largest_pin() -> None:
    f1 = _status(stableModel="a", canaryModel="b", canaryWeight=25,
                 replicaOverrides=[{"model": "a", "replicas": 3}, {"model": "b", "replicas": 1}])  # fmt: skip
    f2 = _status(stableModel="c", canaryModel="b", canaryWeight=50,
                 replicaOverrides=[{"model": "b", "replicas": 2}, {"model": "c", "replicas": 2}])  # fmt: skip
    assert combine_overrides([f1, f2]) == {"a": 3, "b": 2, "c": 2}


def _body(name: str, status: AIFeatureStatus) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": status.model_dump(by_alias=True, mode="json")}


def test_aborting_one_feature_never_scales_the_stable_of_another_to_zero() -> None:
    # F1 rolls b out over a; F2 serves b. F1's abort holds b at 0 in F1's status only.
    f1 = at_first_step(fixedGpuBudget=True, replicas=dict(FOUR))
    before = f1.status
    f2 = Feature(feature_spec("b", fixedGpuBudget=True), replicas=dict(FOUR))
    f2.reconcile(T0)
    f1.reconcile(T0, annotations={ROLLOUT_ANNOTATION: "abort"})
    assert f1.overrides() == {"b": 0}
    to_apply = overrides_to_apply([_body("f2", f2.status)], before, f1.status)
    # a is released (back to its own count and HPA); b is untouched: F2 keeps serving it at its own count.
    assert to_apply == {"a": None}
    assert replica_overrides([_body("f1", f1.status), _body("f2", f2.status)]) == {"a": None, "b": None}
    # Without F2, b would be held at 0.
    assert overrides_to_apply([], before, f1.status) == {"a": None, "b": 0}


def test_an_unreadable_feature_status_pins_nothing() -> None:
    assert replica_overrides([{"metadata": {"name": "x"}, "status": {"replicaOverrides": "nonsense"}}]) == {}


def test_min_stable_replicas_is_bounded_as_an_aimodels_replicas() -> None:
    """It becomes the stable model's Deployment replicas: past int32 the Deployment was refused, and below it an
    AIFeature editor could run any model of the namespace at 50,000 replicas. New values above 1000 are refused
    (the CRD's maximum); a stored one reads as 1000, and an override in status (patchable) is capped too."""
    crd = yaml.safe_load(Path("crds/aifeatures.yaml").read_text())
    rollout = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["rollout"]
    assert rollout["properties"]["minStableReplicas"]["maximum"] == 1000
    stored = AIFeatureSpec.model_validate({"model": "b", "rollout": {"minStableReplicas": 2**31}})
    assert stored.rollout.min_stable_replicas == 1000
    meta = {"name": "a", "namespace": "t", "uid": "u-1"}
    model = AIModel.model_validate({"metadata": meta, "spec": {"source": {"uri": "/m"}}})
    assert build_deployment(model, OperatorSettings(), 50_000)["spec"]["replicas"] == 1000


def test_a_model_served_through_its_adapter_is_in_use_and_not_scaled_down_by_another_features_pin() -> None:
    """Pins were keyed by target: a feature serving `x:sql` (x's pods) did not protect x, so another feature's
    leftover pin of x (after its aborted rollout to x) held x at 0 under it."""
    f1 = Feature(
        feature_spec("a", steps=[25, 100], fixedGpuBudget=True), replicas={"a": 4, "x": 4}, ready={"a": True, "x": True}
    )
    f1.reconcile(T0 - MINUTE)
    f1.change_model("x")
    f1.reconcile(T0)
    f1.reconcile(T0, annotations={ROLLOUT_ANNOTATION: "abort"})
    assert f1.overrides() == {"x": 0}
    f2 = Feature(feature_spec("x:sql"), replicas={"a": 4, "x": 4}, ready={"x:sql": True})
    f2.reconcile(T0)
    assert {w.model: w.weight for w in f2.status.weights} == {"x:sql": 100}
    assert combine_overrides([f1.status, f2.status])["x"] is None
    assert combine_overrides([f1.status])["x"] == 0  # alone, the pin holds


def test_a_rollout_from_a_model_to_its_own_adapter_moves_no_pods() -> None:
    """x -> x:sql runs on the same pods: nothing to carve, and the winner was pinned to 0 on promotion (all
    traffic on a model with no pods)."""
    f = Feature(
        feature_spec("x", steps=[50, 100], fixedGpuBudget=True),
        replicas={"x": 4, "y": 4},
        ready={"x": True, "y": True, "x:sql": True},
    )
    f.reconcile(T0 - MINUTE)
    f.change_model("y")
    f.reconcile(T0)
    assert f.overrides() == {"x": 2, "y": 2}
    f.reconcile(T0, annotations={ROLLOUT_ANNOTATION: "abort"})
    f.change_model("x:sql")
    f.reconcile(T0 + MINUTE)
    assert f.status.canary_model == "x:sql"
    assert "x" not in f.overrides()  # the canary's pods are the stable's
    f.reconcile(T0 + MINUTE, annotations={ROLLOUT_ANNOTATION: "promote"})
    assert f.status.stable_model == "x:sql"
    assert combine_overrides([f.status]).get("x") is None
