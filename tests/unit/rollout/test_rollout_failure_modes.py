"""Every way a canary used to look healthy, or a rollout used to hang, with the verdict each must get.

Driven through the pure state machine (decide.plan) the way the controller drives it: stable `a`, canary
`b` at its first step (5 %), one analysis window later.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from servlane_core.rollout import ROLLOUT_ANNOTATION, MetricsOutage, ModelWindow, WindowMetrics, analysis_due
from servlane_core.routing.picking import pick_backend
from servlane_core.routing.routes import Backend, Route
from servlane_core.routing.sticky_share import StickyShareGuard
from tests.unit.rollout.rollout_helpers import MINUTE, T0, Feature, at_first_step, canary_metrics, feature_spec, window


@dataclass(frozen=True)
class Mode:
    canary: ModelWindow | None  # None: the metrics below stand for the whole window
    stable: ModelWindow = field(default_factory=lambda: window(1000, 1, ttft=0.2, latency=0.8, client_errors=10))
    analysis: dict[str, Any] = field(default_factory=dict)
    metrics: WindowMetrics | MetricsOutage | None = None


FAILURE_MODES = [
    # A base model without a chat template: every chat request is a 400, fast, with no 5xx at all.
    pytest.param(Mode(window(100, 0, client_errors=100)), "rollback", "maxErrorRate", id="400-only-canary"),
    # A shorter context: long prompts get 413 from the canary only.
    pytest.param(Mode(window(100, 0, latency=0.5, client_errors=30)), "rollback", "maxErrorRate", id="413-canary"),
    # Load shedding: 429 with Retry-After is not a 5xx, but clients fail.
    pytest.param(Mode(window(100, 0, latency=0.4, client_errors=20)), "rollback", "maxErrorRate", id="429-canary"),
    # Error events inside 200 streams are counted as server errors by the gateway (reason stream_error).
    pytest.param(Mode(window(100, 15, ttft=0.1, latency=0.5)), "rollback", "maxErrorRate", id="in-stream-errors"),
    # Clients send bad requests to both versions alike: not the canary's fault.
    pytest.param(
        Mode(window(100, 0, latency=0.7, client_errors=10), stable=window(1000, 1, latency=0.8, client_errors=100)),
        "advance",
        None,
        id="4xx-at-the-stables-rate",
    ),
    # Without a stable baseline (it saw too few requests) the canary's 4xx count in full: fail closed.
    pytest.param(
        Mode(window(100, 0, client_errors=10), stable=window(5, 0, client_errors=1)),
        "rollback",
        "maxErrorRate",
        id="4xx-without-a-baseline",
    ),
    # Successful requests three times as slow as the stable's; fast failures cannot pull the p95 down
    # because the gateway's latency histograms hold successes only.
    pytest.param(Mode(window(100, 0, latency=3.0)), "rollback", "maxP95RatioToStable", id="slower-than-stable"),
    pytest.param(Mode(window(100, 0, ttft=1.0)), "rollback", "maxP95RatioToStable", id="slower-first-token"),
    pytest.param(Mode(window(100, 0, ttft=0.3, latency=1.5)), "advance", None, id="latency-within-ratio"),
    pytest.param(
        Mode(window(100, 0, latency=9.0), analysis={"maxP95LatencySeconds": 5.0}, stable=window(1000, 1, latency=8.0)),
        "rollback",
        "maxP95LatencySeconds",
        id="absolute-latency-still-applies",
    ),
    # A flaky stable (10 % errors) with a tolerant maxErrorRate: the canary may not be clearly worse.
    pytest.param(
        Mode(window(100, 20), analysis={"maxErrorRate": 0.5}, stable=window(1000, 100)),
        "rollback",
        "maxErrorRateIncrease",
        id="worse-than-the-stable",
    ),
    pytest.param(
        Mode(window(100, 11), analysis={"maxErrorRate": 0.5}, stable=window(1000, 100)),
        "advance",
        None,
        id="as-flaky-as-the-stable",
    ),
    # Too few samples: no verdict, whatever they say (the benchmark's "4 requests, 0 errors").
    pytest.param(Mode(window(19, 0)), "hold", None, id="too-few-requests"),
    pytest.param(Mode(window(4, 0)), "hold", None, id="killed-mid-step-4-requests"),
    pytest.param(Mode(window(5, 5)), "hold", None, id="too-few-even-if-failing"),
    # The metric source failed, or this is the scrape reader's first (baseline) window.
    pytest.param(
        Mode(None, metrics=MetricsOutage("Prometheus query failed: connection refused")),
        "hold",
        None,
        id="metrics-outage",
    ),
    pytest.param(Mode(None), "hold", None, id="no-window-yet"),
]


@pytest.mark.parametrize(("mode", "verdict", "breach"), FAILURE_MODES)
def test_failure_mode_verdicts(mode: Mode, verdict: str, breach: str | None) -> None:
    feature = at_first_step(analysis=mode.analysis)
    metrics = canary_metrics(mode.canary, stable_window=mode.stable) if mode.canary is not None else mode.metrics
    result = feature.reconcile(T0 + MINUTE, metrics=metrics)
    record = feature.status.last_analysis
    assert record is not None
    assert record.verdict == verdict, record.message
    expected_phase = {"rollback": "RolledBack", "advance": "Progressing", "hold": "Progressing"}[verdict]
    assert feature.status.phase == expected_phase
    if verdict == "hold":
        assert record.outcome == "inconclusive"
        assert feature.weights() == {"a": 95, "b": 5}
        assert feature.condition("Progressing")[1] == "AnalysisInconclusive"
        assert record.message in feature.condition("Progressing")[2]
        return
    # Both sides' numbers are in status, and in the rollback's condition and event.
    assert record.canary_requests == 100
    assert record.stable_requests == round(mode.stable.requests)
    assert record.canary_failure_rate is not None
    assert "canary: 100 requests" in record.message
    assert "stable" in record.message
    if breach is None:
        assert feature.weights() == {"a": 75, "b": 25}
        return
    assert breach in record.message
    status, reason, message = feature.condition("Degraded")
    assert (status, reason) == ("True", "AnalysisFailed")
    assert breach in message
    assert "canary: 100 requests" in message
    assert [e.reason for e in result.events if e.type == "Warning"] == ["RolledBack"]
    assert feature.weights() == {"a": 100}


def test_the_last_step_at_100_percent_compares_with_the_stable_of_an_earlier_window() -> None:
    feature = at_first_step(steps=[50, 100])
    both = canary_metrics(window(100, 0, client_errors=10), stable_window=window(1000, 0, client_errors=100))
    feature.reconcile(T0 + MINUTE, metrics=both)
    assert feature.weights() == {"b": 100}
    # At 100 % the stable gets nothing: its 10 % 4xx from the window before is the baseline.
    alone = canary_metrics(window(200, 0, client_errors=20), stable_window=window(0, 0))
    feature.reconcile(T0 + 2 * MINUTE, metrics=alone)
    assert (feature.status.phase, feature.status.stable_model) == ("Stable", "b")
    assert "an earlier window" in feature.status.analyses[-1].message


# --- one client pinned to the canary ---


def _route(namespace: str = "prod") -> Route:
    backends = tuple(Backend(m, namespace, f"http://{m}", m, True, w) for m, w in (("a", 95), ("b", 5)))
    return Route("chat", namespace, backends)


def _sticky_id_on(route: Route, model: str) -> str:
    """What an attacker does: try ids until one hashes onto the canary."""
    return next(f"id-{n}" for n in range(10_000) if (b := pick_backend(route, f"id-{n}")) and b.model == model)


def _window_with(guard: StickyShareGuard | None) -> WindowMetrics:
    """4 honest requests (20 keys, a fresh user id each) for every request of one attacker whose key and
    chosen X-Request-ID pin it to canary `b`. `b` fails one honest request in five; the attacker's
    requests all succeed, diluting b's error rate."""
    route, rng = _route(), random.Random(7)
    attacker = _sticky_id_on(route, "b")
    counts = {m: {"requests": 0, "errors": 0} for m in ("a", "b")}
    honest_on_canary = 0
    for n in range(10_000):
        honest = n % 5 != 4
        sticky, client = (f"user-{rng.random()}", f"team-{n % 20}") if honest else (attacker, "mallory")
        if guard is not None:
            backend = guard.pick(route, sticky, client, rng=rng).backend
        else:
            backend = pick_backend(route, sticky, rng=rng)
        assert backend is not None
        counts[backend.model]["requests"] += 1
        if honest and backend.model == "b":
            honest_on_canary += 1
            counts["b"]["errors"] += honest_on_canary % 5 == 0
    return WindowMetrics(60, {m: ModelWindow(requests=c["requests"], errors=c["errors"]) for m, c in counts.items()})


