"""How many replicas an autoscaled AIModel runs, decided from the engine's own signals.

Scale up promptly (to what the load needs, at once, after scaleUpStabilization since the last scaling),
scale down slowly (one replica at a time, once the load has needed fewer for scaleDownStabilization and
nothing was scaled meanwhile), to zero only after scaleToZeroAfter without any request (with minReplicas
0), and from zero at once when the gateway holds a request (a fresh demand Lease). Under a constant load
the count moves in one direction only and then stays: no flapping.

A fixed-GPU-budget rollout (servlane_core.rollout.budget) pins a model's replicas while it runs: the pin
is the count, so the canary's share, the weights and the budget agree; the autoscaler resumes from
there once the rollout releases the model.

Times are seconds since the epoch (the operator keeps them in status.autoscaler as RFC 3339), so a
restarted operator continues the same windows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from servlane_api.autoscaling import Autoscaling, duration_seconds

# Signals are averages and fractions: a count that is a whole number up to float noise is that number.
_EPSILON = 1e-9


@dataclass(frozen=True)
class ScalingPolicy:
    min_replicas: int
    max_replicas: int
    target_in_flight_per_replica: float
    target_kv_cache_usage: float | None
    scale_up_stabilization_seconds: float
    scale_down_stabilization_seconds: float
    scale_to_zero_after_seconds: float

    @classmethod
    def of(cls, autoscaling: Autoscaling) -> ScalingPolicy:
        return cls(
            min_replicas=autoscaling.min_replicas,
            max_replicas=autoscaling.max_replicas,
            target_in_flight_per_replica=autoscaling.target_in_flight_per_replica,
            target_kv_cache_usage=autoscaling.target_kv_cache_usage,
            scale_up_stabilization_seconds=duration_seconds(autoscaling.scale_up_stabilization),
            scale_down_stabilization_seconds=duration_seconds(autoscaling.scale_down_stabilization),
            scale_to_zero_after_seconds=duration_seconds(autoscaling.scale_to_zero_after),
        )

    @property
    def serving_floor(self) -> int:
        """The fewest replicas while the model serves (a model woken from zero comes back with this many)."""
        return max(1, self.min_replicas)

    def bounded(self, replicas: int) -> int:
        return min(self.max_replicas, max(self.serving_floor, replicas))


@dataclass(frozen=True)
class PodSignals:
    """One ready pod's engine counts, read from its metrics port."""

    running: float
    waiting: float
    # Requests the pod has counted since it started: a change means it served one since the last read.
    requests_total: float
    kv_cache_usage: float | None = None  # a fraction, where the engine reports it (vLLM)


@dataclass(frozen=True)
class ScalingState:
    """What the next decision depends on (None: never happened or never seen)."""

    last_scale_time: float | None = None
    last_activity_time: float | None = None
    # The last time the load needed at least the replicas the model had: scale-down waits a window from it.
    last_busy_time: float | None = None


@dataclass(frozen=True)
class Decision:
    replicas: int
    reason: str
    message: str
    state: ScalingState


def load_replicas(policy: ScalingPolicy, signals: Sequence[PodSignals]) -> int | None:
    """Replicas the measured load needs (unbounded), or None when no ready pod reported."""
    if not signals:
        return None
    in_flight = sum(max(0.0, s.running) + max(0.0, s.waiting) for s in signals)
    needed = math.ceil(in_flight / policy.target_in_flight_per_replica - _EPSILON)
    kv = [min(1.0, max(0.0, s.kv_cache_usage)) for s in signals if s.kv_cache_usage is not None]
    if policy.target_kv_cache_usage is not None and kv:
        needed = max(needed, math.ceil(sum(kv) / policy.target_kv_cache_usage - _EPSILON))
    return max(0, needed)


def saw_activity(previous_totals: Mapping[str, float], signals: Mapping[str, PodSignals]) -> bool:
    """Whether any pod (by name) has a request in flight or waiting, or counted one since `previous_totals`
    (a pod not seen before counts as active if it has counted any: it served since it started)."""
    for pod, s in signals.items():
        if s.running > 0 or s.waiting > 0 or s.requests_total != previous_totals.get(pod, 0.0):
            return True
    return False


def autoscaled_replicas(autoscaling: Autoscaling, decided: int | None) -> int:
    """The Deployment's replicas for the autoscaler's last decision, kept within the current bounds (the
    spec may have changed since). A model not decided yet starts with one replica or minReplicas, so that
    its pods are seen to load; it goes to zero later, once idle."""
    policy = ScalingPolicy.of(autoscaling)
    if decided is None:
        return policy.serving_floor
    if decided == 0 and policy.min_replicas == 0:
        return 0
    return policy.bounded(decided)


