"""One canary check: the canary's window against the stable's over the same window, and the spec's thresholds.

What counts as a failure of the canary:
- server errors (5xx, timeouts, cut streams, error events inside a 200 stream), always;
- backend 4xx (400 from a model without a chat template or a shorter context, 429 from shedding
  load) beyond the stable's own 4xx rate in the same window: clients send the same bad requests to both
  versions, so only the excess is the canary's doing.
The failure rate is judged absolutely (maxErrorRate) and against the stable's (maxErrorRateIncrease); the
p95s of successful requests absolutely (maxP95...Seconds) and against the stable's (maxP95RatioToStable).
A stable with too few requests in the window (it gets none at a 100 % step) is replaced by the last
window of this rollout in which it had enough; without any, 4xx count in full (fail closed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from servlane_api.aifeature import Analysis, AnalysisResult, Rollout
from servlane_core.rollout.window import MetricsOutage, ModelWindow, WindowMetrics

Outcome = Literal["pass", "fail", "inconclusive"]
# p95s come from histogram buckets, coarse at the low end: a ratio of two tiny p95s means little, so the
# relative latency check allows this much on top of the ratio.
RELATIVE_SLACK_SECONDS = 0.25


@dataclass(frozen=True)
class StableBaseline:
    """The stable's rates and p95s that the canary is compared with."""

    requests: float
    error_rate: float
    client_error_rate: float
    p95_ttft_seconds: float | None
    p95_latency_seconds: float | None
    from_history: bool = False  # taken from an earlier window of this rollout

    @classmethod
    def of(cls, window: ModelWindow) -> StableBaseline:
        return cls(
            requests=window.requests,
            error_rate=window.error_rate or 0.0,
            client_error_rate=window.client_error_rate or 0.0,
            p95_ttft_seconds=window.p95_ttft_seconds,
            p95_latency_seconds=window.p95_latency_seconds,
        )


def baseline_from_history(analyses: Sequence[AnalysisResult], canary: str, min_requests: int) -> StableBaseline | None:
    """The stable's numbers from the newest earlier window of this canary's rollout with enough stable traffic."""
    for record in reversed(analyses):
        if record.canary_model == canary and record.stable_requests >= min_requests:
            return StableBaseline(
                requests=record.stable_requests,
                error_rate=record.stable_error_rate or 0.0,
                client_error_rate=record.stable_client_error_rate or 0.0,
                p95_ttft_seconds=record.stable_p95_ttft_seconds,
                p95_latency_seconds=record.stable_p95_latency_seconds,
                from_history=True,
            )
    return None


@dataclass(frozen=True)
class Breach:
    """A threshold the canary crossed, named the way the spec names it, with the numbers that crossed it."""

    metric: str
    detail: str

    def describe(self) -> str:
        return f"{self.metric} {self.detail}"


@dataclass(frozen=True)
class CheckResult:
    outcome: Outcome
    canary: ModelWindow | None
    stable: ModelWindow | None
    baseline: StableBaseline | None
    failure_rate: float | None
    breaches: tuple[Breach, ...]
    message: str


def check_canary(
    analysis: Analysis,
    metrics: WindowMetrics | MetricsOutage | None,
    canary: str,
    stable: str | None,
    earlier: StableBaseline | None = None,
) -> CheckResult:
    """`earlier`: the stable's baseline from an earlier window, used when this window's stable is too small."""
    if metrics is None:
        # The scrape reader's first window after a restart is only a baseline: no verdict yet.
        return CheckResult("inconclusive", None, None, None, None, (), "no metrics for this window yet")
    if isinstance(metrics, MetricsOutage):
        return CheckResult("inconclusive", None, None, None, None, (), f"metrics unavailable: {metrics.reason}")
    window = metrics.for_model(canary)
    stable_window = metrics.for_model(stable) if stable else None
    enough_stable = stable_window is not None and stable_window.requests >= analysis.min_requests
    baseline = StableBaseline.of(stable_window) if stable_window is not None and enough_stable else earlier
    requests = window.requests if window is not None else 0.0
    if window is None or requests < analysis.min_requests:
        message = f"canary saw {requests:.0f} requests, fewer than minRequests {analysis.min_requests}"
        return CheckResult("inconclusive", window, stable_window, baseline, None, (), message)
    failure_rate = _failure_rate(window, baseline)
    breaches = _breaches(analysis, window, baseline, failure_rate)
    summary = _summary(window, failure_rate, stable_window, baseline)
    if breaches:
        message = "; ".join(b.describe() for b in breaches) + f" ({summary})"
        return CheckResult("fail", window, stable_window, baseline, failure_rate, breaches, message)
    return CheckResult("pass", window, stable_window, baseline, failure_rate, (), f"within thresholds ({summary})")


