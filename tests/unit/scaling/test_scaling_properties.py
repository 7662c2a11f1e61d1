"""Property tests of the autoscaler's decision (servlane_core.scaling): bounds, no flapping, monotone in
load, demand wakes from zero, idleness reaches zero, a fixed-GPU-budget pin is never exceeded."""

from __future__ import annotations

import itertools
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servlane_api.autoscaling import Autoscaling
from servlane_core.rollout import split_budget
from servlane_core.scaling import (
    Decision,
    PodSignals,
    ScalingPolicy,
    ScalingState,
    autoscaled_replicas,
    decide,
    saw_activity,
)

PROPERTY_SETTINGS = settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
TICK = 5.0  # the operator's autoscaler interval


@st.composite
def policies(draw: st.DrawFn) -> ScalingPolicy:
    low = draw(st.integers(0, 5))
    return ScalingPolicy(
        min_replicas=low,
        max_replicas=draw(st.integers(max(1, low), 12)),
        target_in_flight_per_replica=draw(st.integers(1, 16)),
        target_kv_cache_usage=draw(st.none() | st.floats(0.1, 1.0)),
        scale_up_stabilization_seconds=draw(st.sampled_from([0.0, 10.0, 60.0])),
        scale_down_stabilization_seconds=draw(st.sampled_from([0.0, 30.0, 300.0])),
        scale_to_zero_after_seconds=draw(st.sampled_from([1.0, 60.0, 900.0])),
    )


def pods(replicas: int, load: int, kv: float | None = None) -> list[PodSignals]:
    """`replicas` ready pods sharing `load` requests in flight (what a balanced gateway gives them)."""
    if replicas == 0:
        return []
    return [
        PodSignals(running=load / replicas, waiting=0, requests_total=0, kv_cache_usage=kv) for _ in range(replicas)
    ]


def run(policy: ScalingPolicy, start: int, loads: list[int], *, demand: bool = False) -> list[Decision]:
    """Decisions of consecutive ticks, each applied before the next (all pods ready at once)."""
    current, state, now, out = start, ScalingState(), 1_000_000.0, []
    for load in loads:
        decision = decide(policy, current, pods(current, load), active=load > 0, demand=demand, now=now, state=state)
        out.append(decision)
        current, state, now = decision.replicas, decision.state, now + TICK
    return out


@PROPERTY_SETTINGS
@given(policies(), st.integers(0, 20), st.lists(st.integers(0, 200), min_size=1, max_size=60), st.booleans())
def test_bounds_are_always_respected(policy: ScalingPolicy, start: int, loads: list[int], demand: bool) -> None:
    for decision in run(policy, start, loads, demand=demand):
        if decision.replicas == 0:
            assert policy.min_replicas == 0
        else:
            assert policy.serving_floor <= decision.replicas <= policy.max_replicas, decision


@PROPERTY_SETTINGS
@given(policies(), st.integers(1, 12), st.integers(1, 200), st.integers(2, 120))
def test_a_constant_load_never_flaps(policy: ScalingPolicy, start: int, load: int, ticks: int) -> None:
    """Under one load the count moves in one direction, then stays."""
    counts = [start] + [d.replicas for d in run(policy, start, [load] * ticks)]
    ups = any(b > a for a, b in itertools.pairwise(counts))
    downs = any(b < a for a, b in itertools.pairwise(counts))
    assert not (ups and downs), counts


@PROPERTY_SETTINGS
@given(
    policies(),
    st.integers(1, 12),
    st.integers(0, 200),
    st.integers(0, 200),
    st.floats(0, 10_000),
    st.floats(0, 10_000),
)
def test_more_load_never_means_fewer_replicas(
    policy: ScalingPolicy, current: int, load_a: int, load_b: int, since_scale: float, since_busy: float
) -> None:
    low, high = sorted((load_a, load_b))
    now = 1_000_000.0
    state = ScalingState(last_scale_time=now - since_scale, last_activity_time=now, last_busy_time=now - since_busy)

    def replicas(load: int) -> int:
        return decide(
            policy, current, pods(current, load), active=load > 0, demand=False, now=now, state=state
        ).replicas

    assert replicas(low) <= replicas(high)


@PROPERTY_SETTINGS
@given(policies(), st.floats(0, 1e6))
def test_demand_wakes_a_model_at_zero_at_once(policy: ScalingPolicy, idle_for: float) -> None:
    now = 2_000_000.0
    state = ScalingState(last_scale_time=now - 1, last_activity_time=now - idle_for)
    decision = decide(policy, 0, [], active=False, demand=True, now=now, state=state)
    assert decision.replicas == policy.serving_floor
    assert decision.reason == "Demand"


