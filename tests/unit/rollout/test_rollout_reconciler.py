"""The operator's AIFeature pass: the replica pins come from plan() (read from the AIModels' own counts)
and are written to status as decided; the models whose merged override moved are the ones re-applied."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from servlane_core.rollout import WindowMetrics
from servlane_operator import aifeature_reconciler
from servlane_operator.kube import Kube

NS = "team-a"


class FakeKube:
    def __init__(self) -> None:
        self.status_patches: list[dict[str, Any]] = []

    async def patch_status(self, api_version: str, kind: str, namespace: str, name: str, status: Any) -> None:
        self.status_patches.append(status)

    async def patch_metadata(self, *args: Any) -> None:
        return None


class NoMetrics:
    min_window_seconds = 0.0

    async def read(
        self, namespace: str, feature: str, models: Sequence[str], window_seconds: float
    ) -> WindowMetrics | None:
        return None


def model(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "servlane.dev/v1alpha1",
        "kind": "AIModel",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "generation": 1},
        "spec": {"source": {"uri": "/models/tiny"}, "engine": "transformers", "replicas": replicas},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def feature(target: str, status: dict[str, Any], generation: int) -> dict[str, Any]:
    return {
        "apiVersion": "servlane.dev/v1alpha1",
        "kind": "AIFeature",
        "metadata": {"name": "chat", "namespace": NS, "generation": generation},
        "spec": {"model": target, "rollout": {"steps": [25, 100], "interval": "1m", "fixedGpuBudget": True}},
        "status": status,
    }


@pytest.fixture(autouse=True)
def no_events(monkeypatch: pytest.MonkeyPatch) -> None:
    # kopf.event needs a running operator's posting queue; what is posted is tested against plan().
    monkeypatch.setattr("servlane_operator.aifeature_reconciler.kopf.event", lambda *args, **kwargs: None)


async def test_the_pass_writes_the_pins_plan_decided_from_the_models_own_counts() -> None:
    kube = FakeKube()
    models = {"a": model("a", 4), "b": model("b", 4), "broken": {"metadata": {"name": "broken"}, "spec": {}}}
    stable = await aifeature_reconciler.reconcile_feature(
        feature("a", {}, 1),
        cast(Kube, kube),
        models,
        NoMetrics(),
    )
    assert stable.stable_model == "a"
    assert stable.replica_overrides == []  # outside a rollout the stable keeps its own count and HPA
    stored = kube.status_patches[-1]
    rollout = await aifeature_reconciler.reconcile_feature(
        feature("b", stored, 2),
        cast(Kube, kube),
        models,
        NoMetrics(),
    )
    assert {o.model: o.replicas for o in rollout.replica_overrides} == {"a": 3, "b": 1}
    assert kube.status_patches[-1]["replicaOverrides"] == [{"model": "a", "replicas": 3}, {"model": "b", "replicas": 1}]
    before = aifeature_reconciler.feature_status(feature("b", stored, 2))
    assert aifeature_reconciler.overrides_to_apply([], before, rollout) == {"a": 3, "b": 1}


async def test_a_canary_whose_aimodel_says_its_runtime_keeps_crashing_is_rolled_back_at_the_next_check() -> None:
    kube, start = FakeKube(), datetime(2026, 1, 1, tzinfo=UTC)
    models = {"a": model("a", 1), "b": model("b", 1)}
    kubed = cast(Kube, kube)
    await aifeature_reconciler.reconcile_feature(feature("a", {}, 1), kubed, models, NoMetrics(), now=start)
    status = kube.status_patches[-1]
    await aifeature_reconciler.reconcile_feature(feature("b", status, 2), kubed, models, NoMetrics(), now=start)
    status = kube.status_patches[-1]
    assert status["weights"] == [{"model": "a", "weight": 75}, {"model": "b", "weight": 25}]
    why = "pod b-1: the runtime exited with code 137 (3 restarts, back-off before the next): Killed"
    models["b"]["status"] = {
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "RuntimeCrashLoop", "message": why},
            {"type": "Degraded", "status": "True", "reason": "RuntimeCrashLoop", "message": why},
        ]
    }
    # No metrics at all (the gateway sends a down canary nothing): the AIModel's own word decides.
    later = start + timedelta(seconds=61)
    final = await aifeature_reconciler.reconcile_feature(feature("b", status, 2), kubed, models, NoMetrics(), now=later)
    assert (final.phase, final.rolled_back_model) == ("RolledBack", "b")
    assert [(w.model, w.weight) for w in final.weights] == [("a", 100)]
    assert final.analyses[-1].message == f"Canary b rolled back at 25%: canary b is not Ready: RuntimeCrashLoop: {why}."


def test_only_a_degraded_condition_that_is_true_says_why_a_model_fails() -> None:
    def body(*conditions: dict[str, str]) -> dict[str, Any]:
        return {"status": {"conditions": list(conditions)}}

    degraded = {"type": "Degraded", "status": "True", "reason": "ModelLoadFailed", "message": "no config.json"}
    assert aifeature_reconciler.why_failing(body(degraded)) == "ModelLoadFailed: no config.json"
    assert aifeature_reconciler.why_failing(body({**degraded, "status": "False"})) is None
    assert aifeature_reconciler.why_failing(body({**degraded, "type": "Ready"})) is None
    assert aifeature_reconciler.why_failing({}) is None
