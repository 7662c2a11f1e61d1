"""Table tests for the canary state machine (decide.plan): every transition from spec, status and metrics."""

from __future__ import annotations

import json

import pytest

from servlane_api.aifeature import AIFeatureStatus
from servlane_core.rollout import (
    ROLLOUT_ANNOTATION,
    ModelWindow,
    WindowMetrics,
    analysis_due,
    models_to_measure,
    plan,
)
from tests.unit.rollout.rollout_helpers import MINUTE, T0, Feature, at_first_step, canary_metrics, feature_spec, window

GOOD = canary_metrics(window(requests=100, errors=1, ttft=0.2, latency=1.0))


def test_first_model_is_stable_at_full_traffic() -> None:
    feature = Feature(feature_spec("a"))
    result = feature.reconcile(T0)
    assert feature.status.phase == "Stable"
    assert feature.status.stable_model == "a"
    assert feature.weights() == {"a": 100}
    assert feature.condition("Ready")[:2] == ("True", "Serving")
    assert feature.condition("Progressing")[:2] == ("False", "RolloutComplete")
    assert feature.event_reasons() == ["ModelSelected"]
    assert result.requeue_after_seconds is None
    assert feature.status.observed_generation == 1


def test_first_model_not_ready_is_reported_not_ready() -> None:
    feature = Feature(feature_spec("a"), ready={"a": False})
    feature.reconcile(T0)
    assert feature.condition("Ready")[:2] == ("False", "ModelNotReady")


def test_a_model_at_rest_at_zero_is_told_from_a_failing_one() -> None:
    """Scaled to zero is at rest (GitOps health shows it Healthy by this reason); one model at zero and another
    not Ready for another reason is not at rest."""
    resting = Feature(feature_spec("a"), ready={"a": False}, at_zero=frozenset({"a"}))
    resting.reconcile(T0)
    status, reason, message = resting.condition("Ready")[:3]
    assert (status, reason) == ("False", "ScaledToZero")
    assert "a scaled to zero" in message
    halves = [{"model": "a", "weight": 50}, {"model": "b", "weight": 50}]
    split = Feature(feature_spec(split=halves), ready={"a": False, "b": False}, at_zero=frozenset({"a"}))
    split.reconcile(T0)
    assert split.condition("Ready")[:2] == ("False", "ModelNotReady")


def test_new_model_waits_for_canary_ready_without_traffic() -> None:
    feature = Feature(feature_spec("a", progressDeadlineSeconds=7200))  # the deadline is tested elsewhere
    feature.reconcile(T0)
    feature.change_model("b")
    feature.ready["b"] = False
    result = feature.reconcile(T0 + MINUTE)
    assert feature.status.phase == "Progressing"
    assert (feature.status.canary_model, feature.status.canary_weight) == ("b", 0)
    assert feature.status.step_index is None
    assert feature.weights() == {"a": 100}
    assert feature.condition("Progressing")[:2] == ("True", "WaitingForCanary")
    assert feature.event_reasons() == ["RolloutStarted"]
    assert result.requeue_after_seconds is not None
    # Still not Ready an hour later: still no traffic and no analysis, whatever the metrics say.
    feature.reconcile(T0 + 60 * MINUTE, metrics=canary_metrics(window(errors=100)))
    assert feature.weights() == {"a": 100}
    assert feature.status.analyses == []
    feature.ready["b"] = True
    feature.reconcile(T0 + 61 * MINUTE)
    assert feature.weights() == {"a": 95, "b": 5}
    assert feature.status.step_started_at == "2025-03-01T13:01:00Z"
    assert feature.condition("Progressing")[:2] == ("True", "CanaryStep")


