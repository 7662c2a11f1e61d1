"""A model with no ready pod replaces its pods instead of surging (issue #29.5).

A CPU model whose only pod crash-loops, on a node without room for a second pod: with maxSurge 1 and
maxUnavailable 0 the fixed pod stays Pending behind the broken one for ever, so no spec edit repairs it.
With no ready pod there is nothing to protect: the operator renders maxSurge 0, maxUnavailable 100%.
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest

from servlane_operator import aimodel_reconciler
from servlane_operator.builders import build_deployment
from servlane_operator.builders.deployment import REPLACE_ALL, replaces_all_pods
from servlane_operator.observed import DeploymentView
from servlane_operator.settings import OperatorSettings
from tests.support.aimodels import make_model
from tests.unit.fake_kube import FakeKube

CPU_SPEC: dict[str, Any] = {"source": {"uri": "/models/tiny"}, "engine": "transformers", "resources": {"cpu": "2"}}
GPU_SPEC: dict[str, Any] = {"source": {"uri": "/models/big"}, "resources": {"gpus": 1}}
SURGE = {"maxSurge": 1, "maxUnavailable": 0}


def live(ready: int, *, rolling_out: bool = False, replaces_all: bool = False) -> DeploymentView:
    return DeploymentView(
        generation=2,
        observed_generation=2,
        desired=1,
        replicas=2 if rolling_out else 1,  # an old pod beside the new one while rolling out
        ready=ready,
        updated=1,
        available=ready,
        deadline_exceeded=False,
        replaces_all=replaces_all,
    )


@pytest.mark.parametrize(
    ("deployment", "spec_changed", "replace"),
    [
        (None, True, False),  # first creation: no old pod either way
        (live(ready=1), True, False),  # a ready pod to protect: surge
        (live(ready=1), False, False),
        (live(ready=0), True, True),  # the crash-looping pod: an edit replaces it
        (live(ready=0), False, True),  # the resync gets there too, before any edit
        # A rollout that began with a ready pod keeps surging through a readiness blip...
        (live(ready=0, rolling_out=True), False, False),
        # ...but a new spec (the repair) decides afresh.
        (live(ready=0, rolling_out=True), True, True),
        # A replacement under way is not turned back into a surge by its first ready pod...
        (live(ready=1, rolling_out=True, replaces_all=True), False, True),
        # ...and once it is done, with a ready pod, surging resumes (no pod restarts for it).
        (live(ready=1, replaces_all=True), False, False),
    ],
)
def test_replace_only_when_no_pod_is_ready(
    deployment: DeploymentView | None, spec_changed: bool, replace: bool
) -> None:
    assert replaces_all_pods(deployment, spec_changed) is replace


@pytest.mark.parametrize("spec", [CPU_SPEC, GPU_SPEC])
def test_replace_all_wins_over_the_usual_strategy(settings: OperatorSettings, spec: dict[str, Any]) -> None:
    model = make_model(spec)
    assert build_deployment(model, settings, replace_all=True)["spec"]["strategy"] == REPLACE_ALL
    assert build_deployment(model, settings)["spec"]["strategy"] != REPLACE_ALL


def test_the_view_reads_the_live_strategy() -> None:
    body = {"spec": {"strategy": REPLACE_ALL}, "status": {"replicas": 2, "updatedReplicas": 1}}
    view = DeploymentView.parse(body)
    assert view.replaces_all
    assert view.rolling_out
    assert not DeploymentView.parse(
        {"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": SURGE}}}
    ).replaces_all
    assert not DeploymentView.parse({}).replaces_all


DEPLOYMENT = "/apis/apps/v1/namespaces/team-a/deployments/model-llama"


def crash_looping_deployment(ready: int) -> dict[str, Any]:
    """The live Deployment the operator made: one pod, `ready` of them ready, rolled out."""
    owner = {
        "apiVersion": "servlane.dev/v1alpha1",
        "kind": "AIModel",
        "name": "llama",
        "uid": "uid-123",
        "controller": True,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "model-llama", "namespace": "team-a", "generation": 2, "ownerReferences": [owner]},
        "spec": {"replicas": 1, "strategy": {"type": "RollingUpdate", "rollingUpdate": SURGE}},
        "status": {"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1, "readyReplicas": ready},
    }


@pytest.mark.parametrize(
    ("ready", "strategy"), [(0, REPLACE_ALL), (1, {"type": "RollingUpdate", "rollingUpdate": SURGE})]
)
def test_an_edit_of_a_model_without_a_ready_pod_replaces_it(
    monkeypatch: pytest.MonkeyPatch, ready: int, strategy: dict[str, Any]
) -> None:
    monkeypatch.setattr(kopf, "event", lambda *_, **__: None)
    kube = FakeKube()
    kube.put(DEPLOYMENT, crash_looping_deployment(ready))
    # The user's edit: generation 3, last reconciled at 2.
    body = make_model(CPU_SPEC, observedGeneration=2).model_dump(by_alias=True, mode="json")
    settings = OperatorSettings(gateway_namespace="servlane-system")
    asyncio.run(aimodel_reconciler.reconcile(body, kube, settings, [], trigger="change"))
    assert kube.objects[DEPLOYMENT]["spec"]["strategy"] == strategy
