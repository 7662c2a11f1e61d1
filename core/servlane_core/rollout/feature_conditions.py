"""The AIFeature's Ready / Progressing / Degraded conditions, derived from the rollout's new status."""

from __future__ import annotations

from collections.abc import Mapping

from servlane_api.aifeature import AIFeatureStatus
from servlane_api.conditions import Condition


def feature_conditions(
    status: AIFeatureStatus,
    total_steps: int,
    models_ready: Mapping[str, bool],
    degraded: Condition | None,
    generation: int,
    progressing: Condition | None = None,
    models_at_zero: frozenset[str] = frozenset(),
) -> list[Condition]:
    """Conditions for `status` (whose own conditions are ignored); `degraded` is the rollback's, if any;
    `progressing` replaces the derived Progressing condition (a pause at the progress deadline);
    `models_at_zero`: the AIModels scaled to zero (their ScaledToZero condition), woken by the next request."""
    conditions = [
        _ready(status, models_ready, models_at_zero),
        progressing if progressing is not None else _progressing(status, total_steps),
        degraded if degraded is not None else Condition(type="Degraded", status="False", reason="AsExpected"),
    ]
    return [c.model_copy(update={"observed_generation": generation}) for c in conditions]


def _ready(status: AIFeatureStatus, models_ready: Mapping[str, bool], models_at_zero: frozenset[str]) -> Condition:
    serving = [w.model for w in status.weights if w.weight > 0]
    if not serving:
        return Condition(type="Ready", status="False", reason="NoModel", message="No model receives traffic.")
    not_ready = [m for m in serving if not models_ready.get(m, False)]
    if not_ready and all(m in models_at_zero for m in not_ready):
        # At rest, not broken: like the AIModel's own Ready (reason ScaledToZero), so GitOps health and people
        # can tell an idle feature from one whose model fails (examples/argocd/health reads the reason).
        message = f"AIModel(s) {', '.join(not_ready)} scaled to zero; the next request through the gateway wakes them."
        return Condition(type="Ready", status="False", reason="ScaledToZero", message=message)
    if not_ready:
        message = f"AIModel(s) {', '.join(not_ready)} receive traffic but are not Ready."
        return Condition(type="Ready", status="False", reason="ModelNotReady", message=message)
    return Condition(type="Ready", status="True", reason="Serving", message=f"Serving {', '.join(serving)}.")


def _progressing(status: AIFeatureStatus, total_steps: int) -> Condition:
    canary, stable = status.canary_model, status.stable_model
    if status.phase == "Split":
        return Condition(type="Progressing", status="False", reason="FixedSplit", message="Fixed traffic split.")
    if status.phase == "RolledBack":
        message = f"Canary {status.rolled_back_model} was rolled back; {stable} serves all traffic."
        return Condition(type="Progressing", status="False", reason="RolledBack", message=message)
    if status.phase == "Paused":
        # Kubernetes Deployments report a paused rollout as Progressing=Unknown.
        message = f"Rollout of {canary} paused at {status.canary_weight or 0}%."
        return Condition(type="Progressing", status="Unknown", reason="RolloutPaused", message=message)
    if status.phase == "Progressing" and status.step_index is None:
        message = f"Waiting for canary {canary} to be Ready before moving traffic."
        return Condition(type="Progressing", status="True", reason="WaitingForCanary", message=message)
    if status.phase == "Progressing":
        step = (status.step_index or 0) + 1
        message = f"Canary {canary} at {status.canary_weight}% (step {step}/{total_steps})."
        last = status.last_analysis
        if last is not None and last.canary_model == canary and last.outcome == "inconclusive":
            # Say why the rollout is not moving, and since when: the progress deadline counts from there.
            message += f" No verdict since {status.awaiting_verdict_since}: {last.message}"
            return Condition(type="Progressing", status="True", reason="AnalysisInconclusive", message=message)
        return Condition(type="Progressing", status="True", reason="CanaryStep", message=message)
    return Condition(type="Progressing", status="False", reason="RolloutComplete", message=f"{stable} is stable.")