@pytest.mark.parametrize(
    ("canary", "analysis", "verdict", "phase", "weights", "breached"),
    [
        pytest.param(window(100, 1), {}, "advance", "Progressing", {"a": 75, "b": 25}, None, id="advance"),
        pytest.param(window(19, 0), {}, "hold", "Progressing", {"a": 95, "b": 5}, None, id="hold-few-requests"),
        pytest.param(None, {}, "hold", "Progressing", {"a": 95, "b": 5}, None, id="hold-no-canary-series"),
        pytest.param(window(100, 20), {}, "rollback", "RolledBack", {"a": 100}, "maxErrorRate", id="error-rate"),
        pytest.param(
            window(100, 0, ttft=2.5),
            {"maxP95TimeToFirstTokenSeconds": 2.0},
            "rollback",
            "RolledBack",
            {"a": 100},
            "maxP95TimeToFirstTokenSeconds",
            id="ttft",
        ),
        pytest.param(
            window(100, 0, latency=9.0),
            {"maxP95LatencySeconds": 5.0},
            "rollback",
            "RolledBack",
            {"a": 100},
            "maxP95LatencySeconds",
            id="latency",
        ),
        pytest.param(
            window(100, 0, ttft=2.5, latency=9.0),
            {},
            "advance",
            "Progressing",
            {"a": 75, "b": 25},
            None,
            id="no-latency-thresholds-set",
        ),
        pytest.param(window(100, 5), {}, "advance", "Progressing", {"a": 75, "b": 25}, None, id="error-rate-at-limit"),
    ],
)
def test_analysis_verdicts(
    canary: ModelWindow | None,
    analysis: dict[str, float],
    verdict: str,
    phase: str,
    weights: dict[str, int],
    breached: str | None,
) -> None:
    feature = at_first_step(analysis=analysis)
    metrics = canary_metrics(canary) if canary is not None else canary_metrics(window(), name="other")
    feature.reconcile(T0 + MINUTE, metrics=metrics)
    record = feature.status.last_analysis
    assert record is not None
    assert (record.verdict, record.step, record.canary_model, record.canary_weight) == (verdict, 0, "b", 5)
    assert feature.status.phase == phase
    assert feature.weights() == weights
    if breached is None:
        assert feature.condition("Degraded")[:2] == ("False", "AsExpected")
        return
    status, reason, message = feature.condition("Degraded")
    assert (status, reason) == ("True", "AnalysisFailed")
    assert breached in message
    assert feature.status.rolled_back_model == "b"
    assert feature.status.canary_model is None
    assert feature.last is not None
    warnings = [e for e in feature.last.events if e.type == "Warning"]
    assert [e.reason for e in warnings] == ["RolledBack"]
    assert breached in warnings[0].message


def test_rollback_message_names_metric_value_and_threshold() -> None:
    feature = at_first_step()
    feature.reconcile(T0 + MINUTE, metrics=canary_metrics(window(200, 40)))
    message = feature.condition("Degraded")[2]
    assert "maxErrorRate 0.2 > 0.05" in message
    assert feature.status.last_analysis is not None
    assert feature.status.last_analysis.canary_error_rate == pytest.approx(0.2)
    assert feature.status.last_analysis.stable_error_rate == pytest.approx(0.001)


def test_no_analysis_before_the_interval_is_over() -> None:
    feature = at_first_step()
    assert not analysis_due(feature.spec, feature.status, T0 + MINUTE / 2)
    result = feature.reconcile(T0 + MINUTE / 2, metrics=canary_metrics(window(100, 100)))
    assert feature.status.phase == "Progressing"
    assert feature.status.analyses == []
    assert result.requeue_after_seconds == pytest.approx(30)
    assert analysis_due(feature.spec, feature.status, T0 + MINUTE)


def test_hold_waits_a_full_interval_and_missing_metrics_hold() -> None:
    feature = at_first_step()
    feature.reconcile(T0 + MINUTE, metrics=None)  # e.g. the scrape reader's baseline window
    assert feature.status.last_analysis is not None
    assert feature.status.last_analysis.verdict == "hold"
    assert feature.status.step_started_at == "2025-03-01T12:00:00Z"
    assert not analysis_due(feature.spec, feature.status, T0 + MINUTE + MINUTE / 2)
    assert analysis_due(feature.spec, feature.status, T0 + 2 * MINUTE)
    feature.reconcile(T0 + 2 * MINUTE, metrics=GOOD)
    assert feature.weights() == {"a": 75, "b": 25}


