"""Limits that hold across gateway replicas: two gateways sharing a real redis-server (started per module,
in a temp dir, on a free port) apply one budget together; a dead replica's places in flight free
themselves within the lease; a Redis that stops answering means 503 + Retry-After, not 500, until it is
back. Plus the pure parts (checks, key names, script arguments and answers, URL redaction, settings)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from pydantic import ValidationError

from servlane_api import metric_names as m
from servlane_core.protocol.errors import OpenAIError
from servlane_gateway.flags import parse_settings
from servlane_gateway.limits.rates import Check, Limits, RateLimiter, plan_checks
from servlane_gateway.limits.redis_limiter import STORE_UNAVAILABLE, RedisLimiter
from servlane_gateway.limits.shared import admit_call, admit_refusal, redact_url, settle_call, store_key
from servlane_gateway.settings import GatewaySettings
from tests.support import shared_limits
from tests.support.gateway_harness import Gateway, StartGateway, Upstream
from tests.support.polling import wait_until
from tests.support.quotas import events, open_held, released_at_end
from tests.support.shared_limits import KEYS, PASSWORD, GatewayProcess, RedisServer, objects

# The shared Redis fixtures, re-exported so pytest finds them for these tests.
redis_server = shared_limits.redis_server
prefix = shared_limits.prefix

CHAT = "/v1/chat/completions"
T = TypeVar("T")


def replicas(
    start: StartGateway, upstreams: dict[str, Upstream], server: RedisServer, prefix: str, **limits: Any
) -> list[Gateway]:
    """Two gateways sharing the Redis: one with the password in its URL, one with it apart."""
    first = start(objects(upstreams), keys=KEYS, redis_url=server.url, redis_key_prefix=prefix, **limits)
    bare_url = f"redis://127.0.0.1:{server.port}/0"
    second = start(
        objects(upstreams), keys=KEYS, redis_url=bare_url, redis_password=PASSWORD, redis_key_prefix=prefix, **limits
    )
    return [first, second]


def chat(gw: Gateway, key: str = "sk-alpha-00000000000000000000000", text: str = "hi") -> httpx.Response:
    body = {"model": "chat", "messages": [{"role": "user", "content": text}]}
    return httpx.post(gw.url + CHAT, json=body, headers={"authorization": f"Bearer {key}"}, timeout=10)


def shared_view(server: RedisServer, prefix: str, look: Callable[[RedisLimiter], Awaitable[T]], **limits: Any) -> T:
    """What the shared store holds, seen as a third replica would see it."""

    async def run() -> T:
        limiter = RedisLimiter(server.url, per_key=Limits(**limits), per_feature=Limits(**limits), prefix=prefix)
        await limiter.start()
        try:
            return await look(limiter)
        finally:
            await limiter.aclose()

    return asyncio.run(run())


def assert_rate_limited(response: httpx.Response, what: str) -> int:
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["code"] == "rate_limit_exceeded"
    assert what in error["message"]
    assert response.headers["Retry-After"] == str(error["retry_after"])
    return int(error["retry_after"])


# --- across two replicas -------------------------------------------------------------------------------


def test_a_key_requests_per_minute_limit_holds_across_both_replicas(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, redis_server: RedisServer, prefix: str
) -> None:
    a, b = replicas(start_gateway, upstreams, redis_server, prefix, key_requests_per_minute=4)
    assert [chat(gw).status_code for gw in (a, b, a, b)] == [200] * 4  # 4 in all, 2 on each replica
    for gw in (a, b):  # the 5th, whichever replica gets it (alone, each would still admit 2 more)
        wait = assert_rate_limited(chat(gw), "requests per minute for this key")
        assert 1 <= wait <= 15  # one request per 15 s refills at 4 per minute
    assert chat(b, key="sk-bravo-00000000000000000000000").status_code == 200  # another key has its own budget
    for gw in (a, b):
        assert gw.sample(m.LIMITS_STORE, mode="redis") == 1
        assert gw.sample(m.LIMITS_STORE, mode="memory") == 0


def test_a_feature_token_quota_is_shared_with_reservations_and_reconciled(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, redis_server: RedisServer, prefix: str
) -> None:
    a, b = replicas(start_gateway, upstreams, redis_server, prefix, feature_tokens_per_minute=1000)
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": "hold chunks=2"}],
        "stream": True,
        "max_tokens": 400,
    }
    reserve = 400 + len(json.dumps(body)) // 4

    def tokens_left() -> float:
        async def look(limiter: RedisLimiter) -> float | None:
            return await limiter.tokens_left("feature", "default/chat")

        left = shared_view(redis_server, prefix, look, tokens_per_minute=1000)
        assert left is not None
        return left

    started = time.monotonic()
    with httpx.Client(timeout=10) as ca, httpx.Client(timeout=10) as cb:
        ca.base_url, cb.base_url = httpx.URL(a.url), httpx.URL(b.url)
        with released_at_end(upstreams["v1"]):
            # 1000 -> 1000-r (a) -> 1000-2r (b) -> 1000-3r < 0 (a): r ~ 420, so the 4th and 5th are refused,
            # on either replica. Per replica, each would have admitted 3 of its own.
            sent = [open_held(c, body, "sk-alpha-00000000000000000000000") for c in (ca, cb, ca, cb, ca)]
            assert [r.status_code for r in sent] == [200, 200, 200, 429, 429]
            for refused in sent[3:]:
                assert "tokens per minute for this feature" in refused.response.json()["error"]["message"]
            refill = (time.monotonic() - started) * 1000 / 60 + 1
            assert 1000 - 3 * reserve <= tokens_left() <= 1000 - 3 * reserve + refill
        for held in sent[:3]:
            assert events(held.finish())[-1] == "[DONE]"
    wait_until("the three streams charged", lambda: all(_charged(gw) for gw in (a, b)), 10)
    used = sum(
        gw.sample(m.TOKENS, feature="chat", model="chat-v1", kind=kind)
        for gw in (a, b)
        for kind in ("prompt", "completion")
    )
    # Each reservation replaced by what its request used (given back, never above one minute's allowance).
    wait_until("the reservations reconciled", lambda: 1000 - used <= tokens_left() <= 1000, 10)


def _charged(gw: Gateway) -> bool:
    return gw.sample(m.TOKENS, feature="chat", model="chat-v1", kind="completion") > 0


def test_a_key_in_flight_cap_is_shared(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, redis_server: RedisServer, prefix: str
) -> None:
    a, b = replicas(start_gateway, upstreams, redis_server, prefix, key_max_in_flight=2)
    held_body = {"model": "chat", "messages": [{"role": "user", "content": "hold chunks=2"}], "stream": True}

    def in_flight() -> int:
        async def look(limiter: RedisLimiter) -> int:
            return await limiter.in_flight("key", "team-a")

        return shared_view(redis_server, prefix, look, max_in_flight=2)

    with httpx.Client(base_url=a.url, timeout=10) as ca, httpx.Client(base_url=b.url, timeout=10) as cb:
        with released_at_end(upstreams["v1"]):
            held = [
                open_held(ca, held_body, "sk-alpha-00000000000000000000000"),
                open_held(cb, held_body, "sk-alpha-00000000000000000000000"),
            ]
            assert [r.status_code for r in held] == [200, 200]
            assert in_flight() == 2
            for gw in (a, b):  # one place on each replica: alone, each would admit one more
                assert assert_rate_limited(chat(gw), "2 concurrent requests for this key") == 1
            assert chat(a, key="sk-bravo-00000000000000000000000").status_code == 200
        for response in held:
            assert events(response.finish())[-1] == "[DONE]"
    wait_until("both places released", lambda: in_flight() == 0, 10)
    assert chat(b).status_code == 200


def test_a_replica_killed_mid_request_frees_its_place_within_the_lease(
    upstreams: dict[str, Upstream],
    start_gateway: StartGateway,
    redis_server: RedisServer,
    prefix: str,
    tmp_path: Path,
) -> None:
    lease = 3.0  # long enough to see it run on after the death on a loaded machine; the stub holds for 10 s
    limits = {"key_max_in_flight": 2, "redis_in_flight_lease": lease}
    survivor = start_gateway(
        objects(upstreams), keys=KEYS, redis_url=redis_server.url, redis_key_prefix=prefix, **limits
    )
    doomed = GatewayProcess(tmp_path, upstreams, redis_server, prefix, limits)
    held_body = {"model": "chat", "messages": [{"role": "user", "content": "hold chunks=2"}], "stream": True}

    def in_flight() -> int:
        async def look(limiter: RedisLimiter) -> int:
            return await limiter.in_flight("key", "team-a")

        return shared_view(redis_server, prefix, look, max_in_flight=2)

    try:
        with (
            httpx.Client(base_url=doomed.url, timeout=10) as on_doomed,
            httpx.Client(base_url=survivor.url, timeout=10) as on_survivor,
        ):
            with released_at_end(upstreams["v1"]):
                mine = open_held(on_survivor, held_body, "sk-alpha-00000000000000000000000")
                admitted = time.monotonic()
                theirs = open_held(on_doomed, held_body, "sk-alpha-00000000000000000000000")
                assert [mine.status_code, theirs.status_code] == [200, 200]
                assert_rate_limited(chat(survivor), "2 concurrent requests for this key")  # the cap is shared
                doomed.kill()  # SIGKILL: no settle, no goodbye; its lease is no longer renewed
                killed = time.monotonic()
                assert in_flight() == 2  # still held right after the death: the lease runs on
                wait_until("the dead replica's place to free", lambda: in_flight() == 1, lease + 10)
                assert time.monotonic() - killed <= lease + 2  # within the lease (plus polling on a busy machine)

                def renewed_over_two_leases() -> bool:
                    assert in_flight() == 1  # the live replica's request keeps its place: it renews its lease
                    return time.monotonic() > admitted + 2 * lease

                wait_until("two leases to pass", renewed_over_two_leases, 2 * lease + 10)
                assert chat(survivor).status_code == 200  # the freed place is usable
                with pytest.raises(httpx.HTTPError):
                    theirs.finish()  # the stream died with its replica
            assert events(mine.finish())[-1] == "[DONE]"
        wait_until("the survivor's place released", lambda: in_flight() == 0, 10)
    finally:
        doomed.kill()


def test_a_redis_that_stops_answering_means_503_with_retry_after_until_it_is_back(
    upstreams: dict[str, Upstream],
    start_gateway: StartGateway,
    tmp_path: Path,
    prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = RedisServer(tmp_path).start()  # its own: stopping it must not disturb the other tests
    try:
        with caplog.at_level(logging.INFO, logger="servlane_gateway"):
            gw = start_gateway(
                objects(upstreams),
                keys=KEYS,
                redis_url=server.url,
                redis_key_prefix=prefix,
                key_requests_per_minute=1000,
                unavailable_retry_after=3,
                redis_timeout=0.3,
            )
            started = [r.getMessage() for r in caplog.records if "through Redis" in r.getMessage()]
            assert started
            assert f"redis://:***@127.0.0.1:{server.port}/0" in started[0]
            assert chat(gw).status_code == 200
            assert httpx.get(gw.url + "/ready").status_code == 200

            server.stop()
            sent = time.monotonic()
            refused = chat(gw)
            assert time.monotonic() - sent < 5  # bounded by the timeouts, never a hang
            assert refused.status_code == 503, refused.text
            assert refused.headers["Retry-After"] == "3"
            error = refused.json()["error"]
            assert (error["type"], error["code"], error["retry_after"]) == ("server_error", STORE_UNAVAILABLE, 3)
            # The replica stays in the Service: unlimited requests, and the 503 JSON itself, still get through.
            assert httpx.get(gw.url + "/ready", timeout=5).status_code == 200
            assert (
                chat(gw, key="sk-wrong-00000000000000000000000").status_code == 401
            )  # what needs no limit check is still answered

            server.start()  # the same port: the gateway's pool reconnects
            wait_until("requests admitted again", lambda: chat(gw).status_code == 200, 20)
            assert httpx.get(gw.url + "/ready").status_code == 200
            assert PASSWORD not in caplog.text  # the password never reaches a log line
            assert "does not answer" in caplog.text
            assert "answers again" in caplog.text
    finally:
        server.stop()


def test_without_a_redis_url_each_replica_keeps_its_own_limits(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    a = start_gateway(objects(upstreams), keys=KEYS, key_requests_per_minute=1)
    b = start_gateway(objects(upstreams), keys=KEYS, key_requests_per_minute=1)
    assert [chat(gw).status_code for gw in (a, b)] == [200, 200]  # the documented per-replica behaviour
    assert a.sample(m.LIMITS_STORE, mode="memory") == 1
    assert isinstance(a.state.limiter, RateLimiter)


# --- the shared store against the in-memory limiter --------------------------------------------------


async def test_the_shared_store_settles_exactly_like_the_in_memory_limiter(
    redis_server: RedisServer, prefix: str
) -> None:
    limits = Limits(tokens_per_minute=600, max_in_flight=1)
    memory = RateLimiter(per_key=limits)
    shared = RedisLimiter(redis_server.url, per_key=limits, per_feature=Limits(), prefix=prefix)
    await shared.start()
    try:
        for limiter in (memory, shared):
            admission = await limiter.acquire("a", "prod", "chat", reserve_tokens=500)
            with pytest.raises(OpenAIError) as refused:  # the one place in flight is taken
                await limiter.acquire("a", "prod", "chat")
            assert refused.value.status == 429
            admission.settle(50)
            admission.settle(50)  # once only
            await _settled(limiter, 550)
            unknown = await limiter.acquire("a", "prod", "chat", reserve_tokens=200)
            unknown.settle(None)  # unknown usage: the reservation stands
            await _settled(limiter, 350)
            nothing = await limiter.acquire("a", "prod", "chat", reserve_tokens=200)
            nothing.settle(0)  # surely nothing used: all given back
            await _settled(limiter, 350)
            more = await limiter.acquire("a", "prod", "chat", reserve_tokens=100)
            more.settle(300)  # used more than reserved: the difference taken
            await _settled(limiter, 50)
            huge = await limiter.acquire("a", "prod", "chat", reserve_tokens=10**400)  # max_tokens past a double
            assert huge.reserved == 600  # one minute's allowance at most, not the client's number
            huge.settle(None)  # the client left: the bounded reservation stands
            await _settled(limiter, 50 - 600)
    finally:
        await shared.aclose()


async def _settled(limiter: RateLimiter | RedisLimiter, expected: float) -> None:
    """Waits (the shared store settles in the background) for the place to free and the bucket to be at
    `expected`, give or take the refill of the test's own duration (600/min: 10 tokens a second)."""
    deadline = time.monotonic() + 10
    while True:
        if isinstance(limiter, RateLimiter):
            left, places = limiter.tokens_left("key", "a"), limiter.in_flight("key", "a")
        else:
            left, places = await limiter.tokens_left("key", "a"), await limiter.in_flight("key", "a")
        if places == 0 and left is not None and expected <= left <= expected + 5:
            return
        assert time.monotonic() < deadline, f"left {left}, in flight {places}, wanted {expected}"
        await asyncio.sleep(0.02)  # the polling interval of a deadline-bounded wait


