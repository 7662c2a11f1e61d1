"""Upstream failures, timeouts, access control and limits through the real gateway over loopback."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from servlane_api import metric_names as m
from tests.support.gateway_harness import Gateway, StartGateway, Upstream, aifeature, aimodel
from tests.support.polling import wait_until
from tests.support.wire import post_all_then_read

KEYS = "team-a: sk-alpha-00000000000000000000000\nteam-b: sk-bravo-00000000000000000000000 default/chat\n"


def say(text: str) -> Any:
    return [{"role": "user", "content": text}]


def drain(stream: Iterable[object], into: list[object]) -> None:
    for chunk in stream:
        into.append(chunk)


@pytest.fixture
def gateway(upstreams: dict[str, Upstream], start_gateway: StartGateway) -> Gateway:
    objects = [
        aimodel("chat-v1", upstreams["v1"].url),
        aimodel("chat-v2", upstreams["v2"].url),
        aifeature("chat", [("chat-v1", 100)]),
        aifeature("other", [("chat-v2", 100)]),
    ]
    return start_gateway(objects, first_byte_timeout=1.0, idle_timeout=1.0)


def test_upstream_5xx_passes_through_and_counts_as_error(gateway: Gateway) -> None:
    with pytest.raises(openai.InternalServerError) as caught:
        gateway.client().chat.completions.create(model="chat", messages=say("status=500"))
    assert caught.value.message.endswith("v1 failed on purpose")
    assert gateway.sample(m.REQUESTS, feature="chat", model="chat-v1", code="500") == 1
    assert gateway.sample(m.ERRORS, feature="chat", model="chat-v1", reason="status_5xx") == 1


def test_slow_first_byte_is_504_upstream_timeout(gateway: Gateway) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        gateway.client().chat.completions.create(model="chat", messages=say("delay=3"))
    assert caught.value.status_code == 504
    assert gateway.sample(m.ERRORS, feature="chat", model="chat-v1", reason="upstream_timeout") == 1


@pytest.mark.parametrize("server", ["start_gateway", "start_gateway_on_plain_uvicorn"])
def test_client_leaving_a_slow_answer_cancels_the_upstream_call(
    upstreams: dict[str, Upstream], server: str, request: pytest.FixtureRequest
) -> None:
    # The gateway's own server protocol tells the proxy of the disconnect by a callback; under any other
    # server a watcher task waits for http.disconnect: both cancel the upstream call.
    start: StartGateway = request.getfixturevalue(server)
    objects = [aimodel("chat-v1", upstreams["v1"].url), aifeature("chat", [("chat-v1", 100)])]
    gateway = start(objects, first_byte_timeout=1.0, idle_timeout=1.0)
    abandoned = upstreams["v1"].state.abandoned
    body = {"model": "chat", "messages": say("delay=3")}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=0.2)
    wait_until("499", lambda: gateway.sample(m.REQUESTS, feature="chat", model="chat-v1", code="499") == 1)
    wait_until("the upstream to see the disconnect", lambda: upstreams["v1"].state.abandoned == abandoned + 1)
    assert gateway.sample(m.ERRORS, feature="chat", model="chat-v1", reason="upstream_timeout") == 0


def test_stalled_stream_ends_with_an_error_event(gateway: Gateway) -> None:
    stream = gateway.client().chat.completions.create(model="chat", messages=say("chunks=3 gap=3"), stream=True)
    received: list[object] = []
    with pytest.raises(openai.APIError, match="timeout"):
        drain(stream, received)
    assert len(received) == 1
    labels = {"feature": "chat", "model": "chat-v1"}
    wait_until("timeout counted", lambda: gateway.sample(m.ERRORS, **labels, reason="upstream_timeout") == 1)
    assert gateway.sample(m.REQUESTS, **labels, code="200") == 1


def test_stream_cut_short_by_the_upstream(gateway: Gateway) -> None:
    stream = gateway.client().chat.completions.create(model="chat", messages=say("chunks=5 cut=2"), stream=True)
    received: list[object] = []
    with pytest.raises(openai.APIError, match="cut the stream short"):
        drain(stream, received)
    assert len(received) == 2
    labels = {"feature": "chat", "model": "chat-v1", "reason": "stream_aborted"}
    wait_until("aborted stream counted", lambda: gateway.sample(m.ERRORS, **labels) == 1)


@pytest.mark.parametrize("partial", ["mid", "line"])
@pytest.mark.parametrize("include_usage", [False, True])
def test_a_stream_cut_inside_an_event_ends_with_an_error_the_client_can_read(
    gateway: Gateway, partial: str, include_usage: bool
) -> None:
    """The backend died halfway through an event (or after its data line, before its blank line): the error event
    was glued to the half line, and the openai client failed on broken JSON instead of raising APIError."""
    stream = gateway.client().chat.completions.create(
        model="chat",
        messages=say(f"chunks=5 cut=2 partial={partial}"),
        stream=True,
        stream_options={"include_usage": True} if include_usage else openai.omit,
    )
    received: list[object] = []
    with pytest.raises(openai.APIError, match="cut the stream short"):
        drain(stream, received)
    assert len(received) == 2 + (partial == "line")  # the whole data line is an event of its own, once ended


def test_error_event_inside_a_200_stream_is_a_failure_and_not_a_fast_first_token(gateway: Gateway) -> None:
    stream = gateway.client().chat.completions.create(model="chat", messages=say("chunks=3 fail=0"), stream=True)
    with pytest.raises(openai.APIError, match="engine failed"):
        drain(stream, [])
    labels = {"feature": "chat", "model": "chat-v1"}
    wait_until("stream error counted", lambda: gateway.sample(m.ERRORS, **labels, reason="stream_error") == 1)
    assert gateway.sample(m.REQUESTS, **labels, code="200") == 1
    # Failed requests are in neither latency histogram, so they cannot make the model look fast.
    assert gateway.sample(f"{m.TTFT}_count", **labels) == 0
    assert gateway.sample(f"{m.LATENCY}_count", **labels) == 0


def test_keys_401_404_and_model_list_per_key(upstreams: dict[str, Upstream], start_gateway: StartGateway) -> None:
    objects = [aimodel("chat-v1", upstreams["v1"].url), aifeature("chat", [("chat-v1", 100)])]
    gw = start_gateway([*objects, aifeature("other", [("chat-v1", 100)])], keys=KEYS)
    with pytest.raises(openai.AuthenticationError):
        gw.client(api_key="sk-wrong-00000000000000000000000").chat.completions.create(model="chat", messages=say("hi"))
    assert httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "chat"}).status_code == 401
    with pytest.raises(openai.NotFoundError) as caught:  # as if it did not exist: no name leaks out of scope
        gw.client(api_key="sk-bravo-00000000000000000000000").chat.completions.create(model="other", messages=say("hi"))
    assert caught.value.code == "model_not_found"
    assert (
        gw.client(api_key="sk-bravo-00000000000000000000000")
        .chat.completions.create(model="chat", messages=say("hi"))
        .choices
    )
    assert [x.id for x in gw.client(api_key="sk-bravo-00000000000000000000000").models.list()] == ["chat"]
    assert (
        gw.client(api_key="sk-alpha-00000000000000000000000")
        .chat.completions.create(model="other", messages=say("hi"))
        .choices
    )
    assert gw.sample(m.REQUESTS, feature="", model="", code="401") == 2
    # Out of scope is counted as a name that exists nowhere: never on the feature of a team it may not call.
    assert gw.sample(m.REQUESTS, feature="", model="", code="404") == 1
    assert gw.sample(m.REQUESTS, feature="other", model="", code="404") == 0
    exposition = httpx.get(gw.metrics_url).text
    assert "sk-" not in exposition
    assert m.REQUESTS in exposition
    assert m.ADDED_LATENCY + "_count" in exposition


def test_rotated_keys_file_applies(upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path) -> None:
    gw = start_gateway([aimodel("chat-v1", upstreams["v1"].url), aifeature("chat", [("chat-v1", 100)])], keys=KEYS)
    (tmp_path / "keys").write_text("team-c: sk-charlie-000000000000000000000\n")
    wait_until("keys reload", lambda: gw.state.keys.find("sk-charlie-000000000000000000000") is not None)
    assert (
        gw.client(api_key="sk-charlie-000000000000000000000")
        .chat.completions.create(model="chat", messages=say("hi"))
        .choices
    )
    with pytest.raises(openai.AuthenticationError):
        gw.client(api_key="sk-alpha-00000000000000000000000").chat.completions.create(model="chat", messages=say("hi"))


def test_body_cap_is_413(upstreams: dict[str, Upstream], start_gateway: StartGateway) -> None:
    gw = start_gateway(
        [aimodel("chat-v1", upstreams["v1"].url), aifeature("chat", [("chat-v1", 100)])], max_body_bytes=2000
    )
    with pytest.raises(openai.APIStatusError) as caught:
        gw.client().chat.completions.create(model="chat", messages=say("x" * 3000))
    assert caught.value.status_code == 413
    assert caught.value.code == "request_too_large"

    def chunked() -> Iterator[bytes]:  # no Content-Length: the cap holds while reading
        yield b'{"model": "chat", "prompt": "'
        yield b"y" * 3000
        yield b'"}'

    assert httpx.post(f"{gw.url}/v1/completions", content=chunked()).status_code == 413


@pytest.mark.parametrize("close", [False, True], ids=["kept-alive", "connection-close"])
def test_a_refusal_before_the_body_is_read_reaches_a_client_that_sends_it_whole_first(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, close: bool
) -> None:
    """A 413 (the body over the cap) and a 401 (a bad key, checked before the body is read) arrive whole to a
    client that uploads its 4 MiB body before reading, and the connection ends cleanly or serves the next
    request: closing on an unread body resets the connection, and the reset can take the answer with it."""
    objects = [aimodel("chat-v1", upstreams["v1"].url), aifeature("chat", [("chat-v1", 100)])]
    capped = start_gateway(objects, max_body_bytes=2000)
    keyed = start_gateway(objects, keys="team-a: sk-alpha-0123456789abcdef0123456789\n")
    body = b"x" * (4 << 20)
    json_body = {"content-type": "application/json"}
    for gw, headers, status in ((capped, json_body, 413), (keyed, {**json_body, "authorization": "Bearer sk-no"}, 401)):
        answer = post_all_then_read(gw.url, "/v1/chat/completions", body, headers, close)
        assert (answer.status, answer.after) == (status, "closed" if close else "reused"), (status, answer.after)
        assert json.loads(answer.body)["error"]["message"]


def test_token_limit_is_429_with_retry_after(upstreams: dict[str, Upstream], start_gateway: StartGateway) -> None:
    objects = [aimodel("chat-v1", upstreams["v1"].url), aifeature("chat", [("chat-v1", 100)])]
    gw = start_gateway([*objects, aifeature("free", [("chat-v1", 100)])], feature_tokens_per_minute=3)
    client = gw.client()
    client.chat.completions.create(model="chat", messages=say("hi"))  # usage > 3 tokens: chat's bucket in debt
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="chat", messages=say("hi"))
    assert "tokens per minute for this feature" in caught.value.message
    assert int(caught.value.response.headers["Retry-After"]) >= 1
    assert client.chat.completions.create(model="free", messages=say("hi")).choices  # its own bucket
    assert gw.sample(m.REQUESTS, feature="chat", model="", code="429") == 1


def test_key_request_limit_is_429_with_retry_after(upstreams: dict[str, Upstream], start_gateway: StartGateway) -> None:
    objects = [aimodel("chat-v1", upstreams["v1"].url), aifeature("chat", [("chat-v1", 100)])]
    gw = start_gateway(objects, keys=KEYS, key_requests_per_minute=2)
    for _ in range(2):
        gw.client(api_key="sk-alpha-00000000000000000000000").chat.completions.create(model="chat", messages=say("hi"))
    with pytest.raises(openai.RateLimitError) as caught:
        gw.client(api_key="sk-alpha-00000000000000000000000").chat.completions.create(model="chat", messages=say("hi"))
    assert "requests per minute for this key" in caught.value.message
    assert 1 <= int(caught.value.response.headers["Retry-After"]) <= 30
    assert (
        gw.client(api_key="sk-bravo-00000000000000000000000")
        .chat.completions.create(model="chat", messages=say("hi"))
        .choices
    )


def test_health_ready_and_metrics(gateway: Gateway) -> None:
    assert httpx.get(f"{gateway.url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{gateway.url}/ready").status_code == 200
    gateway.client().chat.completions.create(model="chat", messages=say("hi"))
    text = httpx.get(gateway.metrics_url).text  # on the metrics port: the API port has no /metrics
    assert f'{m.REQUESTS}{{code="200",feature="chat",model="chat-v1",namespace="default"}} 1.0' in text
    assert f'{m.LATENCY}_bucket{{feature="chat",le="0.005",model="chat-v1",namespace="default"}}' in text
    assert f'{m.WEIGHT}{{feature="other",model="chat-v2",namespace="default"}} 100.0' in text