def test_walks_every_step_then_promotes() -> None:
    feature = at_first_step()
    seen = [feature.status.canary_weight]
    for minute in range(1, 4):
        feature.reconcile(T0 + minute * MINUTE, metrics=GOOD)
        seen.append(feature.status.canary_weight)
    assert seen == [5, 25, 50, 100]
    assert feature.weights() == {"b": 100}
    assert feature.status.stable_model == "a"  # still warm and the rollback target at 100%
    feature.reconcile(T0 + 4 * MINUTE, metrics=GOOD)
    assert feature.status.phase == "Stable"
    assert feature.status.stable_model == "b"
    assert feature.status.canary_model is None
    assert feature.weights() == {"b": 100}
    assert feature.event_reasons() == ["Promoted"]
    assert [a.verdict for a in feature.status.analyses] == ["advance", "advance", "advance", "promote"]
    assert feature.condition("Progressing")[:2] == ("False", "RolloutComplete")


def test_analysis_history_is_bounded() -> None:
    feature = at_first_step(progressDeadlineSeconds=3600)
    for minute in range(1, 16):
        feature.reconcile(T0 + minute * MINUTE, metrics=canary_metrics(window(requests=1)))
    assert len(feature.status.analyses) == 10
    assert feature.status.analyses[-1].time == "2025-03-01T12:15:00Z"
    assert feature.status.analyses[0].time == "2025-03-01T12:06:00Z"


def test_failure_threshold_counts_consecutive_failures() -> None:
    feature = at_first_step(analysis={"failureThreshold": 3})
    bad = canary_metrics(window(100, 50))
    feature.reconcile(T0 + MINUTE, metrics=bad)
    feature.reconcile(T0 + 2 * MINUTE, metrics=bad)
    assert (feature.status.phase, feature.status.failed_checks, feature.status.canary_weight) == ("Progressing", 2, 5)
    assert feature.event_reasons() == ["AnalysisFailed"]
    assert feature.last is not None
    assert feature.last.events[0].type == "Warning"
    feature.reconcile(T0 + 3 * MINUTE, metrics=GOOD)  # a pass resets the count
    assert (feature.status.failed_checks, feature.status.canary_weight) == (0, 25)
    for minute in (4, 5):
        feature.reconcile(T0 + minute * MINUTE, metrics=bad)
    assert feature.status.phase == "Progressing"
    feature.reconcile(T0 + 6 * MINUTE, metrics=bad)
    assert feature.phase() == "RolledBack"
    assert feature.weights() == {"a": 100}
    assert [a.verdict for a in feature.status.analyses][-3:] == ["hold", "hold", "rollback"]


def test_rolled_back_stays_on_stable_until_spec_changes() -> None:
    feature = at_first_step()
    feature.reconcile(T0 + MINUTE, metrics=canary_metrics(window(100, 90)))
    degraded = feature.condition("Degraded")
    for minute in (2, 30):
        result = feature.reconcile(T0 + minute * MINUTE, metrics=GOOD)
        assert feature.status.phase == "RolledBack"
        assert feature.weights() == {"a": 100}
        assert feature.condition("Degraded") == degraded
        assert result.events == ()
        assert result.requeue_after_seconds is None
    # Any spec change (here: the same model again, a new generation) tries the canary again.
    feature.generation += 1
    feature.reconcile(T0 + 31 * MINUTE)
    assert (feature.status.phase, feature.status.canary_model) == ("Progressing", "b")
    assert feature.status.rolled_back_model is None
    assert feature.condition("Degraded")[:2] == ("False", "AsExpected")


def test_rolled_back_then_another_model_or_back_to_stable() -> None:
    other = at_first_step()
    other.reconcile(T0 + MINUTE, metrics=canary_metrics(window(100, 90)))
    other.change_model("c")
    other.reconcile(T0 + 2 * MINUTE)
    assert (other.status.phase, other.status.canary_model, other.status.canary_weight) == ("Progressing", "c", 5)
    back = at_first_step()
    back.reconcile(T0 + MINUTE, metrics=canary_metrics(window(100, 90)))
    back.change_model("a")
    back.reconcile(T0 + 2 * MINUTE)
    assert (back.status.phase, back.status.stable_model, back.status.rolled_back_model) == ("Stable", "a", None)
    back.change_model("b")  # changed away and back: a fresh try
    back.reconcile(T0 + 3 * MINUTE)
    assert (back.status.phase, back.status.canary_model) == ("Progressing", "b")


