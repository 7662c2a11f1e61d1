"""Holding with EndpointSlices: the pods of a held model are probed, a slice update releases at once, and
what a probe found lasts only until the slices catch up. The demand Lease writer, against a recording API.
Which models wake (pure) and what makes the route table rebuild for it."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from kubernetes.client.exceptions import ApiException

from servlane_api import AIModel
from servlane_core.routing.routes import Backend, can_wake
from servlane_core.routing.waking import HoldLimits, hold_refusal, waking_pick
from servlane_gateway.gateway_metrics import GatewayMetrics
from servlane_gateway.routing.demand_lease import KubeDemandLease
from servlane_gateway.routing.hold import HoldQueue
from servlane_gateway.routing.kube_watch import routing_view
from servlane_gateway.routing.pods import PodRouter
from servlane_gateway.routing.slices import services_of
from tests.gateway.waking_upstream import WakingUpstream, start_waking_upstream
from tests.support.endpoint_slices import SERVICE_URL, endpoint_slice
from tests.support.gateway_harness import StartGateway, aimodel
from tests.support.hold import HELD, waking_model
from tests.support.polling import wait_until

BACKEND = Backend("m", "default", SERVICE_URL.removesuffix("/v1"), "m", False, 100, wakes=True)


@pytest.fixture
def pod() -> Iterator[WakingUpstream]:
    upstream = start_waking_upstream("pod-a")
    yield upstream
    upstream.close()


def test_a_held_request_goes_to_the_pod_whose_ready_answered_before_its_slice_says_so(
    start_gateway: StartGateway, pod: WakingUpstream
) -> None:
    gw = start_gateway([waking_model("m", SERVICE_URL.removesuffix("/v1"))])
    gw.state.pods.update(services_of([endpoint_slice("pod-a", pod.url, ready=False)]))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(httpx.post, f"{gw.url}/v1/chat/completions", json=body, timeout=20)
        wait_until("the request held", lambda: gw.sample(HELD, model="m") == 1, 10)
        wait_until("the not-ready pod asked /ready", lambda: pod.probes >= 2, 10)
        pod.become_ready()  # the slice still says not ready: only the probe knows
        response = answer.result(10)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "pod-a"
    router = gw.state.pods
    assert router.is_live(BACKEND)
    router.update(services_of([endpoint_slice("pod-a", pod.url, ready=True)]))
    assert not router._probed_pods  # the slice caught up: its word stands from now on
    router.update(services_of([endpoint_slice("pod-a", pod.url, ready=False)]))
    assert not router.is_live(BACKEND)  # a pod the kubelet finds unready again is not kept alive by the probe


def test_only_pods_on_their_way_up_are_probed() -> None:
    router = PodRouter()
    assert router.probe_targets(BACKEND) == [(BACKEND.base_url, BACKEND.base_url)]  # no slices: its URL
    router.update(
        services_of(
            [
                endpoint_slice("starting", "http://10.0.0.1:8000", ready=False),
                endpoint_slice("leaving", "http://10.0.0.2:8000", ready=False, terminating=True),
                endpoint_slice("serving", "http://10.0.0.3:8000", ready=True),
            ]
        )
    )
    assert router.probe_targets(BACKEND) == [("10.0.0.1:8000", "http://10.0.0.1:8000")]
    router.mark_probed(BACKEND, "10.0.0.1:8000")
    picked = {router.choose(BACKEND, "round-robin", None).base_url for _ in range(4)}  # type: ignore[union-attr]
    assert picked == {"http://10.0.0.1:8000", "http://10.0.0.3:8000"}  # never the terminating one


async def test_a_slice_update_releases_held_requests_at_once_without_waiting_for_a_probe() -> None:
    router = PodRouter()
    router.update(services_of([endpoint_slice("pod-a", "http://10.0.0.1:8000", ready=False)]))
    limits = HoldLimits(probe_interval=3600)  # no polling tick in this test: only the push can release
    queue = HoldQueue(router, GatewayMetrics(), limits)
    queue._ready = _never_ready  # type: ignore[method-assign]  # the pod's /ready never answers here
    ticket = queue.enter(BACKEND)
    waiting = asyncio.ensure_future(ticket.wait())
    await asyncio.sleep(0)
    assert not waiting.done()
    router.update(services_of([endpoint_slice("pod-a", "http://10.0.0.1:8000", ready=True)]))
    queue.poke()  # what the slice watch does with each update
    released = await asyncio.wait_for(waiting, 2)
    assert released == BACKEND
    assert queue.held("default", "m") == 0
    await queue.aclose()


async def _never_ready(base_url: str) -> bool:
    return False


def test_which_models_wake() -> None:
    def model(phase: str | None, **spec: Any) -> AIModel:
        obj = aimodel("m", "http://m/v1", ready=False)
        obj["status"]["phase"] = phase
        obj["spec"] |= spec
        return AIModel.model_validate(obj)

    assert can_wake(model("Pending", autoscaling={"minReplicas": 0, "maxReplicas": 2}))  # at zero
    assert can_wake(model("Deploying"))  # starting
    assert not can_wake(model("Degraded"))  # unschedulable, crash-looping: a 503 now, not in 5 minutes
    assert not can_wake(model("Failed"))
    assert not can_wake(model("Pending", replicas=0))  # fixed at zero: nothing scales it back
    no_endpoint = model("Pending")
    no_endpoint.status.endpoint = None
    assert not can_wake(no_endpoint)


def test_a_held_request_waits_for_the_model_its_weights_give_it() -> None:
    cold_a = Backend("a", "ns", "http://a", "a", False, 90, wakes=True)
    cold_b = Backend("b", "ns", "http://b", "b", False, 10, wakes=True)
    failed = Backend("c", "ns", "http://c", "c", False, 0, wakes=False)
    from servlane_core.routing.routes import Route

    route = Route("chat", "ns", (cold_a, cold_b, failed))
    picks = {waking_pick(route, f"id-{i}").model for i in range(200)}  # type: ignore[union-attr]
    assert picks == {"a", "b"}
    assert waking_pick(Route("x", "ns", (failed,))) is None


def test_the_queue_bounds() -> None:
    limits = HoldLimits(per_model=2, per_namespace=3)
    assert hold_refusal(1, 2, limits) is None
    assert hold_refusal(2, 2, limits) == "model_queue_full"
    assert hold_refusal(0, 3, limits) == "namespace_queue_full"


def test_only_a_not_ready_models_phase_makes_the_route_table_rebuild() -> None:
    ready = aimodel("m", "http://a/v1")
    cold = aimodel("m", "http://a/v1", ready=False)
    for obj, phases_matter in ((ready, False), (cold, True)):
        pending = json.loads(json.dumps(obj))
        pending["status"]["phase"] = "Pending"
        degraded = json.loads(json.dumps(obj))
        degraded["status"]["phase"] = "Degraded"
        assert (routing_view(pending) != routing_view(degraded)) is phases_matter


# -- the demand Lease writer -------------------------------------------------------------------------------


class Response:
    def __init__(self, obj: dict[str, Any]) -> None:
        self.data = json.dumps(obj).encode()


class RecordingLeases:
    """The CoordinationV1Api calls the writer makes, against a dict of Leases."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[str] = []
        self.gate = gate

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> Response:
        if self.gate is not None:
            self.gate.wait(10)
        self.calls.append("read")
        if (namespace, name) not in self.leases:
            raise ApiException(status=404, reason="Not Found")
        return Response(self.leases[(namespace, name)])

    def create_namespaced_lease(self, namespace: str, body: dict[str, Any]) -> None:
        self.calls.append("create")
        self.leases[(namespace, body["metadata"]["name"])] = body

    def patch_namespaced_lease(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        self.calls.append("patch")
        self.leases[(namespace, name)]["spec"] |= body["spec"]


def test_the_demand_lease_is_created_then_renewed_and_a_foreign_one_is_left_alone() -> None:
    api = RecordingLeases()
    times = iter([datetime(2026, 12, 5, 4, 0, 0, 123456, UTC), datetime(2026, 12, 5, 4, 0, 5, tzinfo=UTC)])
    later = datetime(2026, 12, 5, 4, 0, 10, tzinfo=UTC)
    writer = KubeDemandLease(api, holder="gw-0", clock=lambda: next(times, later))
    writer.signal("team-a", "chat")
    wait_until("the Lease created", lambda: writer.writes == 1, 5)
    lease = api.leases[("team-a", "servlane-demand-chat")]
    assert lease["metadata"]["labels"] == {
        "servlane.dev/model": "chat",
        "app.kubernetes.io/managed-by": "servlane-gateway",
    }
    assert lease["spec"] == {"holderIdentity": "gw-0", "renewTime": "2026-12-05T04:00:00.123456Z"}
    writer.signal("team-a", "chat")
    wait_until("the Lease renewed", lambda: writer.writes == 2, 5)
    assert api.calls == ["read", "create", "read", "patch"]
    assert lease["spec"]["renewTime"] == "2026-12-05T04:00:05.000000Z"
    foreign = {"metadata": {"name": "servlane-demand-x", "labels": {}}, "spec": {"holderIdentity": "someone"}}
    api.leases[("team-a", "servlane-demand-x")] = foreign
    writer.signal("team-a", "x")
    wait_until("the foreign Lease read", lambda: api.calls.count("read") == 3, 5)
    writer.close()
    assert api.calls.count("patch") == 1
    assert foreign["spec"] == {"holderIdentity": "someone"}


def test_demand_signals_while_a_write_is_under_way_are_dropped() -> None:
    gate = threading.Event()
    api = RecordingLeases(gate)
    writer = KubeDemandLease(api, holder="gw-0")
    for _ in range(50):
        writer.signal("ns", "m")
    gate.set()
    wait_until("the one write", lambda: writer.writes == 1, 5)
    writer.signal("ns", "m")  # after it: a renewal writes again
    wait_until("the renewal", lambda: writer.writes == 2, 5)
    writer.close()
    assert api.calls == ["read", "create", "read", "patch"]
