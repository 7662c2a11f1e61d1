"""What the models say of themselves, beside the window metrics: Ready, and why one that is not cannot serve.

The metrics alone miss a canary that crashes: once its pods are not Ready the gateway sends it nothing, so
its window has too few requests for a verdict and the rollout would hold until the progress deadline with
part of the users' traffic promised to a model that is down. Its AIModel says why (a runtime that keeps
crashing, a model that cannot load or be fetched): a canary with traffic that is not Ready and says so
fails its check at once (Flagger and Argo Rollouts wait for their progress deadline here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from servlane_core.rollout.analysis import CheckResult


@dataclass(frozen=True)
class CanaryHealth:
    ready: Mapping[str, bool]
    # Models that report why they cannot serve (an AIModel's Degraded condition), by name: "<reason>: <message>".
    failing: Mapping[str, str]

    def is_ready(self, model: str) -> bool:
        return self.ready.get(model, False)

    def failure(self, model: str) -> str | None:
        """Why a model that is not Ready cannot serve, when it says; None when it is Ready or only not yet."""
        return None if self.is_ready(model) else self.failing.get(model)


def failed_if_down(result: CheckResult, health: CanaryHealth, canary: str) -> CheckResult:
    """The check, failed when the canary is down and says why, whatever its window's numbers were: good
    numbers from before it went down, or too few requests because it went down."""
    failure = health.failure(canary)
    if failure is None or result.outcome == "fail":
        return result
    return dataclasses.replace(result, outcome="fail", message=f"canary {canary} is not Ready: {failure}")
