"""What the canary analysis reads: per-model request, error and 4xx counts and p95s over one analysis window."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class ModelWindow:
    """One AIModel's traffic for one feature over the window. p95s are None when nothing was observed.

    `errors` are server-side failures (5xx, timeouts, cut streams, error events inside a 200 stream);
    `client_errors` are the backend's own 4xx answers (400, 413, 429...; not the gateway's, not 499). The
    p95s are of successful requests only, so fast failures cannot flatter a canary's latency.
    """

    requests: float
    errors: float
    p95_ttft_seconds: float | None = None
    p95_latency_seconds: float | None = None
    client_errors: float = 0.0

    @property
    def error_rate(self) -> float | None:
        # Counts from Prometheus' increase() are extrapolated floats, hence float division and no int().
        return None if self.requests <= 0 else min(1.0, self.errors / self.requests)

    @property
    def client_error_rate(self) -> float | None:
        return None if self.requests <= 0 else min(1.0, self.client_errors / self.requests)


@dataclass(frozen=True)
class WindowMetrics:
    window_seconds: float
    models: Mapping[str, ModelWindow] = field(default_factory=dict)

    def for_model(self, model: str) -> ModelWindow | None:
        return self.models.get(model)


@dataclass(frozen=True)
class MetricsOutage:
    """The metrics source could not be read for this window: no verdict, and the reason goes into status."""

    reason: str


class MetricsUnavailableError(Exception):
    """The metrics source could not be read (unreachable, bad answer). The caller passes MetricsOutage to plan()."""


class MetricsReader(Protocol):
    @property
    def min_window_seconds(self) -> float:
        """The shortest window this source can measure (e.g. two Prometheus scrapes); shorter intervals are raised."""
        ...

    async def read(
        self, namespace: str, feature: str, models: Sequence[str], window_seconds: float
    ) -> WindowMetrics | None:
        """The feature's per-model metrics over the last window; None when there is no window yet."""
        ...