@pytest.mark.parametrize(("guarded", "verdict"), [(False, "advance"), (True, "rollback")], ids=["unguarded", "guarded"])
def test_one_client_pinned_to_the_canary_cannot_hide_its_failures(guarded: bool, verdict: str) -> None:
    metrics = _window_with(StickyShareGuard() if guarded else None)
    canary = metrics.models["b"]
    feature = at_first_step()
    feature.reconcile(T0 + MINUTE, metrics=metrics)
    assert feature.status.last_analysis is not None
    assert feature.status.last_analysis.verdict == verdict
    if guarded:
        # The attacker sends a fifth of all traffic; the guard holds it near that share of the canary's
        # (plus MAX_EXCESS_SHARE), instead of the nearly 100 % of the canary its pinned id would get.
        honest = canary.errors * 5
        assert (canary.requests - honest) / canary.requests < 0.5


def test_a_client_that_sends_most_traffic_keeps_its_fair_share_of_the_canary() -> None:
    """The guard does not starve a canary behind a single API key (one app serving all its users)."""
    route, guard, rng = _route(), StickyShareGuard(), random.Random(3)
    picks = [guard.pick(route, f"user-{rng.random()}", "the-only-app", rng=rng) for _ in range(4000)]
    on_canary = sum(1 for p in picks if p.backend is not None and p.backend.model == "b")
    assert not any(p.unpinned for p in picks)
    assert 0.03 < on_canary / len(picks) < 0.07


