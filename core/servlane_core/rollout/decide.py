"""The canary state machine: from spec, status, model readiness and window metrics to the next status.

Pure (no I/O; `now` is a parameter) in the style of KubeAI's calculatePodPlan, so it is table-tested
and the controller can restart at any time: everything needed to resume lives in the returned status.

Steps: once the canary AIModel is Ready it gets rollout.steps[0] percent. Every interval the canary's
window metrics are checked against the stable's (analysis.check_canary): no metrics or too few requests
-> hold (inconclusive); a pass -> next step, or promotion after the last step passes (a last step of 100
means one full interval at 100% with the stable still warm); a failure counts towards failureThreshold
(consecutive), and reaching it rolls all traffic back to the stable at once. A canary with traffic that is
not Ready and says why (models_failing: an AIModel's Degraded condition) fails its check whatever its
window shows (canary_health.py). A rolled-back canary gets no traffic until the spec changes (tracked by
rolledBackGeneration).

Progress deadline: a rollout that reaches no verdict (a step, a promotion, a failed check) for
rollout.progressDeadlineSeconds (at least two analysis windows) while Progressing, because the canary is
never Ready, the metrics are unavailable or the canary gets too few requests, is rolled back or paused as
rollout.onProgressDeadline says, with a condition and an event. The interval is never shorter than the
metric source can measure (min_window_seconds, e.g. two Prometheus scrapes): a shorter one is raised,
with a warning event when the rollout starts.

With rollout.fixedGpuBudget the plan also decides status.replicaOverrides (budget.py), from the AIModels'
own replica counts, so the controller only applies what the status says.

The status under construction and the moves on it (start, step, promote, roll back) are in draft.py, the
timing (window, deadline, next analysis, requeue) in schedule.py, the analysis record in analysis.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from servlane_api.aifeature import AIFeatureSpec, AIFeatureStatus, ModelReplicas, Rollout, WeightedModel
from servlane_api.conditions import Condition, merge_conditions
from servlane_core.rollout.analysis import analysis_record, baseline_from_history, check_canary
from servlane_core.rollout.budget import budget_replicas
from servlane_core.rollout.canary_health import CanaryHealth, failed_if_down
from servlane_core.rollout.draft import (
    Draft,
    RolloutEvent,
    anchor_view,
    clear_canary,
    enter_step,
    promote,
    rollback,
    start_canary,
)
from servlane_core.rollout.feature_conditions import feature_conditions
from servlane_core.rollout.schedule import (
    IN_FLIGHT,
    analysis_due,
    analysis_window_seconds,
    next_analysis_at,
    progress_deadline_seconds,
    requeue_after,
)
from servlane_core.rollout.timeutil import from_rfc3339, parse_duration, to_rfc3339
from servlane_core.rollout.window import MetricsOutage, WindowMetrics

__all__ = [
    "ROLLOUT_ANNOTATION",
    "RolloutEvent",
    "RolloutPlan",
    "analysis_due",
    "analysis_window_seconds",
    "models_to_measure",
    "plan",
    "progress_deadline_seconds",
    "referenced_models",
]

ROLLOUT_ANNOTATION = "servlane.dev/rollout"
HISTORY_LIMIT = 10


@dataclass(frozen=True)
class RolloutPlan:
    status: AIFeatureStatus
    events: tuple[RolloutEvent, ...]
    consumed_annotation: str | None  # an annotation key the controller should now remove, if any
    requeue_after_seconds: float | None  # when the next analysis (or readiness poll) is due

    def status_patch(self) -> dict[str, object]:
        """The status for a merge patch: cleared fields are explicit nulls so the API server drops them."""
        return self.status.model_dump(by_alias=True, mode="json")


def plan(
    spec: AIFeatureSpec,
    status: AIFeatureStatus,
    models_ready: Mapping[str, bool],
    metrics: WindowMetrics | MetricsOutage | None,
    now: datetime,
    annotations: Mapping[str, str],
    generation: int,
    *,
    min_window_seconds: float = 0.0,
    model_replicas: Mapping[str, int] | None = None,
    models_at_zero: frozenset[str] = frozenset(),
    models_failing: Mapping[str, str] | None = None,
) -> RolloutPlan:
    """The next status and events. `metrics` is read only when an analysis is due (see analysis_due), over
    analysis_window_seconds(); MetricsOutage when the source failed. `min_window_seconds`: the shortest
    window the metric source can measure (the reader's min_window_seconds). `model_replicas`: the existing
    AIModels of the namespace with the replicas each asks for itself, from which a fixedGpuBudget rollout
    decides status.replicaOverrides (see budget.py); None: no AIModels to scale (standalone).
    `models_failing`: models that report why they cannot serve (an AIModel's Degraded condition: a runtime
    that keeps crashing, a model that cannot load), by name: a canary among them that is not Ready fails its
    next check whatever its window metrics say."""
    draft = Draft.of(status)
    now_text = to_rfc3339(now)
    window = analysis_window_seconds(spec.rollout, min_window_seconds)
    consumed = ROLLOUT_ANNOTATION if ROLLOUT_ANNOTATION in annotations else None
    if spec.split is not None:
        _fixed_split(draft)
        if consumed:
            draft.warn("RolloutCommandIgnored", "A fixed split has no rollout to control.")
    else:
        assert spec.model is not None  # the spec validator guarantees exactly one of model/split
        _follow_spec(draft, spec.model, generation, status)
        if draft.canary is not None and draft.canary != status.canary_model:
            _warn_if_interval_raised(draft, spec.rollout, window)
        if consumed:
            _command(draft, annotations[consumed].strip().lower(), spec.rollout, models_ready, now_text, generation)
        if draft.canary is not None and draft.awaiting_since is None:
            draft.awaiting_since = now_text  # a new rollout (or one from before this field existed)
        health = CanaryHealth(models_ready, models_failing or {})
        _progress(draft, spec.rollout, health, metrics, now, now_text, generation, window)
    new_status = _finalize(draft, spec, status, models_ready, now_text, generation, models_at_zero)
    overrides = budget_replicas(spec, new_status, status, model_replicas or {})
    new_status.replica_overrides = [ModelReplicas(model=m, replicas=r) for m, r in overrides.items()]
    requeue = requeue_after(spec.rollout, new_status, now, window)
    return RolloutPlan(new_status, tuple(draft.events), consumed, requeue)


def referenced_models(spec: AIFeatureSpec, status: AIFeatureStatus) -> set[str]:
    """Every AIModel name plan() may look up for this feature: its target or split, and the models its
    status still holds (stable, canary, rolled back, weights, replica overrides). plan() reads readiness
    and replica counts of these only, so a feature's pass never needs the namespace's other models."""
    names = {spec.model} if spec.model else set()
    names.update(s.model for s in spec.split or [])
    names.update(m for m in (status.stable_model, status.canary_model, status.rolled_back_model) if m)
    names.update(w.model for w in status.weights)
    names.update(r.model for r in status.replica_overrides)
    return names


def models_to_measure(status: AIFeatureStatus) -> list[str]:
    """The models whose window metrics plan() looks at: the canary (judged) and the stable (recorded)."""
    return [m for m in (status.canary_model, status.stable_model) if m]


def _fixed_split(draft: Draft) -> None:
    if draft.phase != "Split":
        draft.note("FixedSplit", "Traffic follows spec.split; no analysis.")
    clear_canary(draft, phase="Split")
    draft.stable = None


def _follow_spec(draft: Draft, target: str, generation: int, status: AIFeatureStatus) -> None:
    if draft.phase == "Split" or draft.stable is None:
        # From a fixed split, a model that already had traffic takes over; any other is a canary
        # against the split's largest share.
        previous = [w for w in status.weights if w.weight > 0] if draft.phase == "Split" else []
        if not previous or any(w.model == target for w in previous):
            clear_canary(draft, phase="Stable")
            draft.stable = target
            draft.note("ModelSelected", f"{target} serves all traffic.")
        else:
            clear_canary(draft, phase="Stable")
            draft.stable = max(previous, key=lambda w: w.weight).model
            start_canary(draft, target)
        return
    if target == draft.stable:
        if draft.canary is not None:
            draft.note("RolloutCancelled", f"spec.model is back to {target}; canary {draft.canary} gets no traffic.")
        clear_canary(draft, phase="Stable")
        return
    if target == draft.canary:
        return
    if draft.phase == "RolledBack" and target == draft.rolled_back_model and generation == draft.rolled_back_generation:
        return  # stays on the stable until the spec changes
    if draft.canary is not None:
        draft.note("CanaryReplaced", f"Canary {draft.canary} replaced by {target}.")
    start_canary(draft, target)


def _command(
    draft: Draft, command: str, rollout: Rollout, ready: Mapping[str, bool], now_text: str, generation: int
) -> None:
    in_flight = draft.canary is not None and draft.phase in IN_FLIGHT
    if command not in ("pause", "resume", "promote", "abort"):
        draft.warn("UnknownRolloutCommand", f"{ROLLOUT_ANNOTATION}={command!r}: use pause, resume, promote or abort.")
    elif command == "pause" and in_flight:
        if draft.phase != "Paused":
            draft.phase = "Paused"
            draft.note("RolloutPaused", f"Rollout of {draft.canary} paused at {draft.canary_weight or 0}%.")
    elif command == "resume" and draft.phase == "Paused":
        draft.phase = "Progressing"
        draft.awaiting_since = now_text  # the progress deadline counts afresh
        if draft.step_index is not None:
            draft.step_started_at = now_text  # the paused time is no analysis window
        draft.note("RolloutResumed", f"Rollout of {draft.canary} resumed.")
    elif command == "promote" and in_flight and draft.canary is not None:
        if ready.get(draft.canary, False):
            promote(draft, f"Canary {draft.canary} promoted by {ROLLOUT_ANNOTATION}=promote.")
        else:
            draft.warn("PromoteRefused", f"Canary {draft.canary} is not Ready; it cannot take all traffic.")
    elif command == "abort" and in_flight:
        message = f"Rollout of {draft.canary} aborted by {ROLLOUT_ANNOTATION}=abort; {draft.stable} serves all traffic."
        rollback(draft, "ManualAbort", message, generation)
    else:
        draft.warn("RolloutCommandIgnored", f"Nothing to {command}: phase is {draft.phase}.")


def _progress(
    draft: Draft,
    rollout: Rollout,
    health: CanaryHealth,
    metrics: WindowMetrics | MetricsOutage | None,
    now: datetime,
    now_text: str,
    generation: int,
    window: float,
) -> None:
    canary = draft.canary
    if canary is None or draft.phase not in IN_FLIGHT:
        return
    if draft.step_index is None:
        # Traffic moves only once the canary is Ready: until then the stable keeps everything.
        if draft.phase == "Progressing" and health.is_ready(canary):
            enter_step(draft, 0, rollout, now_text)
            draft.note("CanaryStep", f"Canary {canary} is Ready: {draft.canary_weight}% of traffic (step 1).")
        else:
            # No traffic yet, so nothing to protect: a canary that fails to start gets the deadline to recover.
            failure = health.failure(canary)
            why = f"canary {canary} is not Ready" + (f" ({failure})" if failure else "")
            _check_deadline(draft, rollout, now, window, why, generation)
        return
    due = next_analysis_at(window, anchor_view(draft))
    if due is None or now < due:
        _check_deadline(draft, rollout, now, window, _why_no_verdict(draft), generation)
        return
    step = min(draft.step_index, len(rollout.steps) - 1)
    earlier = baseline_from_history(draft.analyses, canary, rollout.analysis.min_requests)
    result = failed_if_down(check_canary(rollout.analysis, metrics, canary, draft.stable, earlier), health, canary)
    verdict: Literal["advance", "hold", "promote", "rollback"] = "hold"
    message = result.message
    if result.outcome == "fail":
        draft.failed_checks += 1
        draft.awaiting_since = now_text
        threshold = rollout.analysis.failure_threshold
        if draft.failed_checks >= threshold:
            verdict = "rollback"
            message = f"Canary {canary} rolled back at {draft.canary_weight}%: {result.message}."
            rollback(draft, "AnalysisFailed", message, generation)
        else:
            message = f"Check {draft.failed_checks}/{threshold} failed: {result.message}."
            draft.warn("AnalysisFailed", f"Canary {canary}: {message}")
    elif result.outcome == "pass":
        draft.failed_checks = 0
        if draft.phase == "Paused":
            message = f"Paused: {result.message}."
        elif not health.is_ready(canary):
            # Good numbers from earlier in the window are no reason to move more traffic onto a canary
            # that is not Ready now (a failing one still rolls back above).
            message = f"Canary {canary} is not Ready: holding at {draft.canary_weight}% ({result.message})."
        elif step >= len(rollout.steps) - 1:
            verdict = "promote"
            promote(draft, f"Canary {canary} promoted after the last step: {result.message}.")
        else:
            verdict = "advance"
            enter_step(draft, step + 1, rollout, now_text)
            total = len(rollout.steps)
            draft.note("CanaryStep", f"Canary {canary} at {draft.canary_weight}% (step {step + 2}/{total}).")
    else:
        message = f"No verdict: {result.message}."
    draft.analyses.append(analysis_record(result, verdict, message, now_text, step, canary, rollout, metrics))
    if verdict == "hold":
        _check_deadline(draft, rollout, now, window, message.removeprefix("No verdict: ").rstrip("."), generation)


def _why_no_verdict(draft: Draft) -> str:
    last = draft.analyses[-1] if draft.analyses else None
    if last is not None and last.canary_model == draft.canary and last.verdict == "hold":
        return last.message.removeprefix("No verdict: ").rstrip(".")
    return "no analysis yet"


def _check_deadline(draft: Draft, rollout: Rollout, now: datetime, window: float, why: str, generation: int) -> None:
    """Roll back or pause a Progressing rollout that has had no verdict for the progress deadline."""
    if draft.phase != "Progressing" or draft.canary is None or draft.awaiting_since is None:
        return
    deadline = progress_deadline_seconds(rollout, window)
    waited = (now - from_rfc3339(draft.awaiting_since)).total_seconds()
    if waited < deadline:
        return
    canary = draft.canary
    stalled = f"No verdict on canary {canary} for {waited:.0f}s (progressDeadlineSeconds {deadline:.0f}): {why}"
    if rollout.on_progress_deadline == "Pause":
        draft.phase = "Paused"
        message = f"{stalled}. Paused at {draft.canary_weight or 0}%; resume or abort with {ROLLOUT_ANNOTATION}."
        draft.progressing = Condition(
            type="Progressing", status="False", reason="ProgressDeadlineExceeded", message=message
        )
        draft.warn("ProgressDeadlineExceeded", message)
        return
    message = f"{stalled}. Rolled back: {draft.stable} serves all traffic."
    draft.warn("ProgressDeadlineExceeded", message)
    rollback(draft, "ProgressDeadlineExceeded", message, generation)


def _warn_if_interval_raised(draft: Draft, rollout: Rollout, window: float) -> None:
    interval = parse_duration(rollout.interval)
    if window > interval:
        draft.warn(
            "IntervalRaised",
            f"rollout.interval {rollout.interval} is shorter than the metric source can measure "
            f"(two scrapes): analysing every {window:.0f}s instead.",
        )


def _weights(draft: Draft, spec: AIFeatureSpec) -> list[WeightedModel]:
    if spec.split is not None:
        return [w for w in spec.split if w.weight > 0]
    if draft.stable is None:
        return []
    canary_share = (draft.canary_weight or 0) if draft.canary is not None else 0
    shares = [(draft.stable, 100 - canary_share), (draft.canary, canary_share)]
    return [WeightedModel(model=m, weight=w) for m, w in shares if m is not None and w > 0]


def _finalize(
    draft: Draft,
    spec: AIFeatureSpec,
    old: AIFeatureStatus,
    ready: Mapping[str, bool],
    now_text: str,
    generation: int,
    models_at_zero: frozenset[str] = frozenset(),
) -> AIFeatureStatus:
    analyses = draft.analyses[-HISTORY_LIMIT:]
    in_flight = draft.canary is not None
    status = AIFeatureStatus(
        observed_generation=generation,
        phase=draft.phase,
        stable_model=draft.stable,
        canary_model=draft.canary,
        canary_weight=draft.canary_weight,
        step_index=draft.step_index,
        step_started_at=draft.step_started_at,
        awaiting_verdict_since=draft.awaiting_since if in_flight else None,
        failed_checks=draft.failed_checks if in_flight else None,
        rolled_back_model=draft.rolled_back_model,
        rolled_back_generation=draft.rolled_back_generation,
        weights=_weights(draft, spec),
        last_analysis=analyses[-1] if analyses else None,
        analyses=analyses,
    )
    degraded = draft.degraded
    if degraded is None and draft.phase == "RolledBack":
        # The rollback's reason (metric, value, threshold) outlives the reconcile that decided it.
        degraded = next((c for c in old.conditions if c.type == "Degraded" and c.status == "True"), None)
    progressing = draft.progressing
    if progressing is None and draft.phase == "Paused" and old.phase == "Paused":
        # A pause at the progress deadline keeps saying so until the rollout is resumed or ends.
        progressing = next((c for c in old.conditions if c.reason == "ProgressDeadlineExceeded"), None)
    total_steps = len(spec.rollout.steps)
    new_conditions = feature_conditions(status, total_steps, ready, degraded, generation, progressing, models_at_zero)
    status.conditions = merge_conditions(old.conditions, new_conditions, now_text)
    return status