def decide(
    policy: ScalingPolicy,
    current: int,
    signals: Sequence[PodSignals],
    *,
    active: bool,
    demand: bool,
    now: float,
    state: ScalingState,
    pinned: int | None = None,
    unread: int = 0,
    starting: int = 0,
) -> Decision:
    """The replicas for now. `current`: what the Deployment runs; `signals`: its ready pods'; `active`: a
    request was seen since the last decision (saw_activity); `demand`: the gateway holds a request for the
    model (a fresh demand Lease); `pinned`: a fixed-GPU-budget rollout's count for the model; `unread`:
    ready pods whose metrics could not be read. What is not read may be busy: with any unread pod the model
    is never scaled down nor to zero (only up, on what the others report), so a NetworkPolicy that keeps
    the operator out, say, holds the count rather than taking a busy model away. `starting`: pods on their
    way to a first Ready: a model is not idle while it starts, so its idle window counts from when it could
    serve (else a start longer than scaleToZeroAfter is taken to zero before it was ever Ready)."""
    busy = active or demand or (starting > 0 and current > 0)
    seen = now if busy or state.last_activity_time is None else state.last_activity_time
    state = replace(state, last_activity_time=seen)
    if pinned is not None:
        return held_by_rollout(pinned, now, state)
    if current <= 0:
        return _at_zero(policy, demand, now, state)
    idle_for = now - seen
    unknown = unread > 0
    if policy.min_replicas == 0 and not demand and not unknown and idle_for >= policy.scale_to_zero_after_seconds:
        message = f"No request for {idle_for:.0f}s: scaled to zero; the next request wakes it."
        return _scaled(0, "Idle", message, now, state)
    if policy.bounded(current) != current:
        bounded = policy.bounded(current)
        return _scaled(bounded, "OutOfBounds", f"{current} replicas is outside the bounds: {bounded}.", now, state)
    needed = load_replicas(policy, signals)
    if needed is None:
        why = (
            f"{unread} ready pods did not answer on their metrics port" if unknown else "No ready pod reported its load"
        )
        return Decision(current, "NoSignals", f"{why}: holding.", state)
    if needed >= current or state.last_busy_time is None:
        state = replace(state, last_busy_time=now)
    target = policy.bounded(needed)
    since_scale = math.inf if state.last_scale_time is None else now - state.last_scale_time
    if target > current:
        if since_scale >= policy.scale_up_stabilization_seconds:
            return _scaled(target, "HighLoad", f"The load needs {needed} replicas: {target}.", now, state)
        return Decision(current, "Stabilizing", f"The load needs {target}; waiting for the window.", state)
    if target < current and unknown:
        message = f"{unread} ready pods did not answer on their metrics port: not scaling down."
        return Decision(current, "PartialSignals", message, state)
    if target < current:
        last_busy = state.last_busy_time if state.last_busy_time is not None else now
        quiet_for = min(now - last_busy, since_scale)
        if quiet_for >= policy.scale_down_stabilization_seconds:
            return _scaled(current - 1, "LowLoad", f"The load needs {target}: one replica fewer.", now, state)
        return Decision(current, "Stabilizing", f"The load needs {target}; waiting for the window.", state)
    return Decision(current, "AtTarget", f"The load needs {needed} replicas.", state)


def held_by_rollout(pinned: int, now: float, state: ScalingState) -> Decision:
    """A fixed-GPU-budget rollout's pin is the count while it holds (the budget applies it, not the
    autoscaler). The busy time moves on, so the release waits a full window before removing any replica."""
    held = replace(state, last_busy_time=now)
    return Decision(pinned, "FixedGpuBudget", f"A fixed-GPU-budget rollout holds {pinned} replicas.", held)


def released_by_rollout(policy: ScalingPolicy, pinned: int, now: float, state: ScalingState) -> Decision:
    """The rollout released the model at `pinned` (its last pin): the autoscaler resumes from that count,
    within the bounds, and waits a full scale-down window from now before it removes any of them. Resuming
    from an older decision instead (the count before the rollout, or an earlier pin) drops replicas the
    rollout just gave the winner, pods that were serving its traffic."""
    replicas = 0 if pinned == 0 and policy.min_replicas == 0 else policy.bounded(pinned)
    message = f"A fixed-GPU-budget rollout released the model at {pinned} replicas: autoscaled from {replicas}."
    return _scaled(replicas, "RolloutReleased", message, now, state)


def _at_zero(policy: ScalingPolicy, demand: bool, now: float, state: ScalingState) -> Decision:
    if demand:
        replicas = policy.serving_floor
        return _scaled(replicas, "Demand", "The gateway holds requests: woken from zero.", now, state)
    if policy.min_replicas > 0:
        return _scaled(policy.serving_floor, "OutOfBounds", "minReplicas is above zero.", now, state)
    return Decision(0, "ScaledToZero", "Scaled to zero; the next request wakes it.", state)


def _scaled(replicas: int, reason: str, message: str, now: float, state: ScalingState) -> Decision:
    # A new count restarts both windows: the next step down waits a full window from here.
    return Decision(replicas, reason, message, replace(state, last_scale_time=now, last_busy_time=now))