# --- pure parts -------------------------------------------------------------------------------------


def test_checks_are_planned_key_first_and_name_the_feature_by_its_namespace() -> None:
    per_key = Limits(requests_per_minute=10, max_in_flight=2)
    per_feature = Limits(tokens_per_minute=1000)
    assert plan_checks(per_key, per_feature, "team-a", "prod", "chat") == [
        Check("key", "team-a", "requests", 10),
        Check("key", "team-a", "in_flight", 2),
        Check("feature", "prod/chat", "tokens", 1000),
    ]
    assert plan_checks(per_key, per_feature, None, "prod", "chat") == [Check("feature", "prod/chat", "tokens", 1000)]
    assert plan_checks(Limits(), Limits(), "team-a", "prod", "chat") == []


def test_store_keys_carry_the_prefix_scope_namespace_and_kind() -> None:
    checks = plan_checks(
        Limits(requests_per_minute=1), Limits(requests_per_minute=1, max_in_flight=3), "k", "ns-a", "chat"
    )
    keys = [store_key("servlane:prod:gw", c) for c in checks]
    assert keys == [
        "servlane:prod:gw:key:k:requests",
        "servlane:prod:gw:feature:ns-a/chat:requests",
        "servlane:prod:gw:feature:ns-a/chat:in_flight",
    ]
    other_ns = [
        store_key("servlane:prod:gw", c)
        for c in plan_checks(Limits(), Limits(requests_per_minute=1), None, "ns-b", "chat")
    ]
    assert other_ns == ["servlane:prod:gw:feature:ns-b/chat:requests"]  # same name, other namespace: other budget


