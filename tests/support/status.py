"""A Deployment as the operator observes it, for the status decisions."""

from __future__ import annotations

from typing import Any

from servlane_operator.observed import DeploymentView


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
        template_hash=kw.get("template_hash", ""),
    )
