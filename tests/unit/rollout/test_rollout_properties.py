"""Property tests for the canary state machine: invariants that must hold for any spec and any sequence of
readiness changes, spec edits, rollout commands, clock jumps and window metrics.

A run is a random sequence of those inputs fed through decide.plan() the way the controller does; every
reconcile is checked against the previous status. Budget invariants close the file.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servlane_api.aifeature import AIFeatureSpec, AIFeatureStatus
from servlane_core.rollout import (
    ROLLOUT_ANNOTATION,
    ModelWindow,
    RolloutPlan,
    WindowMetrics,
    analysis_due,
    combine_overrides,
    models_in_use,
    plan,
    referenced_models,
    split_budget,
)
from servlane_core.rollout.timeutil import parse_duration
from tests.unit.rollout.rollout_helpers import T0, Feature, feature_spec

MODELS = ("a", "b", "c")
COMMANDS = ("pause", "resume", "promote", "abort", "bogus")
PROPERTY_SETTINGS = settings(
    max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


# --- inputs ---


@st.composite
def specs(draw: st.DrawFn) -> AIFeatureSpec:
    steps = sorted(draw(st.sets(st.integers(1, 100), min_size=1, max_size=5)))
    analysis = {
        "maxErrorRate": draw(st.sampled_from([0.0, 0.01, 0.05, 0.2, 0.5])),
        "minRequests": draw(st.integers(1, 50)),
        "failureThreshold": draw(st.integers(1, 3)),
    }
    interval = draw(st.sampled_from(["30s", "1m", "5m"]))
    return feature_spec("a", steps=steps, interval=interval, analysis=analysis)


windows = st.builds(
    lambda requests, error_share: ModelWindow(requests=requests, errors=math.floor(requests * error_share)),
    st.integers(0, 300).map(float),
    st.sampled_from([0.0, 0.0, 0.01, 0.1, 0.6, 1.0]),
)
metrics = st.one_of(
    st.none(),
    st.builds(lambda canary: WindowMetrics(window_seconds=60, models={m: canary for m in MODELS}), windows),
)


@dataclass(frozen=True)
class Step:
    """One input to the controller, followed by a reconcile."""

    kind: str  # tick | due | ready | model | command
    value: Any = None
    metrics: WindowMetrics | None = None


steps_strategy = st.one_of(
    st.builds(Step, st.just("tick"), st.integers(0, 400), metrics),
    st.builds(Step, st.just("due"), st.just(None), metrics),
    st.builds(Step, st.just("ready"), st.tuples(st.sampled_from(MODELS), st.booleans())),
    st.builds(Step, st.just("model"), st.sampled_from(MODELS)),
    st.builds(Step, st.just("command"), st.sampled_from(COMMANDS)),
)
runs = st.lists(steps_strategy, min_size=1, max_size=40)
readiness = st.fixed_dictionaries({m: st.booleans() for m in MODELS})


# --- the driver ---


class Run:
    """A Feature plus the controller's clock; every reconcile goes through `reconcile`, which checks it."""

    def __init__(self, spec: AIFeatureSpec, ready: dict[str, bool], replicas: dict[str, int] | None = None) -> None:
        self.feature = Feature(spec, ready=dict(ready), replicas=replicas)
        self.now = T0
        self.reconcile(None, {})

    @property
    def status(self) -> AIFeatureStatus:
        return self.feature.status

    def next_due(self) -> datetime:
        """The moment the next analysis is due (now when none is pending)."""
        s = self.status
        if s.step_started_at is None:
            return self.now
        anchor = datetime.fromisoformat(s.step_started_at.replace("Z", "+00:00"))
        if s.analyses:
            anchor = max(anchor, datetime.fromisoformat(s.analyses[-1].time.replace("Z", "+00:00")))
        return max(self.now, anchor + timedelta(seconds=parse_duration(self.feature.spec.rollout.interval)))

    def apply(self, step: Step) -> RolloutPlan:
        annotations: dict[str, str] = {}
        if step.kind == "tick":
            self.now += timedelta(seconds=step.value)
        elif step.kind == "due":
            self.now = self.next_due()
        elif step.kind == "ready":
            self.feature.ready[step.value[0]] = step.value[1]
        elif step.kind == "model":
            self.feature.change_model(step.value)
        elif step.kind == "command":
            annotations = {ROLLOUT_ANNOTATION: step.value}
        return self.reconcile(step.metrics, annotations, spec_or_command_changed=step.kind in ("model", "command"))

    def reconcile(
        self, window: WindowMetrics | None, annotations: dict[str, str], spec_or_command_changed: bool = True
    ) -> RolloutPlan:
        before, f = self.status, self.feature
        # What the controller reads after a restart is the status as the API server stored it (JSON).
        stored = AIFeatureStatus.model_validate(json.loads(json.dumps(before.model_dump(by_alias=True, mode="json"))))
        args = (f.spec, before, f.ready, window, self.now, annotations, f.generation)
        result = f.reconcile(self.now, window, annotations)
        again = plan(*args, model_replicas=f.replicas)
        restarted = plan(
            f.spec, stored, f.ready, window, self.now, annotations, f.generation, model_replicas=f.replicas
        )
        # The operator hands plan() only the models the feature refers to (not the whole namespace).
        wanted = referenced_models(f.spec, before)
        narrowed = plan(
            f.spec,
            before,
            {m: r for m, r in f.ready.items() if m in wanted},
            window,
            self.now,
            annotations,
            f.generation,
            model_replicas={m: n for m, n in (f.replicas or {}).items() if m in wanted} if f.replicas else None,
        )
        # Determinism: the same inputs, in memory or read back from the API server, give the same decision;
        # and so does the narrowed view of the namespace.
        for other in (again, restarted, narrowed):
            assert other.status_patch() == result.status_patch()
            assert other.events == result.events
            assert other.requeue_after_seconds == result.requeue_after_seconds
        check_invariants(f.spec, before, result.status, f.ready, f.generation)
        if window is None and not spec_or_command_changed:
            check_no_jump_without_metrics(before, result.status)
        return result


