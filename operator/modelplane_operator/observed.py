"""Typed views of what the cluster reports about an AIModel's children, parsed from raw objects.

Handlers parse watched Deployments and Pods into these once; the status logic reads only these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Container waiting reasons that will not fix themselves without a change.
BLOCKING_WAIT_REASONS = frozenset(
    {"CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError", "InvalidImageName"}
)


@dataclass(frozen=True)
class DeploymentView:
    generation: int
    observed_generation: int
    desired: int
    replicas: int
    ready: int
    updated: int
    available: int
    deadline_exceeded: bool
    resource_version: str = ""

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> DeploymentView:
        meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status") or {}
        conditions = status.get("conditions") or []
        deadline = any(
            c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded" for c in conditions
        )
        return cls(
            generation=int(meta.get("generation", 0)),
            observed_generation=int(status.get("observedGeneration", 0)),
            desired=int(spec.get("replicas", 1)),
            replicas=int(status.get("replicas", 0)),
            ready=int(status.get("readyReplicas", 0)),
            updated=int(status.get("updatedReplicas", 0)),
            available=int(status.get("availableReplicas", 0)),
            deadline_exceeded=deadline,
            resource_version=str(meta.get("resourceVersion", "")),
        )


@dataclass(frozen=True)
class PodView:
    name: str
    unschedulable_message: str | None
    blocking_reason: str | None
    blocking_message: str | None

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> PodView:
        status = body.get("status") or {}
        unschedulable = None
        for cond in status.get("conditions") or []:
            if (cond.get("type"), cond.get("status"), cond.get("reason")) == ("PodScheduled", "False", "Unschedulable"):
                unschedulable = str(cond.get("message") or "the pod cannot be scheduled")
        reason = message = None
        for cs in status.get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in BLOCKING_WAIT_REASONS:
                reason, message = str(waiting["reason"]), str(waiting.get("message") or waiting["reason"])
        return cls(
            name=str(body.get("metadata", {}).get("name", "")),
            unschedulable_message=unschedulable,
            blocking_reason=reason,
            blocking_message=message,
        )
