"""Standard Kubernetes conditions (metav1.Condition) shared by both resources' status."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import Field

from servlane_api._base import ApiModel

ConditionStatus = Literal["True", "False", "Unknown"]


# Ready=False reason while an object named like one of the model's children belongs to someone else.
CHILD_CONFLICT = "ChildConflict"
# Degraded=True reason while the API server refuses a child made from the spec: a cluster's own policy on
# Deployments (a ValidatingAdmissionPolicy, a webhook) or a check of the child's API the CRD lacks. The message
# is its refusal.
CHILD_REJECTED = "ChildRejected"


class Condition(ApiModel):
    type: str = Field(description="Condition type, e.g. Ready, Progressing, Degraded.")
    status: ConditionStatus
    reason: str = Field(description="One CamelCase word saying why, e.g. InsufficientGPU.")
    message: str = Field(default="", description="What a person should know, in a sentence.")
    last_transition_time: str | None = Field(default=None, description="RFC 3339 time of the last change.")
    observed_generation: int | None = None


def now_rfc3339() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def merge_conditions(old: list[Condition], new: list[Condition], now: str) -> list[Condition]:
    """New conditions, keeping each one's lastTransitionTime when its status did not change."""
    previous = {c.type: c for c in old}
    merged: list[Condition] = []
    for cond in new:
        before = previous.get(cond.type)
        changed = before is None or before.status != cond.status
        stamp = now if changed or before is None else (before.last_transition_time or now)
        merged.append(cond.model_copy(update={"last_transition_time": stamp}))
    return merged
