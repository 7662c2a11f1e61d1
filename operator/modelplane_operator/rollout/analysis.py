"""One canary check: the canary's window metrics against the spec's thresholds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from modelplane_api.aifeature import Analysis
from modelplane_operator.rollout.metrics import ModelWindow, WindowMetrics

Outcome = Literal["pass", "fail", "insufficient"]


@dataclass(frozen=True)
class Breach:
    """A threshold the canary crossed, named the way the spec names it."""

    metric: str
    value: float
    threshold: float

    def describe(self) -> str:
        return f"{self.metric} {self.value:.4g} > {self.threshold:.4g}"


@dataclass(frozen=True)
class CheckResult:
    outcome: Outcome
    canary: ModelWindow | None
    stable: ModelWindow | None
    breaches: tuple[Breach, ...]
    message: str


def check_canary(analysis: Analysis, metrics: WindowMetrics | None, canary: str, stable: str | None) -> CheckResult:
    stable_window = metrics.for_model(stable) if metrics is not None and stable else None
    if metrics is None:
        # The scrape reader's first window after a restart is only a baseline: no verdict yet.
        return CheckResult("insufficient", None, stable_window, (), "no metrics for this window yet")
    window = metrics.for_model(canary)
    requests = window.requests if window is not None else 0.0
    if window is None or requests < analysis.min_requests:
        message = f"canary saw {requests:.0f} requests, fewer than minRequests {analysis.min_requests}"
        return CheckResult("insufficient", window, stable_window, (), message)
    breaches = _breaches(analysis, window)
    if breaches:
        return CheckResult("fail", window, stable_window, breaches, "; ".join(b.describe() for b in breaches))
    return CheckResult("pass", window, stable_window, (), f"canary within thresholds over {requests:.0f} requests")


def _breaches(analysis: Analysis, window: ModelWindow) -> tuple[Breach, ...]:
    found: list[Breach] = []
    error_rate = window.error_rate
    if error_rate is not None and error_rate > analysis.max_error_rate:
        found.append(Breach("maxErrorRate", error_rate, analysis.max_error_rate))
    ttft_limit = analysis.max_p95_time_to_first_token_seconds
    # A p95 of None means no observations (e.g. no streamed responses): nothing to judge, not a failure.
    if ttft_limit is not None and window.p95_ttft_seconds is not None and window.p95_ttft_seconds > ttft_limit:
        found.append(Breach("maxP95TimeToFirstTokenSeconds", window.p95_ttft_seconds, ttft_limit))
    latency_limit = analysis.max_p95_latency_seconds
    if (
        latency_limit is not None
        and window.p95_latency_seconds is not None
        and window.p95_latency_seconds > latency_limit
    ):
        found.append(Breach("maxP95LatencySeconds", window.p95_latency_seconds, latency_limit))
    return tuple(found)
