"""Endpoint-aware routing through a real gateway, with the EndpointSlices handed to it directly (the watch
itself is tested against the real API server in e2e/test_gateway_endpoints.py): the pods are stub
servers on loopback, the AIModel's endpoint is its cluster-DNS Service URL (never called here)."""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from servlane_core.routing.routes import Backend
from servlane_gateway.gateway_metrics import ENDPOINT_EJECTIONS, ENDPOINT_IN_FLIGHT, ENDPOINT_PICKS
from servlane_gateway.http.upstream import UpstreamConnectTimeout, UpstreamPool
from servlane_gateway.routing.pods import PodRouter
from servlane_gateway.routing.slices import EndpointSliceSource, Services, is_model_slice, services_of, slice_endpoints
from tests.support.endpoint_slices import SERVICE_URL, endpoint_slice
from tests.support.gateway_harness import Gateway, ServedApp, StartGateway, Upstream, aifeature, aimodel, refused_url
from tests.support.gateway_upstream import create_upstream
from tests.support.polling import wait_until


@pytest.fixture(scope="module")
def pods() -> Iterator[dict[str, Upstream]]:
    served: dict[str, Upstream] = {}
    runners = []
    for name in ("pod-a", "pod-b", "pod-c"):
        app, state = create_upstream(name)
        runner = ServedApp(app).__enter__()
        runners.append(runner)
        served[name] = Upstream(runner.url, state)
    yield served
    for runner in runners:
        runner.__exit__()


def feature(routing: str) -> dict[str, Any]:
    spec = {"model": "m", "routing": routing}
    meta = {"name": "chat", "namespace": "default"}
    status = {"weights": [{"model": "m", "weight": 100}]}
    return {
        "apiVersion": "servlane.dev/v1alpha1",
        "kind": "AIFeature",
        "metadata": meta,
        "spec": spec,
        "status": status,
    }


def start(start_gateway: StartGateway, routing: str, slices: list[dict[str, Any]]) -> Gateway:
    gateway = start_gateway([aimodel("m", SERVICE_URL), feature(routing)])
    set_slices(gateway, services_of(slices))
    return gateway


def set_slices(gateway: Gateway, services: Services) -> None:
    gateway.state.pods.update(services)


def received(pods: dict[str, Upstream]) -> dict[str, int]:
    return {name: len(pod.state.bodies) for name, pod in pods.items()}


def ask(gateway: Gateway, text: str = "hi") -> str:
    reply = gateway.client().chat.completions.create(model="chat", messages=[{"role": "user", "content": text}])
    return str(reply.choices[0].message.content)


def test_slices_parse_to_eligible_endpoints() -> None:
    slice_ = endpoint_slice("p", "http://10.0.0.1:8000")
    slice_["endpoints"].append({"addresses": ["10.0.0.2"], "conditions": {}})  # unset: ready, not terminating
    slice_["endpoints"].append({"addresses": ["10.0.0.3"], "conditions": {"ready": False, "terminating": True}})
    found = {e.address: e for e in slice_endpoints(slice_)}
    assert found["10.0.0.1:8000"].pod == "p"
    assert found["10.0.0.1:8000"].eligible
    assert found["10.0.0.2:8000"].eligible
    assert found["10.0.0.2:8000"].pod == "10.0.0.2:8000"
    assert not found["10.0.0.3:8000"].eligible
    # A second slice listing the same address (mid-update): counted once, eligible if either says so.
    again = endpoint_slice("p", "http://10.0.0.3:8000")
    again["metadata"]["name"] = "other"
    services = services_of([slice_, again])
    assert [e.address for e in services[("default", "model-m")]] == ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
    assert all(e.eligible for e in services[("default", "model-m")])
    assert slice_endpoints({**slice_, "ports": []}) == []


def _relabel(**labels: str | None) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        for key, value in labels.items():
            name = {"managed_by": "endpointslice.kubernetes.io/managed-by", "service": "kubernetes.io/service-name",
                    "model": "servlane.dev/model"}[key]  # fmt: skip
            if value is None:
                obj["metadata"]["labels"].pop(name)
            else:
                obj["metadata"]["labels"][name] = value

    return change


def _owner(**fields: object) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        owner = obj["metadata"]["ownerReferences"][0]
        for key, value in fields.items():
            if value is None:
                owner.pop(key)
            else:
                owner[key] = value

    return change


def _another_owner_first(obj: dict[str, Any]) -> None:
    other = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x", "uid": "u2"}
    obj["metadata"]["ownerReferences"].insert(0, other)


