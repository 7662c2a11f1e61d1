"""The status decision: phase and conditions from what the cluster reports."""

from __future__ import annotations

from typing import Any

import pytest

from modelplane_api.aimodel import AIModelStatus
from modelplane_operator.observed import DeploymentView, PodView
from modelplane_operator.status import build_status, decide
from tests.unit.conftest import make_model

MODEL = make_model({"source": {"uri": "/models/x"}, "resources": {"gpus": 4}})
GPU_MESSAGE = "0/3 nodes are available: 1 node(s) didn't tolerate taint, 2 Insufficient nvidia.com/gpu."


def dep(
    desired: int = 2, ready: int = 2, updated: int = 2, gen: int = 1, observed: int = 1, **kw: Any
) -> DeploymentView:
    return DeploymentView(
        generation=gen,
        observed_generation=observed,
        desired=desired,
        replicas=desired,
        ready=ready,
        updated=updated,
        available=ready,
        deadline_exceeded=kw.get("deadline", False),
    )


def pod(name: str = "p", unschedulable: str | None = None, reason: str | None = None) -> PodView:
    return PodView(name=name, unschedulable_message=unschedulable, blocking_reason=reason, blocking_message=reason)


@pytest.mark.parametrize(
    ("deployment", "pods", "phase", "reason", "ready"),
    [
        (None, [], "Pending", "Creating", False),
        (dep(), [], "Ready", "AllReplicasReady", True),
        (dep(ready=0), [], "Deploying", "Deploying", False),
        (dep(ready=1, updated=1), [], "Deploying", "Deploying", True),
        (dep(gen=2, observed=1), [], "Deploying", "Deploying", True),
        (dep(ready=0), [pod(unschedulable=GPU_MESSAGE)], "Degraded", "InsufficientGPU", False),
        (dep(ready=1), [pod(), pod("q", unschedulable=GPU_MESSAGE)], "Degraded", "InsufficientGPU", True),
        (
            dep(ready=0),
            [pod(unschedulable="0/3 nodes: node(s) didn't match selector")],
            "Degraded",
            "Unschedulable",
            False,
        ),
        (dep(ready=0), [pod(reason="ImagePullBackOff")], "Degraded", "ImagePullBackOff", False),
        (dep(ready=0), [pod(reason="CrashLoopBackOff")], "Degraded", "CrashLoopBackOff", False),
        (dep(ready=0, deadline=True), [], "Failed", "ProgressDeadlineExceeded", False),
        (dep(desired=0, ready=0, updated=0), [], "Pending", "ScaledToZero", False),
    ],
)
def test_phase(deployment: DeploymentView | None, pods: list[PodView], phase: str, reason: str, ready: bool) -> None:
    verdict = decide(MODEL, deployment, pods)
    assert (verdict.phase, verdict.reason, verdict.ready) == (phase, reason, ready)


def test_insufficient_gpu_condition_carries_the_scheduler_message() -> None:
    status = build_status(
        MODEL,
        dep(ready=0),
        [pod("model-x-abc", unschedulable=GPU_MESSAGE)],
        observed_generation=3,
        endpoint="http://e",
        now="2026-01-01T00:00:00Z",
    )
    conditions = {c.type: c for c in status.conditions}
    assert conditions["Ready"].status == "False"
    assert conditions["Degraded"].status == "True"
    assert conditions["Degraded"].reason == "InsufficientGPU"
    assert GPU_MESSAGE in conditions["Degraded"].message
    assert "model-x-abc" in conditions["Degraded"].message
    assert status.phase == "Degraded"
    assert status.observed_generation == 3


def test_ready_status_fields() -> None:
    status = build_status(
        MODEL,
        dep(desired=3, ready=3, updated=3),
        [],
        observed_generation=3,
        endpoint="http://model-x.ns.svc.cluster.local:8000/v1",
        now="t1",
    )
    assert (status.phase, status.ready_replicas, status.desired_replicas) == ("Ready", 3, 3)
    assert status.endpoint == "http://model-x.ns.svc.cluster.local:8000/v1"
    assert status.served_model_name == "llama"
    conditions = {c.type: c for c in status.conditions}
    assert (conditions["Ready"].status, conditions["Ready"].reason) == ("True", "ReplicasReady")
    assert (conditions["Progressing"].status, conditions["Degraded"].status) == ("False", "False")


def test_transition_time_only_moves_when_a_condition_changes() -> None:
    first = build_status(MODEL, dep(ready=0), [], observed_generation=1, endpoint="e", now="t1")
    model = MODEL.model_copy(update={"status": first})
    second = build_status(model, dep(ready=1, updated=1), [], observed_generation=1, endpoint="e", now="t2")
    times = {c.type: c.last_transition_time for c in second.conditions}
    assert times == {"Ready": "t2", "Progressing": "t1", "Degraded": "t1"}
    assert isinstance(second, AIModelStatus)


def test_pod_view_parses_the_scheduler_condition_and_waiting_reasons() -> None:
    raw = {
        "metadata": {"name": "p1"},
        "status": {
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": GPU_MESSAGE}
            ],
            "containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff", "message": "pull failed"}}}],
        },
    }
    view = PodView.parse(raw)
    assert view == PodView("p1", GPU_MESSAGE, "ImagePullBackOff", "pull failed")
    assert PodView.parse({"metadata": {"name": "ok"}, "status": {"phase": "Running"}}) == PodView(
        "ok", None, None, None
    )


def test_deployment_view_parses_status() -> None:
    raw = {
        "metadata": {"generation": 4, "resourceVersion": "9"},
        "spec": {"replicas": 3},
        "status": {
            "observedGeneration": 4,
            "replicas": 3,
            "readyReplicas": 2,
            "updatedReplicas": 3,
            "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}],
        },
    }
    view = DeploymentView.parse(raw)
    assert (view.generation, view.desired, view.ready, view.updated, view.deadline_exceeded) == (4, 3, 2, 3, True)
