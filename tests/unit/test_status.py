"""The status decision: phase and conditions from what the cluster reports."""

from __future__ import annotations

from typing import Any

import pytest

from servlane_api.aimodel import AIModelStatus
from servlane_api.runtime_exit import ENGINE_DIED, MODEL_LOAD_FAILED
from servlane_operator.builders.deployment import build_deployment
from servlane_operator.observed import ContainerExit, DeploymentView, PodView
from servlane_operator.settings import OperatorSettings
from servlane_operator.status import build_status, decide
from tests.support.aimodels import make_model
from tests.support.status import dep

MODEL = make_model({"source": {"uri": "/models/x"}, "resources": {"gpus": 4}})
SETTINGS = OperatorSettings()
GPU_MESSAGE = "0/3 nodes are available: 1 node(s) didn't tolerate taint, 2 Insufficient nvidia.com/gpu."


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


def running(name: str, template_hash: str) -> PodView:
    return PodView(
        name=name, unschedulable_message=None, blocking_reason=None, blocking_message=None, template_hash=template_hash
    )


@pytest.mark.parametrize(
    ("pods", "phase"),
    [
        # Every pod runs the template the new generation asks for: no rollout is coming (a strategy switch, a
        # replica count), so the model stays Ready while the Deployment controller catches up.
        ([running("a", "h1"), running("b", "h1")], "Ready"),
        # One pod from another template, or one from before hashes: the new generation may roll pods.
        ([running("a", "h1"), running("b", "h0")], "Deploying"),
        ([running("a", "h1"), running("b", "")], "Deploying"),
        # No pod seen yet: nothing shows the template is current.
        ([], "Deploying"),
    ],
)
def test_a_new_generation_is_a_rollout_only_when_the_pods_run_another_template(pods: list[PodView], phase: str) -> None:
    unobserved = dep(gen=3, observed=2, template_hash="h1")
    assert decide(MODEL, unobserved, pods).phase == phase
    # A Deployment from before the hash (none on it) is judged by its generation alone.
    assert decide(MODEL, dep(gen=3, observed=2), [running("a", ""), running("b", "")]).phase == "Deploying"


def test_the_template_hash_follows_the_template_not_the_strategy_or_replicas() -> None:
    model = make_model({"source": {"uri": "/models/x"}})
    surge = build_deployment(model, SETTINGS)
    replace_all = build_deployment(model, SETTINGS, 3, replace_all=True)
    assert surge["spec"]["strategy"] != replace_all["spec"]["strategy"]
    hashes = {
        DeploymentView.parse(surge).template_hash,
        DeploymentView.parse(replace_all).template_hash,
        PodView.parse({"metadata": surge["spec"]["template"]["metadata"]}).template_hash,
    }
    assert len(hashes) == 1
    assert "" not in hashes
    other = build_deployment(make_model({"source": {"uri": "/models/y"}}), SETTINGS)
    assert DeploymentView.parse(other).template_hash not in hashes


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
    assert times == {"Ready": "t2", "Progressing": "t1", "Degraded": "t1", "ScaledToZero": "t1"}
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


LOAD_FAILURE = "ModelSourceError: model path '/models/x' does not exist or is not a directory"


def runtime_status(ready: bool = False, restarts: int = 3, **states: dict[str, Any]) -> dict[str, Any]:
    return {"name": "runtime", "ready": ready, "restartCount": restarts, **states}


