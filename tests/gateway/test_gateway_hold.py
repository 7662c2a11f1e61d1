"""Requests for a model with no ready pod are held, not refused, and go out the moment a pod is ready.

Through a real gateway (routes file) in front of real upstreams whose `/ready` the test flips: without slices
the gateway probes the model's URL itself. Bounds per model and per namespace (429), the maximum wait (503),
streams (their head at once, keep-alives, then the stream), disconnects, demand, canary weights, and the
release latency from `/ready` answering 200 to the request reaching the upstream.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from servlane_core.routing.picking import pick_backend
from servlane_core.routing.routes import Backend
from servlane_gateway.routing.demand_lease import CallbackDemand
from tests.gateway.waking_upstream import WakingUpstream, start_waking_upstream
from tests.support.gateway_harness import Gateway, StartGateway, aifeature, aimodel, route_in
from tests.support.hold import HELD, waking_model
from tests.support.polling import wait_until

REJECTIONS = "servlane_gateway_hold_rejections_total"


@pytest.fixture
def waking() -> Iterator[list[WakingUpstream]]:
    """Upstreams started by `upstream(name)`, all closed at the end."""
    started: list[WakingUpstream] = []
    yield started
    for upstream in started:
        upstream.close()


def upstream(started: list[WakingUpstream], name: str, waits: bool = False) -> WakingUpstream:
    found = start_waking_upstream(name, waits)
    started.append(found)
    return found


def chat(gw: Gateway, model: str, timeout: float = 20.0, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers, timeout=timeout)


def held(gw: Gateway, model: str, namespace: str = "default") -> float:
    return gw.sample(HELD, namespace=namespace, model=model)


def test_a_request_for_a_model_at_zero_is_held_and_answered_once_a_pod_is_ready(
    start_gateway: StartGateway, waking: list[WakingUpstream]
) -> None:
    cold = upstream(waking, "cold")
    gw = start_gateway([waking_model("cold", cold.url)])
    signals: list[tuple[str, str]] = []
    assert gw.state.hold is not None
    gw.state.hold.demand = CallbackDemand(lambda namespace, model: signals.append((namespace, model)))
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(chat, gw, "cold")
        wait_until("the request to be held", lambda: held(gw, "cold") == 1, 10)
        assert signals == [("default", "cold")]  # demand at once, for the model's own namespace and name
        wait_until("the gateway to ask the pod /ready", lambda: cold.probes >= 2, 10)
        assert not answer.done()
        assert not cold.arrivals
        cold.become_ready()
        response = answer.result(10)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "cold"
    assert held(gw, "cold") == 0
    assert gw.sample("servlane_gateway_hold_seconds_count", namespace="default") == 1


def test_a_model_that_does_not_wake_is_refused_at_once(
    start_gateway: StartGateway, waking: list[WakingUpstream]
) -> None:
    broken = upstream(waking, "broken")
    fixed = waking_model("fixed", broken.url)
    fixed["spec"].pop("autoscaling")
    fixed["spec"]["replicas"] = 0  # nothing scales it back
    gw = start_gateway([waking_model("broken", broken.url, phase="Degraded"), fixed])
    for model in ("broken", "fixed"):
        started = time.monotonic()
        response = chat(gw, model)
        assert response.status_code == 503
        assert time.monotonic() - started < 2
    assert broken.probes == 0


def test_the_queues_are_bounded_per_model_and_per_namespace_and_one_team_never_takes_anothers_places(
    start_gateway: StartGateway, waking: list[WakingUpstream]
) -> None:
    pods = upstream(waking, "pods")
    objects = [
        waking_model("b1", pods.url, "team-b"),
        waking_model("b2", pods.url, "team-b"),
        waking_model("a1", pods.url, "team-a"),
    ]
    gw = start_gateway(objects, hold_max_per_model=2, hold_max_per_namespace=3, unavailable_retry_after=7)
    with ThreadPoolExecutor(8) as pool:
        waiting = [pool.submit(chat, gw, "team-b/b1") for _ in range(2)]
        wait_until("team-b's b1 queue to fill", lambda: held(gw, "b1", "team-b") == 2, 10)
        full_model = chat(gw, "team-b/b1")
        waiting.append(pool.submit(chat, gw, "team-b/b2"))
        wait_until("a third of team-b's requests held", lambda: held(gw, "b2", "team-b") == 1, 10)
        full_namespace = chat(gw, "team-b/b2")
        waiting.append(pool.submit(chat, gw, "team-a/a1"))  # team-b holds all its places: team-a still waits
        wait_until("team-a's request held", lambda: held(gw, "a1", "team-a") == 1, 10)
        for refused in (full_model, full_namespace):
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "7"
            error = refused.json()["error"]
            assert error["code"] == "service_overloaded"
            assert error["retry_after"] == 7
        assert "b1" in full_model.json()["error"]["message"]
        assert "team-b" in full_namespace.json()["error"]["message"]
        assert gw.sample(REJECTIONS, namespace="team-b", reason="model_queue_full") == 1
        assert gw.sample(REJECTIONS, namespace="team-b", reason="namespace_queue_full") == 1
        assert gw.sample(REJECTIONS, namespace="team-a") == 0
        pods.become_ready()
        assert [f.result(10).status_code for f in waiting] == [200] * 4


def test_a_request_held_too_long_gets_503_with_retry_after(
    start_gateway: StartGateway, waking: list[WakingUpstream]
) -> None:
    slow = upstream(waking, "slow")
    gw = start_gateway([waking_model("slow", slow.url)], hold_max_wait_seconds=0.3, unavailable_retry_after=4)
    started = time.monotonic()
    response = chat(gw, "slow")
    assert response.status_code == 503
    assert 0.3 <= time.monotonic() - started < 5
    assert response.headers["retry-after"] == "4"
    assert response.json()["error"]["code"] == "service_overloaded"
    assert gw.sample(REJECTIONS, reason="wait_exceeded") == 1
    assert held(gw, "slow") == 0
    assert not slow.arrivals


def test_held_requests_count_in_flight_for_their_key(start_gateway: StartGateway, waking: list[WakingUpstream]) -> None:
    cold = upstream(waking, "cold")
    keys = "team: sk-team-000000000000000000000000\n"
    gw = start_gateway([waking_model("cold", cold.url)], keys=keys, key_max_in_flight=1)
    auth = {"authorization": "Bearer sk-team-000000000000000000000000"}
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(chat, gw, "cold", headers=auth)
        wait_until("the first request held", lambda: held(gw, "cold") == 1, 10)
        second = chat(gw, "cold", headers=auth)
        assert second.status_code == 429  # the key's one place in flight is the held request's
        assert held(gw, "cold") == 1
        cold.become_ready()
        assert first.result(10).status_code == 200
    assert chat(gw, "cold", headers=auth).status_code == 200  # the place was given back


def stream_lines(gw: Gateway, model: str, client: httpx.Client) -> Any:
    body = {"model": model, "messages": [{"role": "user", "content": "chunks=3"}], "stream": True}
    return client.stream("POST", f"{gw.url}/v1/chat/completions", json=body, timeout=20)


def test_a_held_stream_gets_its_head_at_once_keep_alives_and_then_the_stream(
    start_gateway: StartGateway, waking: list[WakingUpstream]
) -> None:
    cold = upstream(waking, "cold")
    gw = start_gateway([waking_model("cold", cold.url)], hold_keep_alive_seconds=0.1)
    with httpx.Client() as client, stream_lines(gw, "cold", client) as response:
        assert response.status_code == 200  # the head came while no pod is ready
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = response.iter_lines()
        keep_alives = 0
        while keep_alives < 3:
            line = next(lines)
            assert line in (": keep-alive", ""), line
            keep_alives += line == ": keep-alive"
        assert held(gw, "cold") == 1
        cold.become_ready()
        data = [line for line in lines if line.startswith("data:")]
    assert data[-1] == "data: [DONE]"
    assert sum('"content": "cold "' in line for line in data) == 3
    assert '"usage"' not in "".join(data)  # the client did not ask for it: cut as for any stream
    assert cold.state.streams_completed == 1


def test_a_held_stream_whose_wait_fails_ends_with_an_openai_error_event(
    start_gateway: StartGateway, waking: list[WakingUpstream]
) -> None:
    slow = upstream(waking, "slow")
    gw = start_gateway([waking_model("slow", slow.url)], hold_max_wait_seconds=0.3, hold_keep_alive_seconds=0.1)
    client = gw.client()
    stream = client.chat.completions.create(model="slow", messages=[{"role": "user", "content": "hi"}], stream=True)
    with pytest.raises(openai.APIError, match="no ready pod"):
        list(stream)
    assert gw.sample(REJECTIONS, reason="wait_exceeded") == 1
    assert gw.sample("servlane_gateway_requests_total", feature="slow", model="slow", code="503") == 1


def test_a_client_that_leaves_while_held_frees_its_place_at_once(
    start_gateway: StartGateway, waking: list[WakingUpstream]
) -> None:
    cold = upstream(waking, "cold")
    gw = start_gateway([waking_model("cold", cold.url)], hold_max_per_model=1, hold_keep_alive_seconds=0.1)
    with httpx.Client() as client, stream_lines(gw, "cold", client) as response:
        assert response.status_code == 200
        assert held(gw, "cold") == 1
    wait_until("the stream's place freed", lambda: held(gw, "cold") == 0, 5)
    with pytest.raises(httpx.ReadTimeout):
        chat(gw, "cold", timeout=0.5)  # a plain request whose client gives up
    wait_until("the request's place freed", lambda: held(gw, "cold") == 0, 5)
    with ThreadPoolExecutor(1) as pool:
        again = pool.submit(chat, gw, "cold")
        wait_until("a new request held in the freed place", lambda: held(gw, "cold") == 1, 10)
        cold.become_ready()
        assert again.result(10).status_code == 200
    assert len(cold.arrivals) == 1  # the ones that left never reached it


def test_held_requests_fail_at_once_when_their_model_is_deleted(
    start_gateway: StartGateway, waking: list[WakingUpstream]
) -> None:
    cold = upstream(waking, "cold")
    other = upstream(waking, "other")
    gw = start_gateway([waking_model("cold", cold.url), waking_model("other", other.url)])
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(chat, gw, "cold")
        wait_until("the request held", lambda: held(gw, "cold") == 1, 10)
        started = time.monotonic()
        gw.write_routes([waking_model("other", other.url)])
        response = answer.result(10)
    assert response.status_code == 503
    assert time.monotonic() - started < 5
    assert gw.sample(REJECTIONS, reason="model_gone") == 1


def test_requests_held_during_a_canary_are_released_along_the_features_weights(
    start_gateway: StartGateway, waking: list[WakingUpstream]
) -> None:
    v1, v2 = upstream(waking, "v1"), upstream(waking, "v2")
    objects = [waking_model("v1", v1.url), waking_model("v2", v2.url), aifeature("chat", [("v1", 70), ("v2", 30)])]
    gw = start_gateway(objects)
    ids = [f"req-{i}" for i in range(40)]
    route = route_in(gw.state.table, "chat")
    as_ready = dataclasses.replace(route, backends=tuple(_ready(b) for b in route.backends))
    expected = {i: pick_backend(as_ready, i).model for i in ids}  # type: ignore[union-attr]
    assert set(expected.values()) == {"v1", "v2"}
    with ThreadPoolExecutor(len(ids)) as pool:
        answers: dict[str, Future[httpx.Response]] = {
            i: pool.submit(chat, gw, "chat", headers={"x-request-id": i}) for i in ids
        }
        wait_until("all requests held", lambda: held(gw, "v1") + held(gw, "v2") == len(ids), 10)
        v1.become_ready()
        v2.become_ready()
        got = {i: f.result(10).json()["choices"][0]["message"]["content"] for i, f in answers.items()}
    assert got == expected


def _ready(backend: Backend) -> Backend:
    return Backend(**{**backend.__dict__, "ready": True})


@pytest.mark.parametrize("waits", [True, False], ids=["ready-pushed", "ready-polled"])
def test_held_requests_reach_the_upstream_within_100ms_of_its_ready(
    start_gateway: StartGateway, waking: list[WakingUpstream], waits: bool
) -> None:
    """Measured: from `/ready` answering 200 to the held request arriving at the upstream, p50 under 100 ms
    (five models, three held requests each), from a runtime that answers /ready?wait= when it is ready and
    from one that answers at once (asked again every 50 ms)."""
    names = [f"m{i}" for i in range(5)]
    pods = {name: upstream(waking, name, waits) for name in names}
    gw = start_gateway([waking_model(name, pods[name].url) for name in names])
    latencies: list[float] = []
    with ThreadPoolExecutor(3) as pool:
        for name in names:
            answers = [pool.submit(chat, gw, name) for _ in range(3)]
            wait_until(f"{name}'s requests held", lambda n=name: held(gw, n) == 3, 10)  # type: ignore[misc]
            ready_at = pods[name].become_ready()
            assert [a.result(10).status_code for a in answers] == [200] * 3
            latencies += [arrived - ready_at for arrived in pods[name].arrivals]
    assert len(latencies) == 15
    p50 = statistics.median(latencies)
    print(f"release latency p50 {p50 * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms")
    assert p50 < 0.1


def test_a_starting_pod_tells_the_gateway_when_it_is_ready_instead_of_being_polled(
    start_gateway: StartGateway, waking: list[WakingUpstream]
) -> None:
    """A runtime that takes /ready?wait= is asked once and answers when its model is ready: no probe every
    50 ms for the whole start (on a CPU node those compete with the engine's load), and the held request
    still goes out at once."""
    cold = upstream(waking, "cold", waits=True)
    gw = start_gateway([waking_model("cold", cold.url)])
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(chat, gw, "cold")
        wait_until("the gateway waiting on the pod's /ready", lambda: cold.waiting == 1, 10)
        ready_at = cold.become_ready()
        assert answer.result(10).status_code == 200
    assert cold.probes == 1, cold.probes  # the one wait, answered by the ready
    print(f"ready -> arrival {(cold.arrivals[0] - ready_at) * 1000:.1f} ms")


def test_held_requests_go_out_when_the_route_table_says_their_model_is_ready(
    start_gateway: StartGateway, waking: list[WakingUpstream]
) -> None:
    """The operator's Ready (here: the routes file's) releases them too, whatever the pod's /ready says."""
    cold = upstream(waking, "cold")
    gw = start_gateway([waking_model("cold", cold.url)])
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(chat, gw, "cold")
        wait_until("the request held", lambda: held(gw, "cold") == 1, 10)
        gw.write_routes([aimodel("cold", cold.url + "/v1")])  # Ready; its /ready still answers 503
        response = answer.result(10)
    assert response.status_code == 200
    assert cold.ready_since is None
