"""The status one plan() call builds (Draft), its events, and the moves every rollout makes on it: start a
canary, enter a step, promote, roll back, clear the canary. Mutable only inside one plan() call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from servlane_api.aifeature import AIFeatureStatus, AnalysisResult, FeaturePhase, Rollout
from servlane_api.conditions import Condition


@dataclass(frozen=True)
class RolloutEvent:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class Draft:
    """The status being built; mutable only inside one plan() call."""

    phase: FeaturePhase | None
    stable: str | None
    canary: str | None
    canary_weight: int | None
    step_index: int | None
    step_started_at: str | None
    awaiting_since: str | None
    failed_checks: int
    rolled_back_model: str | None
    rolled_back_generation: int | None
    analyses: list[AnalysisResult]
    events: list[RolloutEvent] = field(default_factory=list)
    degraded: Condition | None = None
    progressing: Condition | None = None  # replaces the derived Progressing condition (deadline, no verdict)

    @classmethod
    def of(cls, status: AIFeatureStatus) -> Draft:
        return cls(
            phase=status.phase,
            stable=status.stable_model,
            canary=status.canary_model,
            canary_weight=status.canary_weight,
            step_index=status.step_index,
            step_started_at=status.step_started_at,
            awaiting_since=status.awaiting_verdict_since,
            failed_checks=status.failed_checks or 0,
            rolled_back_model=status.rolled_back_model,
            rolled_back_generation=status.rolled_back_generation,
            analyses=list(status.analyses),
        )

    def note(self, reason: str, message: str) -> None:
        self.events.append(RolloutEvent("Normal", reason, message))

    def warn(self, reason: str, message: str) -> None:
        self.events.append(RolloutEvent("Warning", reason, message))


def start_canary(draft: Draft, target: str) -> None:
    clear_canary(draft, phase="Progressing")
    draft.canary = target
    draft.canary_weight = 0
    draft.note("RolloutStarted", f"Canary {target} against stable {draft.stable}; traffic moves once it is Ready.")


def enter_step(draft: Draft, index: int, rollout: Rollout, now_text: str) -> None:
    draft.step_index = index
    draft.canary_weight = rollout.steps[index]
    draft.step_started_at = now_text
    draft.awaiting_since = now_text


def promote(draft: Draft, message: str) -> None:
    draft.stable = draft.canary
    clear_canary(draft, phase="Stable")
    draft.note("Promoted", message)


def rollback(draft: Draft, reason: str, message: str, generation: int) -> None:
    rolled_back = draft.canary
    clear_canary(draft, phase="RolledBack")
    draft.rolled_back_model = rolled_back
    draft.rolled_back_generation = generation
    draft.degraded = Condition(type="Degraded", status="True", reason=reason, message=message)
    draft.warn("RolledBack", message)


def clear_canary(draft: Draft, phase: FeaturePhase) -> None:
    draft.phase = phase
    draft.canary = None
    draft.canary_weight = None
    draft.step_index = None
    draft.step_started_at = None
    draft.awaiting_since = None
    draft.failed_checks = 0
    draft.rolled_back_model = None
    draft.rolled_back_generation = None


def anchor_view(draft: Draft) -> AIFeatureStatus:
    return AIFeatureStatus(
        phase=draft.phase,
        canary_model=draft.canary,
        step_index=draft.step_index,
        step_started_at=draft.step_started_at,
        analyses=draft.analyses[-1:],
    )