def pod_with(*container_statuses: dict[str, Any], deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "model-x-abc"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": "Running", "containerStatuses": list(container_statuses)}}


CRASH_LOOPING = runtime_status(
    state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
    lastState={"terminated": {"exitCode": MODEL_LOAD_FAILED, "reason": "Error", "message": LOAD_FAILURE + "\n"}},
)


def test_a_crash_looping_runtime_is_parsed_with_its_termination_message() -> None:
    view = PodView.parse(pod_with(CRASH_LOOPING))
    assert view.runtime_exit == ContainerExit("runtime", MODEL_LOAD_FAILED, LOAD_FAILURE, 3, backing_off=True)
    # Running again (loading once more) after a crash: still the last exit, no longer backing off.
    restarting = runtime_status(state={"running": {}}, lastState=CRASH_LOOPING["lastState"])
    assert PodView.parse(pod_with(restarting)).runtime_exit == ContainerExit(
        "runtime", MODEL_LOAD_FAILED, LOAD_FAILURE, 3, backing_off=False
    )
    # An OOM kill leaves no message: the kubelet's reason stands in.
    oom = runtime_status(state={"terminated": {"exitCode": 137, "reason": "OOMKilled"}}, restarts=0)
    assert PodView.parse(pod_with(oom)).runtime_exit == ContainerExit("runtime", 137, "OOMKilled", 0, False)


@pytest.mark.parametrize(
    "healthy",
    [
        pod_with(runtime_status(ready=True, state={"running": {}}, lastState=CRASH_LOOPING["lastState"])),
        pod_with(runtime_status(state={"running": {}}, lastState={"terminated": {"exitCode": 0}})),
        pod_with(runtime_status(state={"running": {}}, restarts=0)),
        pod_with(runtime_status(state={"terminated": {"exitCode": 143, "reason": "Error"}}), deleting=True),
    ],
    ids=["ready-again-after-a-crash", "clean-exit", "first-start", "stopped-on-purpose"],
)
def test_no_runtime_exit_is_reported_for_a_pod_that_serves_or_was_stopped(healthy: dict[str, Any]) -> None:
    assert PodView.parse(healthy).runtime_exit is None


def test_a_model_that_cannot_load_makes_the_aimodel_say_model_load_failed() -> None:
    status = build_status(
        MODEL,
        dep(ready=0),
        [PodView.parse(pod_with(CRASH_LOOPING))],
        observed_generation=2,
        endpoint="http://e",
        now="2026-01-01T00:00:00Z",
    )
    conditions = {c.type: c for c in status.conditions}
    assert status.phase == "Degraded"
    assert (conditions["Ready"].status, conditions["Ready"].reason) == ("False", "ModelLoadFailed")
    assert (conditions["Degraded"].status, conditions["Degraded"].reason) == ("True", "ModelLoadFailed")
    message = conditions["Degraded"].message
    assert message == (
        f"pod model-x-abc: the model failed to load (3 restarts, back-off before the next): {LOAD_FAILURE}"
    )


def test_a_runtime_whose_engine_died_is_a_crash_loop_even_while_other_replicas_serve() -> None:
    died = runtime_status(
        restarts=1,
        state={"running": {}},
        lastState={"terminated": {"exitCode": ENGINE_DIED, "message": "the engine died: vLLM's engine core"}},
    )
    verdict = decide(MODEL, dep(ready=1), [pod("ok"), PodView.parse(pod_with(died))])
    assert (verdict.phase, verdict.reason, verdict.ready, verdict.degraded) == (
        "Degraded",
        "RuntimeCrashLoop",
        True,
        True,
    )
    assert verdict.message == "pod model-x-abc: the engine died (1 restart): the engine died: vLLM's engine core"


def test_a_long_log_tail_is_cut_to_its_end() -> None:
    log_tail = "\n".join(f"line {i}" for i in range(500)) + "\nRuntimeError: the real cause"
    crash = runtime_status(state={"terminated": {"exitCode": 1, "message": log_tail}})
    verdict = decide(MODEL, dep(ready=0), [PodView.parse(pod_with(crash))])
    assert verdict.reason == "RuntimeCrashLoop"
    assert verdict.message.endswith("line 499 RuntimeError: the real cause")
    assert "\n" not in verdict.message
    assert len(verdict.message) < 600
    assert "the runtime exited with code 1 (3 restarts): …" in verdict.message


def test_a_crash_loop_is_reported_before_the_bare_back_off() -> None:
    view = PodView.parse(pod_with(CRASH_LOOPING))
    assert view.blocking_reason == "CrashLoopBackOff"
    assert decide(MODEL, dep(ready=0), [view]).reason == "ModelLoadFailed"


def test_a_model_at_zero_says_so_and_how_it_wakes() -> None:
    autoscaled = make_model(
        {
            "source": {"uri": "/models/x"},
            "autoscaling": {"minReplicas": 0, "maxReplicas": 2, "scaleToZeroAfter": "10m"},
        },
        autoscaler={"desiredReplicas": 0, "reason": "Idle", "lastActivityTime": "2026-01-01T00:00:00Z"},
    )
    status = build_status(
        autoscaled, dep(desired=0, ready=0, updated=0), [], observed_generation=3, endpoint="e", now="t"
    )
    conditions = {c.type: c for c in status.conditions}
    assert conditions["ScaledToZero"].status == "True"
    assert conditions["Ready"].status == "False"
    assert "after 10m without requests" in conditions["Ready"].message
    assert "the next request through the gateway wakes it" in conditions["ScaledToZero"].message
    # The autoscaler's own status survives a status write (a merge patch of null would clear it).
    assert status.autoscaler is not None
    assert status.autoscaler.reason == "Idle"
    assert status.selector == "servlane.dev/model=llama"  # the scale subresource's selector
    fixed = make_model({"source": {"uri": "/models/x"}, "replicas": 0})
    message = {
        c.type: c
        for c in build_status(
            fixed, dep(desired=0, ready=0, updated=0), [], observed_generation=3, endpoint="e", now="t"
        ).conditions
    }["ScaledToZero"].message
    assert "spec.replicas 0" in message
    serving = build_status(autoscaled, dep(), [], observed_generation=3, endpoint="e", now="t")
    assert {c.type: c.status for c in serving.conditions}["ScaledToZero"] == "False"