@pytest.mark.parametrize(
    ("change", "accepted"),
    [
        (lambda obj: None, True),  # as the EndpointSlice controller writes it
        (_another_owner_first, True),
        (_relabel(managed_by=None), False),  # made by hand
        (_relabel(managed_by="team-b.example/made-by-hand"), False),
        (_relabel(managed_by="endpointslicemirroring-controller.k8s.io"), False),  # a selectorless Service's
        (_relabel(service="model-other"), False),  # another Service than the AIModel's
        (_relabel(service="db", model="db"), False),  # a Service the operator never names after an AIModel
        (_relabel(model=None), False),
        (lambda obj: obj["metadata"].pop("ownerReferences"), False),
        (_owner(kind="Deployment"), False),
        (_owner(name="model-other"), False),
        (_owner(apiVersion="v2"), False),
        (_owner(controller=False), False),
        (_owner(controller=None), False),
    ],
)
def test_only_the_slices_the_control_plane_keeps_for_the_models_service_count(
    change: Callable[[dict[str, Any]], None], accepted: bool
) -> None:
    obj = copy.deepcopy(endpoint_slice("pod-a", "http://10.0.0.1:8000"))
    change(obj)
    assert is_model_slice(obj) is accepted


def test_a_hand_made_slice_never_reaches_the_router() -> None:
    source = EndpointSliceSource()
    hand_made = endpoint_slice("intruder", "http://10.9.9.9:8000")  # e.g. another team's pod, or any address
    del hand_made["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"]
    source.store.replace(source.streams[0], [endpoint_slice("pod-a", "http://10.0.0.1:8000"), hand_made])
    assert [e.address for e in source.services()[("default", "model-m")]] == ["10.0.0.1:8000"]


def test_round_robin_spreads_evenly_over_the_pods(start_gateway: StartGateway, pods: dict[str, Upstream]) -> None:
    gateway = start(start_gateway, "round-robin", [endpoint_slice(n, p.url) for n, p in pods.items()])
    before = received(pods)
    answers = [ask(gateway) for _ in range(30)]
    after = received(pods)
    assert {name: after[name] - before[name] for name in pods} == {"pod-a": 10, "pod-b": 10, "pod-c": 10}
    assert sorted(set(answers)) == ["pod-a", "pod-b", "pod-c"]
    assert gateway.sample(ENDPOINT_PICKS, model="m", pod="pod-b") == 10
    assert gateway.sample(ENDPOINT_IN_FLIGHT, model="m", pod="pod-b") == 0


def test_least_load_uses_every_pod(start_gateway: StartGateway, pods: dict[str, Upstream]) -> None:
    gateway = start(start_gateway, "least-load", [endpoint_slice(n, p.url) for n, p in pods.items()])
    assert {ask(gateway) for _ in range(40)} == set(pods)


def test_prefix_affinity_keeps_each_conversation_on_one_pod(
    start_gateway: StartGateway, pods: dict[str, Upstream]
) -> None:
    gateway = start(start_gateway, "prefix-affinity", [endpoint_slice(n, p.url) for n, p in pods.items()])
    client = gateway.client()
    homes: dict[str, str] = {}
    for conversation in range(12):
        messages: list[Any] = [{"role": "user", "content": f"conversation {conversation} begins"}]
        for turn in range(3):
            reply = client.chat.completions.create(model="chat", messages=messages)
            answer = str(reply.choices[0].message.content)
            assert homes.setdefault(str(conversation), answer) == answer, f"turn {turn} moved"
            messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": f"turn {turn}"}]
    assert len(set(homes.values())) >= 2  # different conversations do not all share one pod


def test_a_refusing_pod_is_retried_elsewhere_then_ejected(
    start_gateway: StartGateway, pods: dict[str, Upstream]
) -> None:
    dead = refused_url()
    slices = [endpoint_slice("pod-dead", dead), endpoint_slice("pod-a", pods["pod-a"].url)]
    gateway = start(start_gateway, "round-robin", slices)
    assert {ask(gateway) for _ in range(12)} == {"pod-a"}  # no client-visible error
    assert gateway.sample(ENDPOINT_EJECTIONS, model="m", pod="pod-dead") == 1
    # Three refusals ejected it: it is not tried again while ejected (its picks stay at three).
    assert gateway.sample(ENDPOINT_PICKS, model="m", pod="pod-dead") == 3
    assert gateway.sample("servlane_gateway_requests_total", feature="chat", model="m", code="200") == 12