# --- invariants ---


def weights(status: AIFeatureStatus) -> dict[str, int]:
    return {w.model: w.weight for w in status.weights}


def check_invariants(
    spec: AIFeatureSpec, before: AIFeatureStatus, after: AIFeatureStatus, ready: dict[str, bool], generation: int
) -> None:
    now_weights, old_weights = weights(after), weights(before)
    steps = set(spec.rollout.steps)
    # Weights always add up to 100, one entry per model, none of them 0.
    assert len(now_weights) == len(after.weights)
    assert sum(now_weights.values()) == 100
    assert all(w > 0 for w in now_weights.values())
    if (after.canary_weight or 0) < 100:
        assert after.stable_model in now_weights
    # Weights only take values from the steps (or their complement on the stable), 0 and 100.
    if after.canary_model is not None:
        assert after.canary_weight in steps | {0}
        assert now_weights.get(after.canary_model, 0) == after.canary_weight
        assert set(now_weights) <= {after.stable_model, after.canary_model}
    else:
        assert now_weights == {after.stable_model: 100}
    # No traffic moves to a model that is not Ready. The only exception is the stable model taking traffic
    # back (rollback, cancel): it is the safety net, and there is nowhere else to send it.
    for model, weight in now_weights.items():
        if weight > old_weights.get(model, 0) and not ready.get(model, False):
            assert before.stable_model in (model, None), f"{model} got more traffic but is not Ready"
    # Steps move forward one at a time, never backwards, for the same canary.
    same_canary = after.canary_model is not None and after.canary_model == before.canary_model
    if same_canary and before.step_index is not None:
        assert after.step_index is not None
        assert after.step_index - before.step_index in (0, 1)
    # A rolled-back canary gets nothing until the spec changes.
    if after.phase == "RolledBack":
        assert after.rolled_back_model not in now_weights
        assert after.rolled_back_generation == generation


def check_no_jump_without_metrics(before: AIFeatureStatus, after: AIFeatureStatus) -> None:
    """With no window metrics (as right after an operator restart), traffic shifts only when the canary
    first turns Ready (0 -> first step): never a step forward, never a promotion."""
    if before.canary_model is None or after.canary_model != before.canary_model:
        assert after.stable_model == before.stable_model
        return
    if before.step_index is not None:
        assert after.step_index == before.step_index
        assert after.canary_weight == before.canary_weight


