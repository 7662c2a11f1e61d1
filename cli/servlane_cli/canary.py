"""The canary controller of standalone mode: the operator's rollout plan, fed from local state.

The same pass as the operator's reconcile_feature (servlane_core.rollout.rollout_pass). What differs is
only the I/O: status lives in memory (and the state file) instead of the API server, events go to the
log, and `generation` counts spec changes seen in the manifests.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from servlane_api.aifeature import AIFeature, AIFeatureStatus
from servlane_core.rollout import (
    ROLLOUT_ANNOTATION,
    MetricsReader,
    rollout_pass,
)

log = logging.getLogger(__name__)


@dataclass
class FeatureController:
    """One AIFeature's rollout state between passes."""

    feature: AIFeature
    status: AIFeatureStatus = field(default_factory=AIFeatureStatus)
    generation: int = 1
    consumed_command: str | None = None  # a rollout annotation value already acted on

    def update_spec(self, feature: AIFeature) -> None:
        """A manifest reload: a changed spec is a new generation (as metadata.generation in a cluster)."""
        if feature.spec != self.feature.spec:
            self.generation += 1
        self.feature = feature

    def _annotations(self) -> dict[str, str]:
        """The rollout command acts once per value: a file's annotation cannot be removed as in a cluster."""
        annotations = dict(self.feature.metadata.get("annotations") or {})
        command = annotations.get(ROLLOUT_ANNOTATION)
        if command is None or command == self.consumed_command:
            annotations.pop(ROLLOUT_ANNOTATION, None)
        return annotations

    async def step(
        self,
        models_ready: Mapping[str, bool],
        reader: MetricsReader,
        now: datetime,
        models_failing: Mapping[str, str] | None = None,
    ) -> bool:
        """One pass of the rollout; True when the status changed. `models_failing`: why a model cannot serve,
        for those that say (a runtime that keeps exiting), as an AIModel's Degraded condition in a cluster."""
        spec, status, name = self.feature.spec, self.status, self.feature.name
        annotations = self._annotations()
        outcome = await rollout_pass(
            self.feature.namespace,
            name,
            spec,
            status,
            models_ready,
            reader,
            now,
            annotations,
            self.generation,
            models_failing=models_failing,
        )
        if outcome.metrics_outage is not None:
            log.warning("canary metrics for %s unavailable: %s", name, outcome.metrics_outage)
        result = outcome.plan
        if result.consumed_annotation is not None:
            self.consumed_command = annotations[result.consumed_annotation]
        for event in result.events:
            level = logging.WARNING if event.type == "Warning" else logging.INFO
            log.log(level, "feature %s: %s: %s", name, event.reason, event.message)
        changed = result.status != status
        self.status = result.status
        return changed
