"""The AIModel's status, decided purely from what the cluster reports (no I/O, no clock)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servlane_api.aimodel import AIModel, AIModelStatus, Phase
from servlane_api.conditions import CHILD_CONFLICT, CHILD_REJECTED, Condition, merge_conditions
from servlane_api.runtime_exit import ENGINE_DIED, MODEL_LOAD_FAILED, MODEL_SOURCE_FAILED
from servlane_operator.labels import MODEL_LABEL
from servlane_operator.observed import ContainerExit, DeploymentView, PodView

# How much of a container's termination message a condition quotes (its end: where a log tail says why).
MAX_EXIT_MESSAGE_CHARS = 512


# The condition (and Ready's reason) of a model at zero replicas.
SCALED_TO_ZERO = "ScaledToZero"


def scaled_to_zero_message(model: AIModel) -> str:
    """What a model at zero means for its callers: autoscaled, the next request wakes it; else it stays."""
    scaling = model.spec.autoscaling
    if scaling is not None and scaling.min_replicas == 0:
        return (
            f"Scaled to zero after {scaling.scale_to_zero_after} without requests; the next request through the "
            "gateway wakes it (held until a pod is ready)."
        )
    if scaling is not None:
        return "At zero replicas; the autoscaler brings it back to minReplicas."
    return "Scaled to zero replicas (spec.replicas 0): requests get 503 until it is scaled up."


@dataclass(frozen=True)
class Verdict:
    phase: Phase
    reason: str
    message: str
    ready: bool
    progressing: bool
    degraded: bool


def _problem(model: AIModel, pods: Sequence[PodView]) -> tuple[str, str] | None:
    """The first reason that blocks pods from running, in order of how actionable it is."""
    gpu_name = model.spec.resources.gpu_resource_name
    for pod in pods:
        msg = pod.unschedulable_message
        if msg is not None and f"Insufficient {gpu_name}" in msg:
            return "InsufficientGPU", f"pod {pod.name} cannot be scheduled: {msg}"
    for pod in pods:
        if pod.unschedulable_message is not None:
            return "Unschedulable", f"pod {pod.name} cannot be scheduled: {pod.unschedulable_message}"
    for pod in pods:
        if pod.model_image_failure is not None:
            message = _tail(pod.model_image_failure, MAX_EXIT_MESSAGE_CHARS)
            return MODEL_SOURCE_FAILED_REASON, f"pod {pod.name}: the model image cannot be pulled: {message}"
    for pod in pods:
        if pod.runtime_exit is not None:
            return _exit_problem(pod.name, pod.runtime_exit)
    for pod in pods:
        if pod.blocking_reason is not None:
            return pod.blocking_reason, f"pod {pod.name}: {pod.blocking_message}"
    return None


# The weights cannot be had from the source: the runtime's exit (MODEL_SOURCE_FAILED), or a model image volume
# the kubelet cannot pull.
MODEL_SOURCE_FAILED_REASON = "ModelSourceFailed"
_EXIT_REASONS = {MODEL_LOAD_FAILED: "ModelLoadFailed", MODEL_SOURCE_FAILED: MODEL_SOURCE_FAILED_REASON}
_EXIT_WHAT = {
    MODEL_LOAD_FAILED: "the model failed to load",
    MODEL_SOURCE_FAILED: "the model's files could not be fetched from its source",
    ENGINE_DIED: "the engine died",
}


def _exit_problem(pod: str, last: ContainerExit) -> tuple[str, str]:
    """ModelLoadFailed, ModelSourceFailed or RuntimeCrashLoop, with what the runtime said as it exited."""
    reason = _EXIT_REASONS.get(last.exit_code, "RuntimeCrashLoop")
    what = _EXIT_WHAT.get(last.exit_code, f"the runtime exited with code {last.exit_code}")
    restarts = f"{last.restarts} restart{'' if last.restarts == 1 else 's'}"
    waiting = ", back-off before the next" if last.backing_off else ""
    return reason, f"pod {pod}: {what} ({restarts}{waiting}): {_tail(last.message, MAX_EXIT_MESSAGE_CHARS)}"


def _tail(text: str, limit: int) -> str:
    """`text` on one line, its end kept when it is too long."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else "…" + flat[-(limit - 1) :]


def carried_conflicts(status: AIModelStatus) -> list[str]:
    """The child conflicts the last reconcile reported: status refreshes between reconciles keep them
    (only a reconcile reads the children's owners, and clears them once the names are free or ours)."""
    ready = next((c for c in status.conditions if c.type == "Ready"), None)
    return [ready.message] if ready is not None and ready.reason == CHILD_CONFLICT else []


