"""Quotas that hold: every stream is charged, a key's requests in flight are capped, and tokens are
reserved at admission so concurrent requests cannot all pass before the first one is charged."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from servlane_api import metric_names as m
from servlane_gateway.http.proxy import UsageScanner
from servlane_gateway.limits.rates import MAX_CHARGED_TOKENS, Limits, RateLimiter, estimate_tokens
from tests.support.gateway_harness import Gateway, StartGateway, Upstream, aifeature, aimodel
from tests.support.polling import wait_until
from tests.support.quotas import CHAT, events, open_held, released_at_end

KEYS = "team-a: sk-alpha-00000000000000000000000\nteam-b: sk-bravo-00000000000000000000000\n"


class Clock:
    """A clock the test moves by hand (here: never), so bucket levels are exact."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def say(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def objects(upstreams: dict[str, Upstream]) -> list[dict[str, Any]]:
    return [aimodel("chat-v1", upstreams["v1"].url), aifeature("chat", [("chat-v1", 100)])]


def in_memory(gw: Gateway) -> RateLimiter:
    """The gateway's limiter, which these tests start in this replica's memory (it counts what it holds)."""
    assert isinstance(gw.state.limiter, RateLimiter)
    return gw.state.limiter


def charged_usage(gw: Gateway) -> float:
    return gw.sample(m.TOKENS, feature="chat", model="chat-v1", kind="prompt") + gw.sample(
        m.TOKENS, feature="chat", model="chat-v1", kind="completion"
    )


@pytest.mark.parametrize("options", [None, {"include_usage": False}])
def test_a_stream_is_charged_though_the_client_did_not_ask_for_usage_and_never_sees_it(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, options: dict[str, Any] | None
) -> None:
    gw = start_gateway(objects(upstreams))
    gw.state.limiter = RateLimiter(per_feature=Limits(tokens_per_minute=600), clock=Clock())
    body: dict[str, Any] = {"model": "chat", "messages": say("chunks=3"), "stream": True}
    if options is not None:
        body["stream_options"] = options
    raw = httpx.post(gw.url + CHAT, json=body, timeout=10).content
    got = events(raw)
    assert got[-1] == "[DONE]"
    assert [e["choices"][0]["delta"]["content"] for e in got[:-1]] == ["v1 "] * 3  # all content, in order
    assert b'"usage"' not in raw  # exactly what the client would get from a backend it asked no usage of
    assert upstreams["v1"].state.bodies[-1]["stream_options"] == {"include_usage": True}
    wait_until(
        "the usage charged", lambda: gw.sample(m.TOKENS, feature="chat", model="chat-v1", kind="completion") == 3, 10
    )
    tokens_left = in_memory(gw).tokens_left("feature", "default/chat")
    assert tokens_left == 600 - charged_usage(gw)  # the usage exactly: the reservation was reconciled