def test_draining_pods_finish_their_streams_and_get_no_new_requests(
    start_gateway: StartGateway, pods: dict[str, Upstream]
) -> None:
    a, b = pods["pod-a"], pods["pod-b"]
    gateway = start(start_gateway, "least-load", [endpoint_slice("pod-a", a.url)])
    a.state.released.clear()
    streamed: list[str] = []

    def hold_a_stream() -> None:
        stream = gateway.client().chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hold chunks=3"}], stream=True
        )
        streamed.extend(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)

    before = received(pods)
    holder = threading.Thread(target=hold_a_stream)
    holder.start()
    wait_until("the stream reached pod-a", lambda: received(pods)["pod-a"] > before["pod-a"], timeout=10)
    assert gateway.sample(ENDPOINT_IN_FLIGHT, model="m", pod="pod-a") == 1
    # pod-a is terminating (scale-down), pod-b takes over.
    set_slices(
        gateway,
        services_of([endpoint_slice("pod-a", a.url, ready=False, terminating=True), endpoint_slice("pod-b", b.url)]),
    )
    assert {ask(gateway) for _ in range(10)} == {"pod-b"}
    a.state.released.set()
    holder.join(10)
    assert "".join(streamed).split() == ["pod-a"] * 3  # the stream in flight finished on the draining pod
    wait_until("pod-a's stream released", lambda: gateway.sample(ENDPOINT_IN_FLIGHT, model="m", pod="pod-a") == 0)
    # A not-ready pod (not terminating) gets nothing either.
    set_slices(gateway, services_of([endpoint_slice("pod-a", a.url, ready=False), endpoint_slice("pod-b", b.url)]))
    assert {ask(gateway) for _ in range(5)} == {"pod-b"}


def test_an_overridden_backend_is_called_at_its_url(start_gateway: StartGateway, pods: dict[str, Upstream]) -> None:
    # --endpoint-override (a gateway outside the cluster): pod addresses would not be reachable from it.
    gateway = start_gateway(
        [aimodel("m", SERVICE_URL), feature("least-load")],
        endpoint_overrides={"http://model-m.default.svc.cluster.local:8000": pods["pod-c"].url},
    )
    set_slices(gateway, services_of([endpoint_slice("pod-a", pods["pod-a"].url)]))
    assert ask(gateway) == "pod-c"


def test_without_a_ready_pod_the_router_falls_back_to_the_service_url() -> None:
    router = PodRouter()
    backend = Backend("m", "default", SERVICE_URL.removesuffix("/v1"), "m", True, 100)
    lease = router.choose(backend, "least-load", None)  # no slices known
    assert lease is not None
    assert lease.endpoint is None
    assert lease.base_url == backend.base_url
    router.update(services_of([endpoint_slice("pod-a", "http://10.0.0.1:8000", ready=False)]))
    lease = router.choose(backend, "least-load", None)
    assert lease is not None
    assert lease.endpoint is None
    assert router.choose(backend, "least-load", None, exclude=[backend.base_url]) is None  # tried already
    router.update(services_of([endpoint_slice("pod-a", "http://10.0.0.1:8000")]))
    lease = router.choose(backend, "least-load", None)
    assert lease is not None
    assert lease.base_url == "http://10.0.0.1:8000"
    assert router.in_flight == {"10.0.0.1:8000": 1}
    lease.release()
    lease.release()  # once only
    assert not router.in_flight
    assert router.choose(backend, "least-load", None, exclude=["10.0.0.1:8000"]) is None


async def test_pooled_connections_are_not_reused_past_their_idle_age_or_lifetime(pods: dict[str, Upstream]) -> None:
    pool = UpstreamPool(connect_timeout=5, max_idle=30, max_lifetime=60)
    url = pods["pod-a"].url + "/v1/completions"
    body = b'{"model": "m", "prompt": "hi"}'

    async def call() -> None:
        response = await pool.post(url, body, {"content-type": "application/json"})
        await asyncio.wait_for(response.next_chunk(), 5)
        while await asyncio.wait_for(response.next_chunk(), 5) is not None:
            pass
        await response.aclose()

    try:
        await call()
        (key, idle), *_ = pool._idle.items()
        first = idle[-1]
        await call()
        assert pool._idle[key] == [first]  # reused while young
        first.idle_since -= 31  # idle past max_idle
        await call()
        assert first.closed
        assert pool._idle[key]
        assert pool._idle[key][-1] is not first
        second = pool._idle[key][-1]
        second.opened_at -= 61  # open past max_lifetime
        await call()
        assert second.closed
        assert pool._idle[key][-1] is not second
    finally:
        await pool.aclose()


def test_refused_everywhere_is_a_503(start_gateway: StartGateway) -> None:
    slices = [endpoint_slice(f"pod-{i}", refused_url()) for i in range(4)]
    gateway = start(start_gateway, "least-load", slices)
    with pytest.raises(openai.APIStatusError) as info:
        ask(gateway)
    assert info.value.status_code == 503


