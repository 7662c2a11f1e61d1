"""The real gateway (uvicorn, loopback) in front of real upstreams, called with the official openai client."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from servlane_api import metric_names as m
from tests.support.gateway_harness import (
    Gateway,
    StartGateway,
    Upstream,
    aifeature,
    aimodel,
    picked,
    refused_url,
    route_in,
)
from tests.support.polling import wait_until

HI: Any = [{"role": "user", "content": "hi"}]
Versions = tuple[Gateway, list[dict[str, Any]]]


@pytest.fixture
def two_versions(upstreams: dict[str, Upstream], start_gateway: StartGateway) -> Versions:
    objects = [
        aimodel("chat-v1", upstreams["v1"].url, status_served="org/chat-1"),
        aimodel("chat-v2", upstreams["v2"].url, status_served="org/chat-2"),
        aifeature("chat", [("chat-v1", 50), ("chat-v2", 50)]),
        aifeature("only-v1", [("chat-v1", 100)], defaults={"systemPrompt": "Be brief.", "maxTokensCap": 8}),
    ]
    return start_gateway(objects), objects


def test_feature_routes_to_its_model_with_the_served_name_and_defaults(
    two_versions: Versions, upstreams: dict[str, Upstream]
) -> None:
    gw, _ = two_versions
    answer = gw.client().chat.completions.create(model="only-v1", messages=HI, max_tokens=100)
    assert answer.choices[0].message.content == "v1"
    sent = upstreams["v1"].state.bodies[-1]
    assert sent["model"] == "org/chat-1"
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    assert sent["max_tokens"] == 8
    assert gw.sample(m.REQUESTS, feature="only-v1", model="chat-v1", code="200") == 1
    assert gw.sample(m.TOKENS, feature="only-v1", model="chat-v1", kind="completion") == 1


def test_sticky_ids_follow_the_weights_and_stay_put(two_versions: Versions) -> None:
    gw = two_versions[0]
    client = gw.client()
    route = route_in(gw.state.table, "chat")
    answered = {}
    for i in range(24):
        rid = f"req-{i}"
        answer = client.chat.completions.create(model="chat", messages=HI, extra_headers={"X-Request-ID": rid})
        answered[rid] = answer.choices[0].message.content
        assert answered[rid] == {"chat-v1": "v1", "chat-v2": "v2"}[picked(route, rid)]
    assert set(answered.values()) == {"v1", "v2"}
    for rid in list(answered)[:6]:  # the same id lands on the same version again, by header or `user`
        again = client.chat.completions.create(model="chat", messages=HI, extra_headers={"X-Request-ID": rid})
        by_user = client.chat.completions.create(model="chat", messages=HI, user=rid)
        assert again.choices[0].message.content == by_user.choices[0].message.content == answered[rid]
    assert gw.sample(m.WEIGHT, feature="chat", model="chat-v1") == 50


def test_served_names_completions_embeddings_and_model_list(
    two_versions: Versions, upstreams: dict[str, Upstream]
) -> None:
    gw = two_versions[0]
    client = gw.client()
    sticky_v2 = next(f"u{i}" for i in range(1000) if picked(route_in(gw.state.table, "chat"), f"u{i}") == "chat-v2")
    assert client.completions.create(model="chat", prompt="hello", user=sticky_v2).choices[0].text == "v2"
    assert upstreams["v2"].state.bodies[-1]["model"] == "org/chat-2"  # a served name with '/' is still sent
    assert client.embeddings.create(model="chat", input=["a", "b"], user="u").data[1].embedding == [0.5, 1.0]
    # ... but is not callable directly: it would read as `namespace/name` (the gateway logs it, see routes).
    for refused in ("org/chat-2", "default/org/chat-2"):
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model=refused, prompt="hello")
    assert [x.id for x in client.models.list()] == ["chat", "only-v1"]


def test_unknown_model_is_404(two_versions: Versions) -> None:
    gw = two_versions[0]
    with pytest.raises(openai.NotFoundError) as caught:
        gw.client().chat.completions.create(model="nope", messages=HI)
    assert caught.value.code == "model_not_found"
    assert gw.sample(m.REQUESTS, feature="", model="", code="404") == 1


def test_routes_file_changes_apply_and_not_ready_gets_503(two_versions: Versions) -> None:
    gw, objects = two_versions
    objects[2] = aifeature("chat", [("chat-v2", 100)])
    gw.write_routes(objects)
    wait_until("routes reload", lambda: route_in(gw.state.table, "chat").backends[0].model == "chat-v2")
    answer = gw.client().chat.completions.create(model="chat", messages=HI, user="anyone")
    assert answer.choices[0].message.content == "v2"
    objects[1] = aimodel("chat-v2", objects[1]["status"]["endpoint"], ready=False)
    gw.write_routes(objects)
    wait_until("routes reload", lambda: not route_in(gw.state.table, "chat").backends[0].ready)
    response = httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "chat", "messages": HI})
    assert response.status_code == 503
    assert int(response.headers["Retry-After"]) >= 1
    assert response.json()["error"]["code"] == "service_overloaded"
    assert gw.sample(m.ERRORS, feature="chat", model="", reason="upstream_unavailable") == 1
    assert gw.sample(m.WEIGHT, feature="chat", model="chat-v2") == 0


def test_refused_connection_is_retried_once_on_another_backend(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    objects = [aimodel("dead", refused_url()), aimodel("alive", upstreams["v1"].url), aimodel("dead2", refused_url())]
    gw = start_gateway(
        [*objects, aifeature("f", [("dead", 99), ("alive", 1)]), aifeature("g", [("dead", 50), ("dead2", 50)])]
    )
    assert picked(route_in(gw.state.table, "f"), "u1") == "dead"  # so the first try is refused
    sent_before = len(upstreams["v1"].state.bodies)
    assert gw.client().chat.completions.create(model="f", messages=HI, user="u1").choices[0].message.content == "v1"
    assert len(upstreams["v1"].state.bodies) == sent_before + 1
    assert gw.sample(m.REQUESTS, feature="f", model="alive", code="200") == 1
    # The refused attempt is counted against the dead model, so a dead canary fails its analysis.
    assert gw.sample(m.ERRORS, feature="f", model="dead", reason="upstream_unavailable") == 1
    assert gw.sample(m.REQUESTS, feature="f", model="dead", code="502") == 1
    with pytest.raises(openai.APIStatusError) as caught:  # both refuse: one retry only, then 503
        gw.client().chat.completions.create(model="g", messages=HI)
    assert caught.value.status_code == 503
    assert caught.value.response.headers["Retry-After"]
    # Both attempts count against their model: the first as a refused attempt, the second as the 503.
    assert gw.sample(m.ERRORS, feature="g", model="dead2", reason="upstream_unavailable") == 1
    assert gw.sample(m.ERRORS, feature="g", model="dead", reason="upstream_unavailable") == 1


def test_stream_passes_through_before_the_upstream_finishes(
    two_versions: Versions, upstreams: dict[str, Upstream]
) -> None:
    gw = two_versions[0]
    state = upstreams["v1"].state
    state.released.clear()
    completed = state.streams_completed
    stream = gw.client().chat.completions.create(
        model="only-v1", messages=[{"role": "user", "content": "hold chunks=3"}], stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = iter(stream)
    first = next(chunks)
    assert first.choices[0].delta.content == "v1 "
    assert not state.released.is_set()
    assert state.streams_completed == completed
    state.released.set()
    rest = list(chunks)
    assert [c.choices[0].delta.content for c in rest if c.choices] == ["v1 ", "v1 "]
    assert rest[-1].usage is not None
    assert rest[-1].usage.completion_tokens == 3
    wait_until(
        "the request counted", lambda: gw.sample(m.REQUESTS, feature="only-v1", model="chat-v1", code="200") == 1
    )
    assert gw.sample(m.TOKENS, feature="only-v1", model="chat-v1", kind="completion") == 3
    assert gw.sample(f"{m.TTFT}_count", feature="only-v1", model="chat-v1") == 1


def test_client_disconnect_closes_the_upstream_stream(two_versions: Versions, upstreams: dict[str, Upstream]) -> None:
    gw = two_versions[0]
    state = upstreams["v1"].state
    state.released.clear()
    disconnected = state.streams_disconnected
    body = {"model": "only-v1", "stream": True, "messages": [{"role": "user", "content": "hold chunks=50 gap=0.05"}]}
    with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body, timeout=10) as response:
        assert next(response.iter_raw()).startswith(b"data: ")
    wait_until("499 counted", lambda: gw.sample(m.REQUESTS, feature="only-v1", model="chat-v1", code="499") == 1)
    state.released.set()  # the upstream leaves its hold; its next chunk finds the connection gone
    wait_until("the upstream to see the disconnect", lambda: state.streams_disconnected == disconnected + 1)
    assert gw.sample(m.ERRORS, feature="only-v1", model="chat-v1", reason="stream_aborted") == 0