@PROPERTY_SETTINGS
@given(policies(), st.integers(1, 12))
def test_an_idle_model_reaches_zero_after_its_window_and_stays(policy: ScalingPolicy, start: int) -> None:
    policy = replace(policy, min_replicas=0)
    ticks = int(policy.scale_to_zero_after_seconds // TICK) + 2
    decisions = run(policy, start, [0] * (ticks + 10))
    counts = [d.replicas for d in decisions]
    first_zero = counts.index(0)
    assert first_zero * TICK >= policy.scale_to_zero_after_seconds  # not before the window
    assert first_zero <= ticks
    assert set(counts[first_zero:]) == {0}
    assert decisions[first_zero].reason == "Idle"


@PROPERTY_SETTINGS
@given(policies(), st.integers(1, 12), st.integers(1, 200))
def test_a_model_with_requests_or_held_demand_never_goes_to_zero(policy: ScalingPolicy, start: int, load: int) -> None:
    policy = replace(policy, min_replicas=0)
    for decision in run(policy, start, [load] * 300):
        assert decision.replicas > 0
    for decision in run(policy, start, [0] * 300, demand=True):
        assert decision.replicas > 0


@PROPERTY_SETTINGS
@given(
    policies(),
    st.integers(0, 12),
    st.integers(0, 12),
    st.integers(0, 100),
    st.integers(0, 3),
    st.lists(st.integers(0, 500), min_size=1, max_size=40),
)
def test_a_fixed_gpu_budget_is_never_exceeded_during_a_rollout(
    policy: ScalingPolicy, current: int, budget: int, weight: int, min_stable: int, loads: list[int]
) -> None:
    """While a rollout pins the stable and the canary to their split of the budget, the load (however
    high) never raises either above its share."""
    split = split_budget(budget, weight, min_stable)
    for pin in (split.stable, split.canary):
        state, now, replicas = ScalingState(), 1_000_000.0, current
        for load in loads:
            decision = decide(
                policy, replicas, pods(replicas, load), active=True, demand=True, now=now, state=state, pinned=pin
            )
            assert decision.replicas == pin
            replicas, state, now = decision.replicas, decision.state, now + TICK


def test_scale_down_is_one_replica_per_window() -> None:
    policy = ScalingPolicy(1, 10, 4, None, 0, 60, 900)
    decisions = run(policy, 8, [0] * 100)
    steps = [(i, d.replicas) for i, d in enumerate(decisions) if d.reason == "LowLoad"]
    assert [r for _, r in steps] == [7, 6, 5, 4, 3, 2, 1]
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(steps)]
    assert all(gap * TICK >= 60 for gap in gaps), gaps


def test_scale_up_goes_to_what_the_load_needs_at_once() -> None:
    policy = ScalingPolicy(1, 10, 4, None, 0, 300, 900)
    assert run(policy, 1, [30])[0].replicas == 8
    assert run(policy, 1, [300])[0].replicas == 10  # capped at maxReplicas


def test_kv_cache_use_adds_replicas_where_the_engine_reports_it() -> None:
    policy = ScalingPolicy(1, 10, 100, 0.5, 0, 300, 900)
    state = ScalingState()
    full = [PodSignals(running=1, waiting=0, requests_total=1, kv_cache_usage=0.9)] * 2
    decision = decide(policy, 2, full, active=True, demand=False, now=1e6, state=state)
    assert decision.replicas == 4  # 1.8 of KV cache at 0.5 per replica
    exact = [PodSignals(running=1, waiting=0, requests_total=1, kv_cache_usage=0.5)] * 2
    assert decide(policy, 2, exact, active=True, demand=False, now=1e6, state=state).replicas == 2


def test_activity_is_requests_in_flight_waiting_or_counted() -> None:
    idle = PodSignals(running=0, waiting=0, requests_total=7)
    assert not saw_activity({"p": 7}, {"p": idle})
    assert saw_activity({"p": 6}, {"p": idle})  # served one since
    assert saw_activity({}, {"p": idle})  # a pod first seen has served
    assert not saw_activity({}, {"p": replace(idle, requests_total=0)})
    assert saw_activity({"p": 7}, {"p": replace(idle, waiting=1)})
    assert saw_activity({"p": 7}, {"p": replace(idle, running=1)})


def test_the_deployment_follows_the_decision_within_the_current_bounds() -> None:
    scaling = Autoscaling(min_replicas=0, max_replicas=4)
    assert autoscaled_replicas(scaling, None) == 1  # a new model starts with one, seen to load
    assert autoscaled_replicas(scaling, 0) == 0
    assert autoscaled_replicas(scaling, 9) == 4  # maxReplicas lowered since
    raised = Autoscaling(min_replicas=2, max_replicas=4)
    assert autoscaled_replicas(raised, 0) == 2
    assert autoscaled_replicas(raised, None) == 2


@PROPERTY_SETTINGS
@given(
    policies(), st.integers(1, 12), st.integers(0, 200), st.integers(1, 5), st.lists(st.integers(0, 200), max_size=40)
)
def test_pods_that_cannot_be_read_are_never_taken_for_idle(
    policy: ScalingPolicy, start: int, first: int, unread: int, loads: list[int]
) -> None:
    """A pod whose metrics cannot be read (a NetworkPolicy, a slow pod) may be busy: the model is never
    scaled down, nor to zero, while any is unread; it may still scale up on what the others report."""
    current, state, now = policy.bounded(start), ScalingState(), 1_000_000.0  # (the bounds may lower it)
    for load in [first, *loads]:
        decision = decide(
            policy, current, pods(current, load), active=False, demand=False, now=now, state=state, unread=unread
        )
        assert decision.replicas >= current
        current, state, now = decision.replicas, decision.state, now + 10_000.0