def test_a_pod_that_does_not_accept_connections_is_retried_elsewhere(
    start_gateway: StartGateway, pods: dict[str, Upstream], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pod whose node is gone: the connection neither opens nor is refused, until the connect timeout.
    silent = "http://10.0.0.9:8000"
    slices = [endpoint_slice("pod-silent", silent), endpoint_slice("pod-a", pods["pod-a"].url)]
    gateway = start(start_gateway, "round-robin", slices)
    pool = gateway.state.pool
    assert pool is not None
    connect = pool._connect

    async def blackholed(host: str, port: int) -> Any:
        if (host, port) == ("10.0.0.9", 8000):
            raise UpstreamConnectTimeout("the backend did not accept the connection in time")
        return await connect(host, port)

    monkeypatch.setattr(pool, "_connect", blackholed)
    assert {ask(gateway) for _ in range(8)} == {"pod-a"}
    assert gateway.sample(ENDPOINT_EJECTIONS, model="m", pod="pod-silent") == 1


def test_a_version_whose_pods_all_refuse_falls_back_to_another_version(
    start_gateway: StartGateway, pods: dict[str, Upstream]
) -> None:
    objects = [
        aimodel("m", SERVICE_URL),
        aimodel("n", pods["pod-c"].url + "/v1"),
        aifeature("chat", [("m", 100), ("n", 0)]),
    ]
    gateway = start_gateway(objects)
    set_slices(gateway, services_of([endpoint_slice(f"pod-{i}", refused_url()) for i in range(3)]))
    assert ask(gateway) == "pod-c"  # two of m's pods refused, then the other version answered
    assert sum(gateway.sample(ENDPOINT_PICKS, model="m", pod=f"pod-{i}") for i in range(3)) == 2
    assert gateway.sample("servlane_gateway_requests_total", feature="chat", model="m", code="502") == 1


# -- a slice event costs its own Service, never the whole cluster's ---------------------------------------


def model_slice(model: str, namespace: str, ip: str, ready: bool = True) -> dict[str, Any]:
    """The slice the EndpointSlice controller keeps for `model-<model>` in `namespace`, one pod at `ip`."""
    obj = copy.deepcopy(endpoint_slice(f"{model}-0", f"http://{ip}:8000", ready=ready))
    service = f"model-{model}"
    obj["metadata"] |= {"name": f"{service}-abcde", "namespace": namespace}
    obj["metadata"]["labels"] |= {"kubernetes.io/service-name": service, "servlane.dev/model": model}
    obj["metadata"]["ownerReferences"][0]["name"] = service
    return obj


async def test_a_burst_of_slice_events_at_a_thousand_services_merges_only_their_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import servlane_gateway.routing.slices as slices_module

    merged: list[int] = []  # how many slices each merge reads
    merge = slices_module.services_of

    def counted(slices: list[dict[str, Any]]) -> Services:
        merged.append(len(slices))
        return merge(slices)

    monkeypatch.setattr(slices_module, "services_of", counted)
    slices = [model_slice(f"m{i}", f"team-{i % 50}", f"10.1.{i // 250}.{i % 250}") for i in range(1000)]
    source = EndpointSliceSource()
    published: list[Services] = []
    source.start_publishing(published.append)
    stream = source.streams[0]
    await asyncio.to_thread(source.listed, stream, slices)
    await wait_until_async(lambda: published)
    assert len(published[-1]) == 1000
    merged.clear()

    def burst() -> None:  # as the watch thread would: 200 events on team-7's slice, then one that counts
        target = slices[7]
        for i in range(200):
            noop = copy.deepcopy(target)
            noop["metadata"] |= {"resourceVersion": str(i), "annotations": {"n": str(i)}}
            source.changed(stream, "MODIFIED", noop)
        source.changed(stream, "MODIFIED", model_slice("m7", "team-7", "10.1.0.7", ready=False))

    before = len(published)
    await asyncio.to_thread(burst)
    await wait_until_async(lambda: not published[-1][("team-7", "model-m7")][0].ready)
    # Each event merged its own Service's one slice; the 200 that changed nothing were not handed over.
    assert merged == [1] * 201
    assert len(published) == before + 1
    assert len(published[-1]) == 1000


async def wait_until_async(check: Callable[[], object], within: float = 30.0) -> None:
    """Polls `check` on the event loop, which runs the source's hand-overs meanwhile."""
    deadline = asyncio.get_running_loop().time() + within
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)  # the polling interval of a deadline-bounded wait