def test_script_arguments_and_answers() -> None:
    checks = plan_checks(Limits(requests_per_minute=4, max_in_flight=2), Limits(tokens_per_minute=600), "k", "ns", "f")
    call = admit_call("p", checks, 420, "replica:7", 2.5)
    assert call.keys == ["p:key:k:requests", "p:key:k:in_flight", "p:feature:ns/f:tokens"]
    assert call.args == ["420", "replica:7", "2500000", "requests", "4.0", "in_flight", "2.0", "tokens", "600.0"]
    assert admit_refusal(checks, [1, 0, 0, 0]) is None
    refused = admit_refusal(checks, [0, 14_001, 1, 0])
    assert refused is not None
    assert refused.status == 429
    assert refused.headers() == {"Retry-After": "15"}  # the longest wait, in whole seconds rounded up
    assert refused.message == "Rate limit reached: requests per minute for this key."
    in_flight_only = admit_refusal(checks, [0, 0, 1, 0])
    assert in_flight_only is not None
    assert in_flight_only.message == "Rate limit reached: 2 concurrent requests for this key."
    assert in_flight_only.headers() == {"Retry-After": "1"}
    with pytest.raises(ValueError, match="1 waits for 3 checks"):
        admit_refusal(checks, [1, 0])
    settle = settle_call("p", checks, "replica:7", -300)
    assert (settle.keys, settle.args) == (
        ["p:feature:ns/f:tokens", "p:key:k:in_flight"],
        ["replica:7", "-300", "1", "600.0"],
    )
    unchanged = settle_call("p", checks, "replica:7", 0)  # usage unknown: the buckets are left as they are
    assert (unchanged.keys, unchanged.args) == (["p:key:k:in_flight"], ["replica:7", "0", "0"])


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@redis:6379/0", "redis://:***@redis:6379/0"),
        ("rediss://user:pw@redis.example:6380", "rediss://user:***@redis.example:6380"),
        ("redis://user@redis/1", "redis://user@redis/1"),
        ("redis://redis:6379/0", "redis://redis:6379/0"),
        ("redis://[::1]:6379?password=pw", "redis://[::1]:6379?***"),
        ("redis://:pw@[::1]:6379", "redis://:***@[::1]:6379"),
        ("redis://:pw@host:notaport", "<a Redis URL that does not parse>"),
    ],
)
def test_a_redis_url_is_logged_without_its_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redis_settings_from_the_environment_keep_the_url_secret() -> None:
    base = {"SERVLANE_GATEWAY_ROUTES_FILE": "/r.yaml"}
    settings = parse_settings([], base | {"SERVLANE_GATEWAY_REDIS_URL": "redis://:pw@r:6379/0"})
    assert settings.redis_url is not None
    assert settings.redis_url.get_secret_value() == "redis://:pw@r:6379/0"
    assert "pw" not in repr(settings)
    assert "pw" not in str(settings.model_dump())
    assert parse_settings([], base | {"SERVLANE_GATEWAY_REDIS_URL": ""}).redis_url is None  # an empty variable: unset
    with pytest.raises(ValidationError) as bad:
        GatewaySettings(routes_file=Path("/r.yaml"), redis_url="http://:pw@r:6379")
    assert "redis://" in str(bad.value.errors()[0]["msg"])
    assert "pw" not in bad.value.errors()[0]["msg"]
    with pytest.raises(ValidationError) as bad_port:
        GatewaySettings(routes_file=Path("/r.yaml"), redis_url="redis://:pw@r:port")
    assert "does not parse" in bad_port.value.errors()[0]["msg"]
    with pytest.raises(ValidationError):
        GatewaySettings(routes_file=Path("/r.yaml"), redis_key_prefix="has space")