def test_spec_changes_during_a_rollout() -> None:
    feature = at_first_step()
    feature.reconcile(T0 + MINUTE, metrics=GOOD)
    feature.ready["c"] = False
    feature.change_model("c")
    feature.reconcile(T0 + 2 * MINUTE)
    assert feature.event_reasons() == ["CanaryReplaced", "RolloutStarted"]
    assert (feature.status.canary_model, feature.status.step_index) == ("c", None)
    assert feature.weights() == {"a": 100}
    feature.change_model("a")
    feature.reconcile(T0 + 3 * MINUTE)
    assert feature.event_reasons() == ["RolloutCancelled"]
    assert (feature.status.phase, feature.status.canary_model) == ("Stable", None)
    assert models_to_measure(feature.status) == ["a"]


def _command(feature: Feature, command: str, minute: int, metrics: WindowMetrics | None = None) -> list[str]:
    result = feature.reconcile(T0 + minute * MINUTE, metrics=metrics, annotations={ROLLOUT_ANNOTATION: command})
    assert result.consumed_annotation == ROLLOUT_ANNOTATION
    return [e.reason for e in result.events]


def test_pause_holds_the_step_but_keeps_the_safety_net() -> None:
    feature = at_first_step()
    assert _command(feature, "pause", 0) == ["RolloutPaused"]
    assert feature.status.phase == "Paused"
    assert feature.condition("Progressing")[:2] == ("Unknown", "RolloutPaused")
    feature.reconcile(T0 + 5 * MINUTE, metrics=GOOD)
    assert (feature.status.phase, feature.status.canary_weight) == ("Paused", 5)
    assert feature.status.last_analysis is not None
    assert feature.status.last_analysis.verdict == "hold"
    feature.reconcile(T0 + 6 * MINUTE, metrics=canary_metrics(window(100, 60)))
    assert feature.phase() == "RolledBack"


def test_resume_restarts_the_window() -> None:
    feature = at_first_step()
    _command(feature, "pause", 0)
    assert _command(feature, "resume", 10, metrics=GOOD) == ["RolloutResumed"]
    assert feature.status.phase == "Progressing"
    assert feature.status.step_started_at == "2025-03-01T12:10:00Z"
    assert feature.status.canary_weight == 5  # the resume itself judged nothing
    feature.reconcile(T0 + 11 * MINUTE, metrics=GOOD)
    assert feature.status.canary_weight == 25


def test_manual_promote_and_abort() -> None:
    promoted = at_first_step()
    assert _command(promoted, "promote", 0) == ["Promoted"]
    assert (promoted.status.phase, promoted.status.stable_model, promoted.weights()) == ("Stable", "b", {"b": 100})
    aborted = at_first_step()
    assert _command(aborted, "abort", 0) == ["RolledBack"]
    assert (aborted.status.phase, aborted.weights(), aborted.status.rolled_back_model) == (
        "RolledBack",
        {"a": 100},
        "b",
    )
    assert aborted.condition("Degraded")[:2] == ("True", "ManualAbort")
    assert aborted.last is not None
    assert aborted.last.events[0].type == "Warning"


def test_promote_refused_while_canary_not_ready() -> None:
    feature = Feature(feature_spec("a"))
    feature.reconcile(T0)
    feature.change_model("b")
    feature.ready["b"] = False
    assert _command(feature, "promote", 1) == ["RolloutStarted", "PromoteRefused"]
    assert feature.weights() == {"a": 100}


@pytest.mark.parametrize(
    ("command", "reason"),
    [("pause", "RolloutCommandIgnored"), ("abort", "RolloutCommandIgnored"), ("faster", "UnknownRolloutCommand")],
)
def test_commands_without_a_rollout_are_consumed_with_a_warning(command: str, reason: str) -> None:
    feature = Feature(feature_spec("a"))
    feature.reconcile(T0)
    assert _command(feature, command, 1) == [reason]
    assert feature.status.phase == "Stable"
    assert feature.last is not None
    assert feature.last.events[0].type == "Warning"