# --- properties ---


@PROPERTY_SETTINGS
@given(spec=specs(), ready=readiness, sequence=runs)
def test_invariants_hold_for_any_sequence_of_inputs(
    spec: AIFeatureSpec, ready: dict[str, bool], sequence: list[Step]
) -> None:
    run = Run(spec, ready)
    for step in sequence:
        run.apply(step)


def bring_to_a_step(run: Run) -> None:
    """Whatever state a run ended in, get a canary Ready and carrying traffic at some step."""
    f = run.feature
    for model in MODELS:
        f.ready[model] = True
    s = run.status
    if s.canary_model is None or s.phase not in ("Progressing", "Paused"):
        f.change_model(next(m for m in MODELS if m != s.stable_model))
        run.reconcile(None, {})
    if run.status.phase == "Paused" and run.status.step_index is None:
        run.reconcile(None, {ROLLOUT_ANNOTATION: "resume"})
    if run.status.step_index is None:
        run.reconcile(None, {})
    assert run.status.step_index is not None


@PROPERTY_SETTINGS
@given(
    spec=specs(),
    ready=readiness,
    prefix=runs,
    canary_ready=st.booleans(),
    extra_requests=st.integers(0, 1000),
    error_share=st.floats(0, 1),
)
def test_a_threshold_crossing_with_enough_requests_rolls_back_within_one_interval(
    spec: AIFeatureSpec,
    ready: dict[str, bool],
    prefix: list[Step],
    canary_ready: bool,
    extra_requests: int,
    error_share: float,
) -> None:
    run = Run(spec, ready)
    for step in prefix:
        run.apply(step)
    bring_to_a_step(run)
    analysis = spec.rollout.analysis
    interval = parse_duration(spec.rollout.interval)
    stable, canary = run.status.stable_model, run.status.canary_model
    assert stable is not None
    assert canary is not None
    # A failing canary may have stopped being Ready too: that must not shield it from the rollback.
    run.feature.ready[canary] = canary_ready
    requests = analysis.min_requests + extra_requests
    lowest_failing = math.floor(analysis.max_error_rate * requests) + 1
    errors = min(requests, lowest_failing + math.floor(error_share * (requests - lowest_failing)))
    failing = WindowMetrics(60, {canary: ModelWindow(requests=requests, errors=errors)})
    assert (failing.models[canary].error_rate or 0) > analysis.max_error_rate
    # Failed checks already counted (consecutive) bring the rollback nearer; one check always suffices at 1.
    needed = analysis.failure_threshold - (run.status.failed_checks or 0)
    assert needed >= 1
    # The controller's requeue hint never lets an analysis wait longer than one interval.
    for check in range(needed):
        assert run.feature.last is not None
        assert run.feature.last.requeue_after_seconds is not None
        assert run.feature.last.requeue_after_seconds <= interval
        started = run.now
        run.now = run.next_due()
        assert run.now - started <= timedelta(seconds=interval)
        assert analysis_due(run.feature.spec, run.status, run.now)
        run.reconcile(failing, {})
        if check < needed - 1:
            assert run.status.phase in ("Progressing", "Paused")
    assert run.status.phase == "RolledBack"
    assert weights(run.status) == {stable: 100}
    assert run.status.rolled_back_model == canary


@PROPERTY_SETTINGS
@given(
    total=st.integers(0, 64),
    steps=st.sets(st.integers(1, 100), min_size=1, max_size=6).map(sorted),
    min_stable=st.integers(0, 8),
)
def test_budget_gives_each_side_what_its_traffic_needs(total: int, steps: list[int], min_stable: int) -> None:
    previous_canary = 0
    for weight in [0, *steps]:
        split = split_budget(total, weight, min_stable)
        assert split.canary >= 1  # from the moment a canary exists, so it can become Ready
        assert split.stable >= min_stable
        if weight < 100:
            assert split.stable >= 1  # it still carries traffic
        # The total goes over the budget only where the floors demand it.
        floors = max(min_stable, 1 if weight < 100 else 0)
        assert split.stable + split.canary <= max(total, split.canary + floors)
        assert split.canary * 100 >= total * weight  # enough replicas for the canary's share of traffic
        assert split.canary >= previous_canary  # the canary only grows as its weight grows
        previous_canary = split.canary


