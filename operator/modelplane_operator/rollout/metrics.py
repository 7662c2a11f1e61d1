"""What the canary analysis reads: per-model request/error counts and p95s over one analysis window."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class ModelWindow:
    """One AIModel's traffic for one feature over the window. p95s are None when nothing was observed."""

    requests: float
    errors: float
    p95_ttft_seconds: float | None = None
    p95_latency_seconds: float | None = None

    @property
    def error_rate(self) -> float | None:
        # Counts from Prometheus' increase() are extrapolated floats, hence float division and no int().
        return None if self.requests <= 0 else min(1.0, self.errors / self.requests)


@dataclass(frozen=True)
class WindowMetrics:
    window_seconds: float
    models: Mapping[str, ModelWindow] = field(default_factory=dict)

    def for_model(self, model: str) -> ModelWindow | None:
        return self.models.get(model)


class MetricsUnavailableError(Exception):
    """The metrics source could not be read (unreachable, bad answer). The caller passes None to plan()."""


class MetricsReader(Protocol):
    async def read(self, feature: str, models: Sequence[str], window_seconds: float) -> WindowMetrics | None:
        """The feature's per-model metrics over the last window; None when there is no window yet."""
        ...