def test_fixed_split() -> None:
    split = [{"model": "a", "weight": 70}, {"model": "b", "weight": 30}]
    feature = Feature(feature_spec(split=split))
    result = feature.reconcile(T0, metrics=canary_metrics(window(100, 100)))
    assert (feature.status.phase, feature.status.stable_model) == ("Split", None)
    assert feature.weights() == {"a": 70, "b": 30}
    assert feature.status.analyses == []
    assert not analysis_due(feature.spec, feature.status, T0 + 60 * MINUTE)
    assert feature.condition("Progressing")[:2] == ("False", "FixedSplit")
    ignored = feature.reconcile(T0, annotations={ROLLOUT_ANNOTATION: "promote"})
    assert [e.reason for e in ignored.events] == ["RolloutCommandIgnored"]
    assert result.requeue_after_seconds is None


@pytest.mark.parametrize(
    ("model", "phase", "stable", "canary"), [("b", "Stable", "b", None), ("c", "Progressing", "a", "c")]
)
def test_from_split_back_to_one_model(model: str, phase: str, stable: str, canary: str | None) -> None:
    feature = Feature(feature_spec(split=[{"model": "a", "weight": 70}, {"model": "b", "weight": 30}]))
    feature.reconcile(T0)
    feature.spec = feature_spec(model)
    feature.generation += 1
    feature.ready["c"] = False
    feature.reconcile(T0 + MINUTE)
    assert (feature.status.phase, feature.status.stable_model, feature.status.canary_model) == (phase, stable, canary)


def test_resumes_after_restart_from_status_alone() -> None:
    feature = at_first_step()
    feature.reconcile(T0 + MINUTE, metrics=GOOD)
    assert feature.last is not None
    # What the API server keeps: the status as JSON, read back by a freshly started controller.
    stored = json.loads(json.dumps(feature.last.status_patch()))
    restored = AIFeatureStatus.model_validate(stored)
    assert restored == feature.status
    assert stored["stepStartedAt"] == "2025-03-01T12:01:00Z"
    again = plan(feature.spec, restored, feature.ready, GOOD, T0 + 2 * MINUTE, {}, feature.generation)
    assert (again.status.canary_weight, again.status.step_index) == (50, 2)
    early = plan(feature.spec, restored, feature.ready, GOOD, T0 + MINUTE + MINUTE / 2, {}, feature.generation)
    assert early.status.canary_weight == 25


def test_cleared_fields_are_explicit_nulls_in_the_patch() -> None:
    feature = at_first_step()
    feature.reconcile(T0, annotations={ROLLOUT_ANNOTATION: "promote"})
    assert feature.last is not None
    patch = feature.last.status_patch()
    assert patch["canaryModel"] is None
    assert patch["stepStartedAt"] is None


def test_condition_transition_time_kept_while_status_unchanged() -> None:
    feature = at_first_step()
    first = next(c for c in feature.status.conditions if c.type == "Ready").last_transition_time
    feature.reconcile(T0 + MINUTE, metrics=GOOD)
    assert next(c for c in feature.status.conditions if c.type == "Ready").last_transition_time == first


@pytest.mark.parametrize("last_step", [False, True], ids=["advance", "promote"])
def test_passing_metrics_do_not_move_traffic_onto_a_canary_that_is_not_ready(last_step: bool) -> None:
    feature = at_first_step(steps=[100] if last_step else [5, 25])
    feature.ready["b"] = False
    feature.reconcile(T0 + MINUTE, metrics=GOOD)
    assert feature.status.canary_model == "b"
    assert feature.weights() == ({"b": 100} if last_step else {"a": 95, "b": 5})
    assert feature.status.analyses[-1].verdict == "hold"
    assert "not Ready" in feature.status.analyses[-1].message
    # Ready again: the next passing check moves on.
    feature.ready["b"] = True
    feature.reconcile(T0 + 2 * MINUTE, metrics=GOOD)
    assert feature.weights() == ({"b": 100} if last_step else {"a": 75, "b": 25})
    assert feature.status.phase == ("Stable" if last_step else "Progressing")


CRASHING = "RuntimeCrashLoop: pod b-1: the runtime exited with code 137 (2 restarts, back-off before the next): Killed"
TOO_FEW = canary_metrics(window(requests=3))  # what a down canary's window shows: the gateway sends it nothing