def _failure_rate(window: ModelWindow, baseline: StableBaseline | None) -> float:
    expected_client_errors = (baseline.client_error_rate if baseline is not None else 0.0) * window.requests
    excess_client_errors = max(0.0, window.client_errors - expected_client_errors)
    return min(1.0, (window.errors + excess_client_errors) / window.requests)


def _breaches(
    analysis: Analysis, window: ModelWindow, baseline: StableBaseline | None, failure_rate: float
) -> tuple[Breach, ...]:
    found: list[Breach] = []
    if failure_rate > analysis.max_error_rate:
        found.append(Breach("maxErrorRate", f"{failure_rate:.4g} > {analysis.max_error_rate:.4g}"))
    if baseline is not None and failure_rate - baseline.error_rate > analysis.max_error_rate_increase:
        excess, allowed = failure_rate - baseline.error_rate, analysis.max_error_rate_increase
        detail = f"{failure_rate:.4g} - stable {baseline.error_rate:.4g} = {excess:.4g} > {allowed:.4g}"
        found.append(Breach("maxErrorRateIncrease", detail))
    # A p95 of None means no successful observations (e.g. no streamed responses): nothing to judge here;
    # a canary that answers nothing successfully fails on its failure rate above.
    for name, limit, value in (
        ("maxP95TimeToFirstTokenSeconds", analysis.max_p95_time_to_first_token_seconds, window.p95_ttft_seconds),
        ("maxP95LatencySeconds", analysis.max_p95_latency_seconds, window.p95_latency_seconds),
    ):
        if limit is not None and value is not None and value > limit:
            found.append(Breach(name, f"{value:.4g} > {limit:.4g}"))
    if baseline is not None:
        ratio = analysis.max_p95_ratio_to_stable
        for what, value, reference in (
            ("p95 time to first token", window.p95_ttft_seconds, baseline.p95_ttft_seconds),
            ("p95 latency", window.p95_latency_seconds, baseline.p95_latency_seconds),
        ):
            if value is not None and reference is not None and value > ratio * reference + RELATIVE_SLACK_SECONDS:
                detail = f"{what} {value:.4g}s > {ratio:.4g} x stable {reference:.4g}s + {RELATIVE_SLACK_SECONDS}s"
                found.append(Breach("maxP95RatioToStable", detail))
    return tuple(found)


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2%}"


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}s"


def _summary(
    window: ModelWindow, failure_rate: float, stable: ModelWindow | None, baseline: StableBaseline | None
) -> str:
    canary = (
        f"canary: {window.requests:.0f} requests, failures {_rate(failure_rate)} "
        f"(server errors {_rate(window.error_rate)}, 4xx {_rate(window.client_error_rate)}), "
        f"p95 latency {_seconds(window.p95_latency_seconds)}, TTFT {_seconds(window.p95_ttft_seconds)}"
    )
    if baseline is None:
        seen = f"{stable.requests:.0f}" if stable is not None else "no"
        return f"{canary}; stable: {seen} requests, too few to compare (4xx count in full)"
    source = "an earlier window" if baseline.from_history else "this window"
    return (
        f"{canary}; stable ({source}): {baseline.requests:.0f} requests, server errors {_rate(baseline.error_rate)}, "
        f"4xx {_rate(baseline.client_error_rate)}, p95 latency {_seconds(baseline.p95_latency_seconds)}, "
        f"TTFT {_seconds(baseline.p95_ttft_seconds)}"
    )


def analysis_record(
    result: CheckResult,
    verdict: str,
    message: str,
    now_text: str,
    step: int,
    canary: str,
    rollout: Rollout,
    metrics: WindowMetrics | MetricsOutage | None,
) -> AnalysisResult:
    """The check as status.analyses records it: the verdict plan() reached and both windows' numbers."""
    window, stable = result.canary, result.stable
    return AnalysisResult.model_validate(
        {
            "time": now_text,
            "step": step,
            "canary_model": canary,
            "canary_weight": rollout.steps[step],
            "verdict": verdict,
            "outcome": result.outcome,
            "window_seconds": metrics.window_seconds if isinstance(metrics, WindowMetrics) else None,
            "canary_requests": round(window.requests) if window else 0,
            "canary_error_rate": window.error_rate if window else None,
            "canary_client_error_rate": window.client_error_rate if window else None,
            "canary_failure_rate": result.failure_rate,
            "canary_p95_ttft_seconds": window.p95_ttft_seconds if window else None,
            "canary_p95_latency_seconds": window.p95_latency_seconds if window else None,
            # This window's own stable numbers (not an earlier baseline): later windows may use them.
            "stable_requests": round(stable.requests) if stable else 0,
            "stable_error_rate": stable.error_rate if stable else None,
            "stable_client_error_rate": stable.client_error_rate if stable else None,
            "stable_p95_ttft_seconds": stable.p95_ttft_seconds if stable else None,
            "stable_p95_latency_seconds": stable.p95_latency_seconds if stable else None,
            "message": message,
        }
    )