def carried_rejection(status: AIModelStatus) -> str | None:
    """The API server's refusal of a child that the last reconcile reported: status refreshes between reconciles
    keep it (until a reconcile applies anew: on a change of the spec, or a retry of a forbidden one)."""
    degraded = next((c for c in status.conditions if c.type == "Degraded"), None)
    return degraded.message if degraded is not None and degraded.reason == CHILD_REJECTED else None


def template_current(deployment: DeploymentView, pods: Sequence[PodView]) -> bool:
    """Whether the Deployment's pods run its current template. Seen by the controller (observedGeneration), or
    every pod carries the template hash the Deployment does: a new generation that changed no template (the
    operator's own strategy switch, a replica count) starts no rollout, so the model stays Ready while the
    controller catches up (before, a resync that switched the strategy showed Ready models as Deploying)."""
    if deployment.observed_generation >= deployment.generation:
        return True
    wanted = deployment.template_hash
    return bool(wanted) and bool(pods) and all(pod.template_hash == wanted for pod in pods)


def decide(
    model: AIModel,
    deployment: DeploymentView | None,
    pods: Sequence[PodView],
    conflicts: Sequence[str] = (),
    rejected: str | None = None,
) -> Verdict:
    if conflicts:
        # Someone else's object holds a child's name: the model cannot be served as specified until it goes.
        return Verdict("Degraded", CHILD_CONFLICT, "; ".join(conflicts), False, False, True)
    if rejected is not None:
        # The spec cannot be applied as it is; what ran before (an earlier spec's Deployment) may still serve.
        serving = deployment is not None and deployment.ready > 0
        return Verdict("Degraded" if serving else "Failed", CHILD_REJECTED, rejected, serving, False, True)
    if deployment is None:
        return Verdict("Pending", "Creating", "The Deployment is being created.", False, True, False)
    rolled_out = template_current(deployment, pods) and deployment.updated >= deployment.desired
    ready = deployment.ready > 0
    if deployment.desired == 0:
        return Verdict("Pending", SCALED_TO_ZERO, scaled_to_zero_message(model), False, False, False)
    if deployment.deadline_exceeded:
        return Verdict(
            "Failed", "ProgressDeadlineExceeded", "The Deployment did not become ready in time.", ready, False, True
        )
    problem = _problem(model, pods)
    if problem is not None:
        reason, message = problem
        return Verdict("Degraded", reason, message, ready, not rolled_out, True)
    if rolled_out and deployment.ready >= deployment.desired:
        msg = f"{deployment.ready}/{deployment.desired} replicas ready."
        return Verdict("Ready", "AllReplicasReady", msg, True, False, False)
    msg = f"{deployment.ready}/{deployment.desired} replicas ready, {deployment.updated} updated."
    return Verdict("Deploying", "Deploying", msg, ready, True, False)


def build_status(
    model: AIModel,
    deployment: DeploymentView | None,
    pods: Sequence[PodView],
    *,
    observed_generation: int | None,
    endpoint: str,
    now: str,
    conflicts: Sequence[str] = (),
    rejected: str | None = None,
) -> AIModelStatus:
    """The new status; conditions keep their transition time when their status did not change.
    `conflicts`: children left alone because someone else's object holds their name (builders.ownership).
    `rejected`: the API server's refusal of a child made from the spec."""
    verdict = decide(model, deployment, pods, conflicts, rejected)

    def cond(kind: str, on: bool, reason_when_on: str, reason_when_off: str) -> Condition:
        return Condition(
            type=kind,
            status="True" if on else "False",
            reason=reason_when_on if on else reason_when_off,
            message=verdict.message,
            observed_generation=observed_generation,
        )

    conditions = [
        cond("Ready", verdict.ready, "ReplicasReady", verdict.reason),
        cond("Progressing", verdict.progressing, verdict.reason, "Stable"),
        cond("Degraded", verdict.degraded, verdict.reason, "AsExpected"),
        Condition(
            type=SCALED_TO_ZERO,
            status="True" if verdict.reason == SCALED_TO_ZERO else "False",
            reason="NoReplicas" if verdict.reason == SCALED_TO_ZERO else "HasReplicas",
            message=verdict.message if verdict.reason == SCALED_TO_ZERO else "",
            observed_generation=observed_generation,
        ),
    ]
    return AIModelStatus(
        observed_generation=observed_generation,
        phase=verdict.phase,
        replicas=deployment.replicas if deployment else 0,
        ready_replicas=deployment.ready if deployment else 0,
        desired_replicas=deployment.desired if deployment else None,
        endpoint=endpoint,
        selector=f"{MODEL_LABEL}={model.name}",
        # Written by the autoscaler alone (autoscaler.py); carried so that a status write never clears it.
        autoscaler=model.status.autoscaler,
        served_model_name=model.served_model_name,
        conditions=merge_conditions(model.status.conditions, conditions, now),
    )