def test_a_namespace_s_traffic_does_not_move_the_pins_of_a_same_named_feature_elsewhere() -> None:
    """Shares are kept per namespace: a client flooding `chat` in one namespace (where it is nearly all the
    traffic, so may pin freely) gains no pins on the canary of `chat` in another."""

    def prod_picks(other_traffic: bool) -> list[tuple[str | None, bool]]:
        guard, rng, other_rng = StickyShareGuard(), random.Random(5), random.Random(6)
        prod, other = _route("prod"), _route("team-b")
        attacker = _sticky_id_on(prod, "b")
        picks = []
        for n in range(3000):
            if other_traffic:
                for _ in range(3):
                    guard.pick(other, attacker, "mallory", rng=other_rng)
            sticky, client = (attacker, "mallory") if n % 5 == 4 else (f"user-{n}", f"team-{n % 20}")
            pick = guard.pick(prod, sticky, client, rng=rng)
            picks.append((pick.backend.model if pick.backend else None, pick.unpinned))
        return picks

    alone = prod_picks(other_traffic=False)
    assert any(unpinned for _, unpinned in alone)  # the guard is at work in prod
    assert prod_picks(other_traffic=True) == alone


# --- no verdict: the progress deadline ---


def _drive(feature: Feature, minutes: int, metrics: WindowMetrics | MetricsOutage | None) -> None:
    for minute in range(1, minutes + 1):
        feature.reconcile(T0 + minute * MINUTE, metrics=metrics)


OUTAGE = MetricsOutage("none of 2 gateway targets answered")
STALLS = [
    pytest.param(OUTAGE, True, "metrics unavailable: none of 2 gateway targets answered", id="metrics-outage"),
    pytest.param(canary_metrics(window(5, 0)), True, "fewer than minRequests 20", id="too-few-requests"),
    pytest.param(None, False, "canary b is not Ready", id="canary-never-ready"),
]