@pytest.mark.parametrize("metrics", [GOOD, TOO_FEW, None], ids=["numbers-from-before", "too-few-requests", "none"])
def test_a_canary_with_traffic_that_is_down_and_says_why_is_rolled_back_at_its_next_check(
    metrics: WindowMetrics | None,
) -> None:
    feature = at_first_step(steps=[50, 100])
    feature.ready["b"], feature.failing["b"] = False, CRASHING
    feature.reconcile(T0 + MINUTE - 1e-3 * MINUTE, metrics=metrics)  # no check before the interval is over
    assert feature.phase() == "Progressing"
    feature.reconcile(T0 + MINUTE, metrics=metrics)
    assert feature.phase() == "RolledBack"
    assert feature.weights() == {"a": 100}
    assert feature.status.rolled_back_model == "b"
    record = feature.status.analyses[-1]
    assert (record.outcome, record.verdict) == ("fail", "rollback")
    assert record.message == f"Canary b rolled back at 50%: canary b is not Ready: {CRASHING}."
    assert feature.condition("Degraded")[0] == "True"
    assert CRASHING in feature.condition("Degraded")[2]


def test_a_down_canary_counts_towards_the_failure_threshold_like_any_failed_check() -> None:
    feature = at_first_step(steps=[50, 100], analysis={"failureThreshold": 2})
    feature.ready["b"], feature.failing["b"] = False, CRASHING
    feature.reconcile(T0 + MINUTE, metrics=TOO_FEW)
    assert (feature.phase(), feature.status.failed_checks) == ("Progressing", 1)
    assert "AnalysisFailed" in feature.event_reasons()
    feature.reconcile(T0 + 2 * MINUTE, metrics=TOO_FEW)
    assert feature.phase() == "RolledBack"


def test_a_canary_that_failed_metrics_keeps_the_metrics_reason_when_it_is_also_down() -> None:
    feature = at_first_step(steps=[50, 100])
    feature.ready["b"], feature.failing["b"] = False, CRASHING
    feature.reconcile(T0 + MINUTE, metrics=canary_metrics(window(requests=100, errors=50)))
    assert feature.phase() == "RolledBack"
    assert "maxErrorRate 0.5 > 0.05" in feature.status.analyses[-1].message


def test_down_without_a_reason_or_degraded_but_ready_is_left_to_the_metrics() -> None:
    # Not Ready and no reason given (e.g. a pod being replaced): holds, as before.
    feature = at_first_step(steps=[50, 100])
    feature.ready["b"] = False
    feature.reconcile(T0 + MINUTE, metrics=TOO_FEW)
    assert (feature.phase(), feature.status.analyses[-1].verdict) == ("Progressing", "hold")
    # Degraded but Ready (one replica of two crash-looping): the window's numbers decide.
    feature = at_first_step(steps=[50, 100])
    feature.failing["b"] = CRASHING
    feature.reconcile(T0 + MINUTE, metrics=GOOD)
    assert feature.weights() == {"b": 100}
    assert feature.status.analyses[-1].verdict == "advance"


def test_a_canary_that_fails_to_start_before_any_traffic_waits_for_the_deadline_which_says_why() -> None:
    feature = Feature(feature_spec("a", progressDeadlineSeconds=600))
    feature.reconcile(T0)
    feature.change_model("b")
    feature.ready["b"], feature.failing["b"] = False, CRASHING
    feature.reconcile(T0 + MINUTE)
    assert (feature.phase(), feature.weights()) == ("Progressing", {"a": 100})  # nothing at risk: it may recover
    feature.reconcile(T0 + 11 * MINUTE)
    assert feature.phase() == "RolledBack"
    assert f"canary b is not Ready ({CRASHING})" in feature.condition("Degraded")[2]


@pytest.mark.parametrize("interval", ["1000h", "100000000h", "9" * 31 + "h"])
def test_an_interval_past_the_maximum_counts_as_the_maximum(interval: str) -> None:
    """Admitted before the maximum (stored objects keep routing): the window is capped, where a datetime past
    year 9999 raised on every reconcile and the rollout never moved."""
    feature = at_first_step(interval=interval)
    result = feature.reconcile(T0 + MINUTE, metrics=canary_metrics(window(100, 100)))
    assert feature.status.phase == "Progressing"
    assert result.requeue_after_seconds == pytest.approx(168 * 3600 - 60)
    assert analysis_due(feature.spec, feature.status, T0 + 168 * 60 * MINUTE)
