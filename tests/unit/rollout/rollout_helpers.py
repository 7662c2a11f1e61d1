"""Builders for the rollout table tests: specs, window metrics and a driver that feeds plans forward."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from servlane_api.aifeature import AIFeatureSpec, AIFeatureStatus
from servlane_core.rollout import MetricsOutage, ModelWindow, RolloutPlan, WindowMetrics, plan

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def feature_spec(model: str | None = "a", split: list[dict[str, Any]] | None = None, **rollout: Any) -> AIFeatureSpec:
    body: dict[str, Any] = {"rollout": {"interval": "1m", **rollout}}
    if split is not None:
        body["split"] = split
    else:
        body["model"] = model
    return AIFeatureSpec.model_validate(body)


def window(
    requests: float = 100,
    errors: float = 0,
    ttft: float | None = None,
    latency: float | None = None,
    client_errors: float = 0,
) -> ModelWindow:
    return ModelWindow(
        requests=requests,
        errors=errors,
        p95_ttft_seconds=ttft,
        p95_latency_seconds=latency,
        client_errors=client_errors,
    )


STABLE = window(requests=1000, errors=1)


def canary_metrics(
    canary: ModelWindow, name: str = "b", stable: str = "a", stable_window: ModelWindow = STABLE
) -> WindowMetrics:
    return WindowMetrics(window_seconds=60, models={name: canary, stable: stable_window})


@dataclass
class Feature:
    """An AIFeature as the controller sees it: spec, generation, annotations, and the last status."""

    spec: AIFeatureSpec
    generation: int = 1
    status: AIFeatureStatus = field(default_factory=AIFeatureStatus)
    ready: dict[str, bool] = field(default_factory=lambda: {"a": True, "b": True, "c": True})
    # The AIModels' own replica counts (plan's model_replicas); None: no AIModels (standalone).
    replicas: dict[str, int] | None = None
    at_zero: frozenset[str] = frozenset()  # AIModels whose ScaledToZero condition is True
    failing: dict[str, str] = field(default_factory=dict)  # AIModels whose Degraded condition is True: why
    last: RolloutPlan | None = None

    def reconcile(
        self,
        at: datetime,
        metrics: WindowMetrics | MetricsOutage | None = None,
        annotations: Mapping[str, str] | None = None,
        min_window_seconds: float = 0.0,
    ) -> RolloutPlan:
        self.last = plan(
            self.spec,
            self.status,
            self.ready,
            metrics,
            at,
            annotations or {},
            self.generation,
            min_window_seconds=min_window_seconds,
            model_replicas=self.replicas,
            models_at_zero=self.at_zero,
            models_failing=self.failing,
        )
        self.status = self.last.status
        return self.last

    def change_model(self, model: str) -> None:
        self.spec = self.spec.model_copy(update={"model": model})
        self.generation += 1

    def phase(self) -> str | None:
        # A method, not status.phase, so type checkers do not narrow it across reconciles.
        return self.status.phase

    def overrides(self) -> dict[str, int]:
        return {o.model: o.replicas for o in self.status.replica_overrides}

    def weights(self) -> dict[str, int]:
        return {w.model: w.weight for w in self.status.weights}

    def condition(self, kind: str) -> tuple[str, str, str]:
        found = next(c for c in self.status.conditions if c.type == kind)
        return found.status, found.reason, found.message

    def event_reasons(self) -> list[str]:
        assert self.last is not None
        return [e.reason for e in self.last.events]


def at_first_step(steps: list[int] | None = None, *, replicas: dict[str, int] | None = None, **rollout: Any) -> Feature:
    """Stable `a`, canary `b` Ready and at the first step, stepped in at T0."""
    feature = Feature(feature_spec("a", steps=steps or [5, 25, 50, 100], **rollout), replicas=replicas)
    feature.reconcile(T0 - MINUTE)
    feature.change_model("b")
    feature.reconcile(T0)
    assert feature.status.step_index == 0
    return feature