def test_a_stream_that_asked_for_usage_gets_the_usage_chunk_once(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    gw = start_gateway(objects(upstreams))
    gw.state.limiter = RateLimiter(per_feature=Limits(tokens_per_minute=600), clock=Clock())
    body = {"model": "chat", "messages": say("chunks=2"), "stream": True, "stream_options": {"include_usage": True}}
    got = events(httpx.post(gw.url + CHAT, json=body, timeout=10).content)
    with_usage = [e for e in got if isinstance(e, dict) and "usage" in e]
    assert len(with_usage) == 1
    assert with_usage[0]["choices"] == []
    assert with_usage[0]["usage"]["completion_tokens"] == 2
    assert got[-2:] == [with_usage[0], "[DONE]"]
    wait_until(
        "the usage charged", lambda: gw.sample(m.TOKENS, feature="chat", model="chat-v1", kind="completion") == 2, 10
    )
    assert in_memory(gw).tokens_left("feature", "default/chat") == 600 - charged_usage(gw)


def test_a_client_that_closes_on_done_is_charged_and_counted_as_served(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    # The openai client closes its connection once it has `[DONE]`, before the backend's end of body may have
    # come: the gateway then sees the client leave, but the stream was whole and its usage chunk already read.
    gw = start_gateway(objects(upstreams))
    body = {"model": "chat", "messages": say("chunks=3 linger=5"), "stream": True}
    with httpx.Client(base_url=gw.url, timeout=10) as client, client.stream("POST", CHAT, json=body) as response:
        received = b""
        for part in response.iter_raw():
            received += part
            if b"data: [DONE]" in received:
                break
    assert b'"usage"' not in received
    wait_until("the request counted", lambda: gw.sample(m.REQUESTS, feature="chat", model="chat-v1", code="200"), 10)
    assert gw.sample(m.REQUESTS, feature="chat", model="chat-v1", code="499") == 0
    assert gw.sample(m.TOKENS, feature="chat", model="chat-v1", kind="completion") == 3


def test_the_usage_chunk_is_cut_out_however_the_stream_is_split() -> None:
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}\r\n\r\n'
    content = [b'data: {"choices": [{"delta": {"content": "a"}}], "usage":null}\r\n\r\n'] * 2
    stream = b"".join([*content, usage, b"data: [DONE]\r\n\r\n"])
    for size in (1, 7, len(stream)):
        scanner = UsageScanner(strip_usage=True)
        relayed = b"".join(scanner.feed(stream[i : i + size]) for i in range(0, len(stream), size))
        assert relayed + scanner.finish() == b"".join([*content, b"data: [DONE]\r\n\r\n"])
        assert scanner.usage == {"prompt_tokens": 4, "completion_tokens": 2}
    kept = UsageScanner()
    assert kept.feed(stream) == stream  # the client asked: relayed as it came
    assert kept.finish() == b""
    assert kept.usage == {"prompt_tokens": 4, "completion_tokens": 2}
    long_line = b"data: " + b"x" * (UsageScanner.MAX_LINE + 10) + b"\n\n"
    scanner = UsageScanner(strip_usage=True)
    relayed = b"".join(scanner.feed(long_line[i : i + 4096]) for i in range(0, len(long_line), 4096))
    assert relayed + scanner.finish() == long_line  # relayed, not held without bound


def test_a_key_with_its_in_flight_cap_full_gets_429_with_retry_after(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    gw = start_gateway(objects(upstreams), keys=KEYS, key_max_in_flight=2)
    held_body = {"model": "chat", "messages": say("hold chunks=2"), "stream": True}
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        with released_at_end(upstreams["v1"]):
            held = [open_held(client, held_body, "sk-alpha-00000000000000000000000") for _ in range(2)]
            assert [r.status_code for r in held] == [200, 200]
            assert in_memory(gw).in_flight("key", "team-a") == 2
            third = client.post(
                CHAT, json={"model": "chat", "messages": say("hi")}, headers=bearer("sk-alpha-00000000000000000000000")
            )
            assert third.status_code == 429, third.text
            assert third.headers["Retry-After"] == "1"
            error = third.json()["error"]
            assert error["retry_after"] == 1
            assert error["code"] == "rate_limit_exceeded"
            assert "2 concurrent requests for this key" in error["message"]
            other = client.post(
                CHAT, json={"model": "chat", "messages": say("hi")}, headers=bearer("sk-bravo-00000000000000000000000")
            )
            assert other.status_code == 200  # another key's places are its own
        for response in held:
            assert events(response.finish())[-1] == "[DONE]"
        wait_until("the streams to end", lambda: in_memory(gw).in_flight("key", "team-a") == 0, 10)
        again = client.post(
            CHAT, json={"model": "chat", "messages": say("hi")}, headers=bearer("sk-alpha-00000000000000000000000")
        )
        assert again.status_code == 200, again.text
    assert gw.sample(m.REQUESTS, feature="chat", model="", code="429") == 1


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_reservations_stop_concurrent_requests_overshooting_the_token_budget(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    gw = start_gateway(objects(upstreams))
    gw.state.limiter = RateLimiter(per_feature=Limits(tokens_per_minute=1000), clock=Clock())
    body = {"model": "chat", "messages": say("hold chunks=2"), "stream": True, "max_tokens": 400}
    reserve = 400 + len(json.dumps(body)) // 4  # max_tokens plus the prompt estimated from the body's bytes
    assert estimate_tokens(body, len(json.dumps(body)), "chat/completions", 256) == reserve
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        with released_at_end(upstreams["v1"]):
            sent = [open_held(client, body) for _ in range(5)]
            admitted = [r for r in sent if r.status_code == 200]
            # Each is admitted while the budget is not in debt: 1000 -> 1000-r -> 1000-2r -> 1000-3r < 0 (r ~ 420),
            # so the reservations overshoot by less than one of them. Without reserving, all 5 would be in flight.
            assert len(admitted) == 3
            assert in_memory(gw).tokens_left("feature", "default/chat") == 1000 - 3 * reserve
            for refused in sent[3:]:
                assert refused.status_code == 429
                assert "tokens per minute for this feature" in refused.response.json()["error"]["message"]
        for response in admitted:
            assert events(response.finish())[-1] == "[DONE]"
    wait_until(
        "the streams charged",
        lambda: gw.sample(m.TOKENS, feature="chat", model="chat-v1", kind="completion") == 3 * 2,
        10,
    )
    # Each reservation was replaced by what the request used.
    wait_until(
        "the reservations reconciled",
        lambda: in_memory(gw).tokens_left("feature", "default/chat") == 1000 - charged_usage(gw),
        10,
    )


def test_the_reservation_is_an_estimate_settled_once() -> None:
    limiter = RateLimiter(per_key=Limits(tokens_per_minute=600, max_in_flight=1), clock=Clock())
    admission = limiter.admit("a", "prod", "chat", reserve_tokens=500)
    assert limiter.tokens_left("key", "a") == 100
    admission.settle(50)
    admission.settle(50)  # once only
    assert limiter.tokens_left("key", "a") == 550
    assert limiter.in_flight("key", "a") == 0
    unknown = limiter.admit("a", "prod", "chat", reserve_tokens=200)
    unknown.settle(None)  # the client left mid-stream: what it cost is unknown, the reservation stands
    assert limiter.tokens_left("key", "a") == 350
    nothing = limiter.admit("a", "prod", "chat", reserve_tokens=200)
    nothing.settle(0)  # the backend answered an error: all given back
    assert limiter.tokens_left("key", "a") == 350
    chat = {"messages": say("hi"), "max_completion_tokens": 30, "max_tokens": 99, "n": 2}
    assert estimate_tokens(chat, 400, "chat/completions", 256) == 100 + 30 * 2
    assert estimate_tokens({"prompt": "hi"}, 40, "completions", 256) == 10 + 256
    assert estimate_tokens({"input": "hi", "max_tokens": 5}, 40, "embeddings", 256) == 10


def test_a_reservation_is_at_most_one_minute_of_the_smallest_token_limit() -> None:
    clock = Clock()
    per_key, per_feature = Limits(tokens_per_minute=600), Limits(tokens_per_minute=1000)
    limiter = RateLimiter(per_key=per_key, per_feature=per_feature, clock=clock)
    # The client's numbers, of any size: the estimate never overflows, the reservation is one minute of the key's.
    huge = {"messages": say("hi"), "max_tokens": 10**400, "n": 10**400}
    estimate = estimate_tokens(huge, 40, "chat/completions", 256)
    assert estimate > 10**20
    admission = limiter.admit("a", "prod", "chat", reserve_tokens=estimate)
    assert admission.reserved == 600
    admission.settle(None)  # the client left: the reservation stands as the charge
    assert limiter.tokens_left("key", "a") == 0
    assert limiter.tokens_left("feature", "prod/chat") == 400
    clock.now += 60  # a minute later the key's budget is whole again, not in debt until the heat death
    assert limiter.tokens_left("key", "a") == 600
    reported = limiter.admit("a", "prod", "chat", reserve_tokens=10)
    reported.settle(10**400)  # a backend's usage of any size is charged as the most there is, not an OverflowError
    assert limiter.tokens_left("key", "a") == 600 - MAX_CHARGED_TOKENS


def test_a_huge_max_tokens_holds_back_the_features_other_callers_for_a_minute_at_most(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    """A key with a feature's model shared to it sends max_tokens of 10**300 and leaves before any usage: the
    feature's bucket, shared with every key that calls it, owes at most one minute, and nothing is a 500."""
    gw = start_gateway(objects(upstreams), keys=KEYS)
    clock = Clock()
    gw.state.limiter = RateLimiter(
        per_key=Limits(max_in_flight=1), per_feature=Limits(tokens_per_minute=1000), clock=clock
    )
    alpha, bravo = "sk-alpha-00000000000000000000000", "sk-bravo-00000000000000000000000"
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        for max_tokens in (10**300, 10**400):  # beyond a float too
            clock.now += 60
            body = {"model": "chat", "messages": say("hold chunks=2"), "stream": True, "max_tokens": max_tokens}
            with released_at_end(upstreams["v1"]):
                held = open_held(client, body, bravo)
                assert held.status_code == 200, held.first
                held.response.close()  # gone before the usage chunk
                # The gateway ends the request on the disconnect, while the backend still holds the rest: if the
                # backend went on first, its usage (a few tokens) could reach the gateway before the disconnect.
                wait_until("bravo's place freed", lambda: in_memory(gw).in_flight("key", "team-b") == 0, 10)
            assert in_memory(gw).tokens_left("feature", "default/chat") == 0  # one minute's allowance, no more
            refused = client.post(CHAT, json={"model": "chat", "messages": say("hi")}, headers=bearer(alpha))
            assert refused.status_code == 429
            assert int(refused.headers["Retry-After"]) <= 1
            clock.now += 60
            served = client.post(CHAT, json={"model": "chat", "messages": say("hi")}, headers=bearer(alpha))
            assert served.status_code == 200, served.text