@pytest.mark.parametrize(("metrics", "canary_ready", "why"), STALLS)
@pytest.mark.parametrize("action", ["Rollback", "Pause"])
def test_no_verdict_within_the_deadline(
    metrics: WindowMetrics | MetricsOutage | None, canary_ready: bool, why: str, action: str
) -> None:
    feature = Feature(feature_spec("a", onProgressDeadline=action))
    feature.reconcile(T0 - MINUTE)
    feature.change_model("b")
    feature.ready["b"] = canary_ready
    feature.reconcile(T0)
    _drive(feature, 9, metrics)
    assert feature.phase() == "Progressing"
    assert feature.status.awaiting_verdict_since == "2025-03-01T12:00:00Z"
    result = feature.reconcile(T0 + 10 * MINUTE, metrics=metrics)
    warnings = {e.reason: e.message for e in result.events if e.type == "Warning"}
    assert "ProgressDeadlineExceeded" in warnings
    assert why in warnings["ProgressDeadlineExceeded"]
    assert "600s" in warnings["ProgressDeadlineExceeded"]
    if action == "Rollback":
        assert feature.phase() == "RolledBack"
        assert feature.weights() == {"a": 100}
        assert feature.condition("Degraded")[:2] == ("True", "ProgressDeadlineExceeded")
        return
    assert feature.phase() == "Paused"
    assert feature.condition("Progressing")[:2] == ("False", "ProgressDeadlineExceeded")
    # It stays paused, and says why, until someone acts; resuming gives a fresh deadline.
    feature.reconcile(T0 + 11 * MINUTE, metrics=metrics)
    assert (feature.phase(), feature.condition("Progressing")[1]) == ("Paused", "ProgressDeadlineExceeded")
    feature.reconcile(T0 + 12 * MINUTE, annotations={ROLLOUT_ANNOTATION: "resume"})
    assert feature.phase() == "Progressing"
    assert feature.status.awaiting_verdict_since == "2025-03-01T12:12:00Z"


def test_verdicts_reset_the_deadline_so_a_long_rollout_completes() -> None:
    feature = at_first_step(interval="5m")
    good = canary_metrics(window(100, 0, latency=0.5))
    for step in range(1, 5):  # 20 minutes in all, each step well inside the deadline
        feature.reconcile(T0 + step * 5 * MINUTE, metrics=good)
    assert (feature.status.phase, feature.status.stable_model) == ("Stable", "b")


def test_a_paused_rollout_does_not_run_into_the_deadline() -> None:
    feature = at_first_step()
    feature.reconcile(T0, annotations={ROLLOUT_ANNOTATION: "pause"})
    _drive(feature, 30, OUTAGE)
    assert feature.phase() == "Paused"
    assert feature.condition("Progressing")[1] == "RolloutPaused"


def test_an_interval_shorter_than_the_metric_source_can_measure_is_raised_with_a_warning() -> None:
    feature = Feature(feature_spec("a", progressDeadlineSeconds=60))
    feature.reconcile(T0 - MINUTE, min_window_seconds=120)
    feature.change_model("b")
    started = feature.reconcile(T0, min_window_seconds=120)
    raised = [e for e in started.events if e.reason == "IntervalRaised"]
    assert len(raised) == 1
    assert raised[0].type == "Warning"
    assert "1m" in raised[0].message
    assert "120s" in raised[0].message
    assert not analysis_due(feature.spec, feature.status, T0 + MINUTE, min_window_seconds=120)
    assert analysis_due(feature.spec, feature.status, T0 + 2 * MINUTE, min_window_seconds=120)
    # The deadline is at least two windows (240 s here), not the 60 s asked for.
    feature.reconcile(T0 + 2 * MINUTE, metrics=OUTAGE, min_window_seconds=120)
    assert feature.phase() == "Progressing"
    feature.reconcile(T0 + 4 * MINUTE, metrics=OUTAGE, min_window_seconds=120)
    assert feature.phase() == "RolledBack"