def with_budget(spec: AIFeatureSpec, min_stable: int, model: str = "a") -> AIFeatureSpec:
    rollout = spec.rollout.model_copy(update={"fixed_gpu_budget": True, "min_stable_replicas": min_stable})
    return spec.model_copy(update={"rollout": rollout, "model": model})


own_counts = st.fixed_dictionaries({m: st.integers(0, 12) for m in MODELS})


def check_budget(run: Run, pinned_ever: set[str]) -> None:
    """The fixed-GPU-budget invariants of one feature after one reconcile."""
    status, own = run.status, run.feature.replicas or {}
    pins = run.feature.overrides()
    used = models_in_use(status)
    pinned_ever.update(pins)
    assert set(pins) <= set(own), "a pin for a model that does not exist"
    for model in weights(status):
        assert pins.get(model, 1) >= 1, f"{model} carries traffic but is pinned to 0"
    if status.canary_model is not None:
        stable, canary = status.stable_model, status.canary_model
        assert stable is not None
        budget = own.get(stable, 0)
        floors = max(run.feature.spec.rollout.min_stable_replicas, 1 if (status.canary_weight or 0) < 100 else 0)
        in_flight = sum(pins.get(m, 0) for m in (stable, canary))
        # Never above the budget at any step, except where the floors demand it.
        assert in_flight <= max(budget, pins.get(canary, 0) + floors)
        split = split_budget(budget, status.canary_weight or 0, run.feature.spec.rollout.min_stable_replicas)
        assert canary not in own or pins[canary] == split.canary
    else:
        # No rollout in flight: the stable is released (its own replicas, its HPA restored).
        assert status.stable_model not in pins
    # A model this feature pinned and no longer uses is held at 0, whatever happened (promotion, rollback,
    # abort, replacement, cancel): it never springs back to its own count on top of the winner.
    for model in pinned_ever - used:
        if model in own:
            assert pins.get(model) == 0, f"{model} lost the rollout but is not held at 0"


@PROPERTY_SETTINGS
@given(spec=specs(), sequence=runs, own=own_counts, min_stable=st.integers(0, 3))
def test_fixed_budget_holds_at_every_step(
    spec: AIFeatureSpec, sequence: list[Step], own: dict[str, int], min_stable: int
) -> None:
    run = Run(with_budget(spec, min_stable), dict.fromkeys(MODELS, True), replicas=own)
    pinned_ever: set[str] = set()
    check_budget(run, pinned_ever)
    for step in sequence:
        run.apply(step)
        check_budget(run, pinned_ever)


@PROPERTY_SETTINGS
@given(
    spec=specs(),
    second_model=st.sampled_from(MODELS),
    sequence=st.lists(st.tuples(st.sampled_from((0, 1)), steps_strategy), min_size=1, max_size=40),
    own=own_counts,
    min_stable=st.integers(0, 3),
)
def test_two_features_sharing_models_never_starve_each_other(
    spec: AIFeatureSpec,
    second_model: str,
    sequence: list[tuple[int, Step]],
    own: dict[str, int],
    min_stable: int,
) -> None:
    runs_ = [
        Run(with_budget(spec, min_stable), dict.fromkeys(MODELS, True), replicas=own),
        Run(with_budget(spec, min_stable, second_model), dict.fromkeys(MODELS, True), replicas=own),
    ]
    pinned_ever: list[set[str]] = [set(), set()]
    for which, step in sequence:
        runs_[which].apply(step)
        check_budget(runs_[which], pinned_ever[which])
        statuses = [r.status for r in runs_]
        combined = combine_overrides(statuses)
        assert combined == combine_overrides(list(reversed(statuses)))
        for status in statuses:
            own_pins = {o.model: o.replicas for o in status.replica_overrides}
            for model in models_in_use(status):
                # A model a feature uses is never scaled below what that feature asked for, in particular
                # never to 0 by the other's rollback or abort; one it uses unpinned runs its own count.
                merged = combined[model]
                if model in own_pins:
                    assert merged is None or merged >= own_pins[model]
                else:
                    assert combined[model] is None
            for model, weight in weights(status).items():
                assert weight == 0 or combined[model] != 0
