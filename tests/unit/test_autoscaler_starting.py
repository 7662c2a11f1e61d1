"""A model is not idle while its pods start: with minReplicas 0, the idle window (scaleToZeroAfter) counts from
when the model could first serve, so a start longer than the window is not taken to zero before it was ever
Ready (seen on the real node: a tiny chat model loads in 30-40 s; with a 20 s window it went to zero at +25 s,
its pod never Ready, in e2e/test_real_scale_to_zero.py's first run)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from servlane_core.scaling import PodSignals, ScalingPolicy, ScalingState, decide
from servlane_operator.autoscaler import autoscale
from servlane_operator.observed import PodView
from servlane_operator.settings import OperatorSettings
from tests.support.autoscaling import IDLE_METRICS, live_deployment, model_body, pod, quiet_events, scraper
from tests.unit.fake_kube import FakeKube

__all__ = ["quiet_events"]  # the fixture, used by name

WINDOW = 20.0
POLICY = ScalingPolicy(
    min_replicas=0,
    max_replicas=2,
    target_in_flight_per_replica=8,
    target_kv_cache_usage=None,
    scale_up_stabilization_seconds=0,
    scale_down_stabilization_seconds=300,
    scale_to_zero_after_seconds=WINDOW,
)
IDLE = PodSignals(running=0, waiting=0, requests_total=0)


def test_a_model_whose_pod_is_still_starting_is_not_idle() -> None:
    start = 1_000_000.0
    state = ScalingState()
    # Its first decision, then a start that takes longer than the window: no ready pod to read, one starting.
    for at in (start, start + WINDOW + 5, start + 2 * WINDOW):
        decision = decide(POLICY, 1, [], active=False, demand=False, now=at, state=state, starting=1)
        assert decision.replicas == 1, (at - start, decision)
        state = decision.state
    ready_at = start + 2 * WINDOW + 1
    # Ready and idle: the window counts from the last look at it starting, not from its first decision.
    decision = decide(POLICY, 1, [IDLE], active=False, demand=False, now=ready_at, state=state)
    assert decision.replicas == 1, decision
    decision = decide(POLICY, 1, [IDLE], active=False, demand=False, now=ready_at + WINDOW, state=decision.state)
    assert (decision.replicas, decision.reason) == (0, "Idle")


def test_pods_that_are_not_on_their_way_do_not_keep_a_model_up() -> None:
    """Nothing starting (a pod no node takes, one that crash-loops): the idle window runs as before."""
    decision = decide(POLICY, 1, [], active=False, demand=False, now=1.0, state=ScalingState())
    decision = decide(POLICY, 1, [], active=False, demand=False, now=1.0 + WINDOW, state=decision.state)
    assert (decision.replicas, decision.reason) == (0, "Idle")


def pod_body(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": {"nodeName": "node-1"}, "status": status}


def running(restarts: int = 0) -> dict[str, Any]:
    return {"name": "runtime", "restartCount": restarts, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}


def test_which_pods_are_starting() -> None:
    not_ready = {"type": "Ready", "status": "False"}
    creating = {"name": "runtime", "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}
    assert PodView.parse(pod_body(conditions=[not_ready], containerStatuses=[running()])).starting
    assert PodView.parse(pod_body(conditions=[not_ready], containerStatuses=[creating])).starting
    assert PodView.parse(pod_body()).starting  # scheduled, nothing reported yet
    ready = {"type": "Ready", "status": "True"}
    assert not PodView.parse(pod_body(conditions=[ready], containerStatuses=[running()])).starting
    assert not PodView.parse({**pod_body(), "spec": {}}).starting  # no node yet (perhaps never)
    assert not PodView.parse(pod_body(conditions=[not_ready], containerStatuses=[running(restarts=1)])).starting
    backing_off = {"name": "runtime", "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff"}}}
    assert not PodView.parse(pod_body(containerStatuses=[backing_off])).starting
    leaving = {**pod_body(containerStatuses=[running()]), "metadata": {"name": "p", "deletionTimestamp": "x"}}
    assert not PodView.parse(leaving).starting


@pytest.mark.usefixtures("quiet_events")
def test_an_autoscaler_pass_keeps_a_starting_model_at_min_zero_up() -> None:
    """The pass counts the model's starting pods (its pod index): past the window, not taken to zero."""
    kube = FakeKube()
    spec = {"autoscaling": {"minReplicas": 0, "maxReplicas": 2, "scaleToZeroAfter": "20s"}}
    first = {"desiredReplicas": 1, "reason": "NoSignals", "lastActivityTime": "1970-01-12T13:46:40Z"}  # 1e6 s
    autoscaler = scraper(lambda request: httpx.Response(200, text=IDLE_METRICS))
    autoscaler.clock = lambda: 1_000_000.0 + 60
    settings = OperatorSettings(gateway_namespace="gw")
    loading = PodView.parse(pod_body(containerStatuses=[running()]))
    body = model_body(spec, {"autoscaler": first})
    decision = asyncio.run(
        autoscale(body, kube, settings, autoscaler, live_deployment(1), [], [loading], demand=False, pinned=None)
    )
    assert decision is not None
    assert decision.replicas == 1, decision
    # Once Ready and read idle, the window starts then.
    autoscaler.clock = lambda: 1_000_000.0 + 70
    decision = asyncio.run(
        autoscale(body, kube, settings, autoscaler, live_deployment(1), [pod()], [], demand=False, pinned=None)
    )
    assert decision is not None
    assert decision.replicas == 1, decision
