"""The response cache through the real gateway (uvicorn, loopback) in front of the fake upstreams: an
identical deterministic request is answered again without the backend; sampled requests never are; a
rollout or a spec change is never answered with the previous version's answer; streams replay as streams;
namespaces never share; entries expire (a fake clock); a Redis shares the cache between two gateways, and
a Redis that does not answer means no caching, never a failed request."""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from servlane_api import metric_names as m
from servlane_api.aifeature import MAX_RESPONSE_CACHE_BYTES, ResponseCache
from servlane_gateway.cache.redis_store import RedisStore
from servlane_gateway.cache.rules import CACHE_HEADER, CacheBudget, CacheKey, Entry
from servlane_gateway.cache.store import MemoryStore, Stored
from servlane_gateway.gateway_metrics import CACHE_COALESCED, CACHE_EVICTIONS, CACHE_HITS, CACHE_MISSES, CACHE_STORES
from tests.support.gateway_harness import Gateway, StartGateway, Upstream, aifeature, aimodel, route_in
from tests.support.polling import wait_until
from tests.support.ports import free_port
from tests.support.shared_limits import PASSWORD, RedisServer

CHAT = "/v1/chat/completions"


def cached_feature(
    name: str = "chat", model: str = "chat-v1", namespace: str = "default", **cache: Any
) -> dict[str, Any]:
    feature = aifeature(name, [(model, 100)], namespace=namespace)
    feature["spec"]["responseCache"] = {"enabled": True, **cache}
    return feature


def model_in(namespace: str, name: str, url: str) -> dict[str, Any]:
    obj = aimodel(name, url)
    obj["metadata"]["namespace"] = namespace
    return obj


def objects(upstreams: dict[str, Upstream], **cache: Any) -> list[dict[str, Any]]:
    return [
        aimodel("chat-v1", upstreams["v1"].url),
        aimodel("chat-v2", upstreams["v2"].url),
        cached_feature(**cache),
        aifeature("plain", [("chat-v1", 100)]),  # not opted in
    ]


def ask(gw: Gateway, text: str | None = None, model: str = "chat", **fields: Any) -> httpx.Response:
    """A chat request; its text is unique to the test unless given, so no other test's entry answers it."""
    body = {"model": model, "messages": [{"role": "user", "content": text or unique()}], **fields}
    return httpx.post(gw.url + CHAT, json=body, timeout=10)


def unique() -> str:
    return f"q-{uuid.uuid4().hex[:8]}"


def calls(upstream: Upstream) -> int:
    return len(upstream.state.bodies)


def stored(gw: Gateway, count: int, feature: str = "chat") -> None:
    """Answers are kept in the background once sent: wait for the count of stores."""
    wait_until(f"{count} answers kept", lambda: gw.sample(CACHE_STORES, feature=feature) >= count, 10)


def test_a_repeated_deterministic_request_is_answered_from_the_cache(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    gw = start_gateway(objects(upstreams))
    assert gw.state.cache is not None
    assert isinstance(gw.state.cache.store, MemoryStore)
    text, before = unique(), calls(upstreams["v1"])
    first = ask(gw, text, temperature=0, user="alice")
    assert first.status_code == 200, first.text
    assert first.headers[CACHE_HEADER] == "miss"
    stored(gw, 1)
    second = ask(gw, text, temperature=0)
    assert second.status_code == 200
    assert second.headers[CACHE_HEADER] == "hit"
    assert second.content == first.content  # the very answer, byte for byte
    assert calls(upstreams["v1"]) == before + 1  # the backend answered once
    assert gw.sample(CACHE_HITS, feature="chat") == 1
    assert gw.sample(CACHE_MISSES, feature="chat") == 1
    # A hit is a request of the feature, but of no model: the canary analysis reads only the backends'.
    assert gw.sample(m.REQUESTS, feature="chat", model="", code="200") == 1
    assert gw.sample(m.REQUESTS, feature="chat", model="chat-v1", code="200") == 1
    third = ask(gw, text, seed=5, temperature=0.8)  # another request: its own entry
    assert third.headers[CACHE_HEADER] == "miss"
    assert calls(upstreams["v1"]) == before + 2


def test_the_user_field_does_not_split_the_cache_but_the_request_id_is_the_callers(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    gw = start_gateway(objects(upstreams))
    text = unique()
    ask(gw, text, temperature=0, user="alice")
    stored(gw, 1)
    body = {"model": "chat", "messages": [{"role": "user", "content": text}], "temperature": 0, "user": "bob"}
    again = httpx.post(gw.url + CHAT, json=body, headers={"x-request-id": "mine"}, timeout=10)
    assert again.headers[CACHE_HEADER] == "hit"
    assert again.headers["x-request-id"] == "mine"


def test_sampled_requests_and_features_that_did_not_opt_in_are_never_cached(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    gw = start_gateway(objects(upstreams))
    text, before = unique(), calls(upstreams["v1"])
    # A temperature beyond a float's range is a sampled request like any other (the backend refuses it), not a 500.
    sampled: list[dict[str, Any]] = [{"temperature": 0.7}, {}, {"temperature": 10**400}, {"temperature": 0, "n": 2}]
    for fields in (*sampled, {"temperature": 0, "tools": TOOLS}):
        for _ in range(2):
            answer = ask(gw, text, **fields)
            assert answer.status_code == 200, answer.text
            assert CACHE_HEADER not in answer.headers
    for _ in range(2):
        assert CACHE_HEADER not in ask(gw, text, model="plain", temperature=0).headers
    assert calls(upstreams["v1"]) == before + 12
    assert gw.sample(CACHE_STORES, feature="chat") == 0
    assert gw.sample(CACHE_MISSES, feature="chat") == 0


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def test_the_features_default_temperature_makes_requests_deterministic(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    feature = cached_feature()
    feature["spec"]["defaults"] = {"temperature": 0}
    gw = start_gateway([aimodel("chat-v1", upstreams["v1"].url), feature])
    text = unique()
    assert ask(gw, text).headers[CACHE_HEADER] == "miss"
    stored(gw, 1)
    assert ask(gw, text).headers[CACHE_HEADER] == "hit"


def test_failed_answers_are_not_kept(upstreams: dict[str, Upstream], start_gateway: StartGateway) -> None:
    gw = start_gateway(objects(upstreams))
    before = calls(upstreams["v1"])
    for _ in range(2):
        assert ask(gw, "status=500", temperature=0).status_code == 500
        streamed = ask(gw, f"fail=1 {unique()}", temperature=0, stream=True)
        assert streamed.status_code == 200
        assert b"engine failed" in streamed.content
    failing = "fail=1 same"
    for _ in range(2):
        assert b"engine failed" in ask(gw, failing, temperature=0, stream=True).content
    assert calls(upstreams["v1"]) == before + 6
    assert gw.sample(CACHE_STORES, feature="chat") == 0


def test_a_rollout_to_another_model_is_answered_by_the_new_model(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    gw = start_gateway(objects(upstreams))
    text = unique()
    assert ask(gw, text, temperature=0).json()["choices"][0]["message"]["content"] == "v1"
    stored(gw, 1)
    assert ask(gw, text, temperature=0).headers[CACHE_HEADER] == "hit"
    rolled = objects(upstreams)
    rolled[2] = cached_feature(model="chat-v2")  # the canary took all the traffic
    gw.write_routes(rolled)
    wait_until("the rollout", lambda: route_in(gw.state.table, "chat").backends[0].model == "chat-v2", 10)
    after = ask(gw, text, temperature=0)
    assert after.headers[CACHE_HEADER] == "miss"
    assert after.json()["choices"][0]["message"]["content"] == "v2"


def test_a_spec_change_of_the_routed_model_is_a_new_version(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    gw = start_gateway(objects(upstreams))
    text, before = unique(), calls(upstreams["v1"])
    ask(gw, text, temperature=0)
    stored(gw, 1)
    version = route_in(gw.state.table, "chat").backends[0].version
    scaled = objects(upstreams)
    scaled[0]["spec"]["replicas"] = 3  # scaling is not a new version: the cache stays
    table = gw.state.table
    gw.write_routes(scaled)
    wait_until("the reload", lambda: gw.state.table is not table, 10)
    assert route_in(gw.state.table, "chat").backends[0].version == version
    assert ask(gw, text, temperature=0).headers[CACHE_HEADER] == "hit"
    changed = copy.deepcopy(scaled)
    changed[0]["spec"]["engineOptions"] = {"maxModelLen": 1024}
    gw.write_routes(changed)
    wait_until("the new version", lambda: route_in(gw.state.table, "chat").backends[0].version != version, 10)
    after = ask(gw, text, temperature=0)
    assert after.headers[CACHE_HEADER] == "miss"
    assert calls(upstreams["v1"]) == before + 2


def test_a_stream_is_replayed_as_the_same_stream(upstreams: dict[str, Upstream], start_gateway: StartGateway) -> None:
    gw = start_gateway(objects(upstreams))
    text, before = f"chunks=4 {unique()}", calls(upstreams["v1"])
    first = ask(gw, text, temperature=0, stream=True)
    assert first.headers[CACHE_HEADER] == "miss"
    assert first.headers["content-type"].startswith("text/event-stream")
    assert first.content.count(b"data: ") == 5
    assert b'"usage"' not in first.content
    stored(gw, 1)
    second = ask(gw, text, temperature=0, stream=True)
    assert second.headers[CACHE_HEADER] == "hit"
    assert second.headers["content-type"] == first.headers["content-type"]
    assert second.content == first.content
    # The same stream asked with its usage: the kept stream has the usage chunk the gateway asked for.
    with_usage = ask(gw, text, temperature=0, stream=True, stream_options={"include_usage": True})
    assert with_usage.headers[CACHE_HEADER] == "hit"
    assert with_usage.content != first.content
    assert without_usage(with_usage.content) == first.content
    # The JSON answer is another entry: a stream is never turned into one, nor the other way round.
    assert ask(gw, text, temperature=0).headers[CACHE_HEADER] == "miss"
    assert calls(upstreams["v1"]) == before + 2


def without_usage(stream: bytes) -> bytes:
    events = [e + b"\n\n" for e in stream.split(b"\n\n") if e]
    usage = [e for e in events if b'"usage": {"prompt_tokens"' in e]
    assert len(usage) == 1
    return b"".join(e for e in events if e not in usage)


def test_namespaces_never_share_answers(upstreams: dict[str, Upstream], start_gateway: StartGateway) -> None:
    gw = start_gateway(
        [
            model_in("team-a", "chat-v1", upstreams["v1"].url),
            model_in("team-b", "chat-v1", upstreams["v1"].url),
            cached_feature(namespace="team-a"),
            cached_feature(namespace="team-b"),
        ]
    )
    text, before = unique(), calls(upstreams["v1"])
    assert ask(gw, text, model="team-a/chat", temperature=0).headers[CACHE_HEADER] == "miss"
    stored(gw, 1)
    assert ask(gw, text, model="team-b/chat", temperature=0).headers[CACHE_HEADER] == "miss"
    assert ask(gw, text, model="team-a/chat", temperature=0).headers[CACHE_HEADER] == "hit"
    assert calls(upstreams["v1"]) == before + 2
    assert gw.sample(CACHE_HITS, namespace="team-a", feature="chat") == 1
    assert gw.sample(CACHE_HITS, namespace="team-b", feature="chat") == 0


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


def test_answers_expire_after_the_features_ttl(upstreams: dict[str, Upstream], start_gateway: StartGateway) -> None:
    gw = start_gateway(objects(upstreams, ttlSeconds=30))
    assert gw.state.cache is not None
    assert isinstance(gw.state.cache.store, MemoryStore)
    clock = gw.state.cache.store.clock = Clock()
    text = unique()
    ask(gw, text, temperature=0)
    stored(gw, 1)
    clock.now += 29
    assert ask(gw, text, temperature=0).headers[CACHE_HEADER] == "hit"
    clock.now += 1
    assert ask(gw, text, temperature=0).headers[CACHE_HEADER] == "miss"


def test_the_oldest_answers_are_evicted_beyond_max_entries(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    gw = start_gateway(objects(upstreams, maxEntries=2))
    texts = [unique() for _ in range(3)]
    for i, text in enumerate(texts, start=1):
        ask(gw, text, temperature=0)
        stored(gw, i)
    assert gw.sample(CACHE_EVICTIONS, feature="chat") == 1
    assert [ask(gw, text, temperature=0).headers[CACHE_HEADER] for text in texts[::-1]] == ["hit", "hit", "miss"]


# --- shared through Redis -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis-cache")).start()
    yield server
    server.stop()


def test_two_gateways_share_answers_through_redis(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, redis_server: RedisServer, tmp_path: Path
) -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    a = start_gateway(objects(upstreams), redis_url=redis_server.url, redis_key_prefix=prefix)
    bare = f"redis://127.0.0.1:{redis_server.port}/0"
    b = start_gateway(objects(upstreams), redis_url=bare, redis_password=PASSWORD, redis_key_prefix=prefix)
    assert a.state.cache is not None
    assert isinstance(a.state.cache.store, RedisStore)
    text, before = f"chunks=2 {unique()}", calls(upstreams["v1"])
    first = ask(a, text, temperature=0)
    assert first.headers[CACHE_HEADER] == "miss"
    stored(a, 1)
    second = ask(b, text, temperature=0)
    assert second.headers[CACHE_HEADER] == "hit"
    assert second.content == first.content
    streamed = ask(b, text, temperature=0, stream=True)
    assert streamed.headers[CACHE_HEADER] == "miss"
    stored(b, 1)
    replayed = ask(a, text, temperature=0, stream=True)
    assert replayed.headers[CACHE_HEADER] == "hit"
    assert replayed.content == streamed.content
    assert calls(upstreams["v1"]) == before + 2


def test_redis_bounds_each_feature_by_entries(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, redis_server: RedisServer
) -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    gw = start_gateway(objects(upstreams, maxEntries=2), redis_url=redis_server.url, redis_key_prefix=prefix)
    texts = [unique() for _ in range(3)]
    for i, text in enumerate(texts, start=1):
        ask(gw, text, temperature=0)
        stored(gw, i)
    assert gw.sample(CACHE_EVICTIONS, feature="chat") == 1
    assert [ask(gw, text, temperature=0).headers[CACHE_HEADER] for text in texts[::-1]] == ["hit", "hit", "miss"]


def stored_in(gw: Gateway, namespace: str, count: int) -> None:
    def kept() -> bool:
        return gw.sample(CACHE_STORES, namespace=namespace, feature="chat") >= count

    wait_until(f"{count} answers of {namespace} kept", kept, 10)


def redis_db(server: RedisServer, database: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=server.port, password=PASSWORD, db=database, socket_timeout=2)


def test_a_namespace_beyond_its_share_in_redis_evicts_neither_anothers_answers_nor_the_limits(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, redis_server: RedisServer
) -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    gw = start_gateway(
        [
            model_in("team-a", "chat-v1", upstreams["v1"].url),
            model_in("team-b", "chat-v1", upstreams["v1"].url),
            cached_feature(namespace="team-a"),
            cached_feature(namespace="team-b", maxBytes=MAX_RESPONSE_CACHE_BYTES),  # asks for the most
        ],
        redis_url=redis_server.url,  # the limits in database 0, so the cache in 1
        redis_key_prefix=prefix,
        feature_requests_per_minute=10_000,  # limit buckets in the same Redis
        cache_max_bytes=64 << 10,
        cache_namespace_max_bytes=4 << 10,  # a dozen answers or so of the fake upstream
    )
    limits, cache = redis_db(redis_server, 0), redis_db(redis_server, 1)
    try:
        text_a = unique()
        ask(gw, text_a, model="team-a/chat", temperature=0)
        stored_in(gw, "team-a", 1)
        limit_keys = set(limits.scan_iter(f"{prefix}:*"))
        assert limit_keys  # the buckets of team-a's request
        texts_b = [unique() for _ in range(40)]
        for i, text in enumerate(texts_b, start=1):
            assert ask(gw, text, model="team-b/chat", temperature=0).status_code == 200
            stored_in(gw, "team-b", i)
        assert gw.sample(CACHE_EVICTIONS, namespace="team-b", feature="chat") > 0  # its own answers went
        assert gw.sample(CACHE_EVICTIONS, namespace="team-a", feature="chat") == 0
        assert ask(gw, text_a, model="team-a/chat", temperature=0).headers[CACHE_HEADER] == "hit"
        assert ask(gw, texts_b[0], model="team-b/chat", temperature=0).headers[CACHE_HEADER] == "miss"
        sums = cache.hgetall(f"{prefix}:cache:sizes")
        assert 0 < int(sums[b"#ns:team-b"]) <= 4 << 10  # its share, whatever it asked for
        assert limit_keys <= set(limits.scan_iter(f"{prefix}:*"))  # no bucket evicted
        assert not any(b":cache:" in key for key in limits.scan_iter(f"{prefix}:*"))  # answers in their own database
        assert int(redis_server_info(limits)["evicted_keys"]) == 0  # Redis' eviction never needed
    finally:
        limits.close()
        cache.close()


def redis_server_info(client: redis.Redis) -> dict[str, Any]:
    return dict(client.info("stats"))


def test_redis_refuses_past_the_cap_rather_than_evict_another_namespace(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, prefix=f"test-{uuid.uuid4().hex[:8]}")
    bounds = CacheBudget(max_bytes=4000, namespace_max_bytes=2000, max_entry_bytes=1000).bounds(
        ResponseCache(enabled=True, max_bytes=MAX_RESPONSE_CACHE_BYTES, max_entries=1000)
    )
    body = Entry(False, "application/json", b"x" * 800)  # 800 bytes and its header line: under 900 stored
    held = [CacheKey(ns, "chat", d) for ns in ("team-a", "team-b") for d in ("1", "2")]

    async def run() -> None:
        await store.start()
        try:
            for key in held:
                assert (await store.put(key, body, bounds)).kept
            assert await store.put(CacheKey("team-c", "chat", "1"), body, bounds) == Stored(False)
            assert [await store.get(key) for key in held] == [body] * 4
            assert await store.get(CacheKey("team-b", "chat", "1")) == body
            assert await store.get(CacheKey("team-c", "chat", "1")) is None  # nor does team-c read others' digests
            assert await store.get(CacheKey("team-c", "other", "2")) is None
            three = [CacheKey("team-a", f"feature-{d}", d) for d in ("3", "4", "5")]
            results = [await store.put(key, body, bounds) for key in three]  # beyond its share, in other features
            assert all(r.kept for r in results)
            assert sum(r.evicted for r in results) == 3  # its own only
            assert [await store.get(key) for key in held[2:]] == [body] * 2
        finally:
            await store.aclose()

    asyncio.run(run())


def test_redis_a_namespace_beyond_its_share_evicts_only_its_own_across_its_features(
    redis_server: RedisServer,
) -> None:
    store = RedisStore(redis_server.url, prefix=f"test-{uuid.uuid4().hex[:8]}")
    roomy = CacheBudget(max_bytes=1 << 20, namespace_max_bytes=2000, max_entry_bytes=1000)  # the cap far off
    bounds = roomy.bounds(ResponseCache(enabled=True, max_bytes=MAX_RESPONSE_CACHE_BYTES))
    body = Entry(False, "application/json", b"x" * 800)
    team_a = CacheKey("team-a", "chat", "1")
    team_b = [CacheKey("team-b", f"feature-{i}", str(i)) for i in range(6)]  # each feature under its bound

    async def run() -> None:
        await store.start()
        try:
            assert (await store.put(team_a, body, bounds)).kept
            results = [await store.put(key, body, bounds) for key in team_b]
            assert all(r.kept for r in results)
            assert sum(r.evicted for r in results) == 4  # two of ~850 bytes fit in its 2000
            assert [await store.get(key) is not None for key in team_b] == [False] * 4 + [True] * 2
            assert await store.get(team_a) == body
        finally:
            await store.aclose()

    asyncio.run(run())


def test_redis_expired_answers_of_idle_namespaces_free_the_cap(redis_server: RedisServer) -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    store = RedisStore(redis_server.url, prefix=prefix)
    budget = CacheBudget(max_bytes=4000, namespace_max_bytes=2000, max_entry_bytes=1000)
    short = budget.bounds(ResponseCache(enabled=True, ttl_seconds=1))
    body = Entry(False, "application/json", b"x" * 800)
    client = redis_db(redis_server, 0)

    async def run() -> None:
        await store.start()
        try:
            held = [CacheKey(ns, "chat", d) for ns in ("team-a", "team-b") for d in ("1", "2")]
            for key in held:
                assert (await store.put(key, body, short)).kept
            assert not (await store.put(CacheKey("team-c", "chat", "1"), body, short)).kept  # the cap is full
            await until_expired(store, held[-1])  # team-b's last answer, the latest to expire
            # team-c's store drops everyone's expired answers: the cap is free although a and b stay idle.
            assert (await store.put(CacheKey("team-c", "chat", "1"), body, short)).kept
            sums = client.hgetall(f"{prefix}:cache:sizes")
            assert (b"#ns:team-a" in sums, int(sums[b"#total"])) == (False, int(sums[b"#ns:team-c"]))
        finally:
            await store.aclose()

    try:
        asyncio.run(run())
    finally:
        client.close()


async def until_expired(store: RedisStore, key: CacheKey) -> None:
    deadline = asyncio.get_running_loop().time() + 10
    while await store.get(key) is not None:
        assert asyncio.get_running_loop().time() < deadline, "the answer never expired"
        await asyncio.sleep(0.05)


def test_redis_answers_dropped_by_another_namespaces_store_leave_no_members_behind(
    redis_server: RedisServer,
) -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    store = RedisStore(redis_server.url, prefix=prefix)
    short, long = (CacheBudget().bounds(ResponseCache(enabled=True, ttl_seconds=ttl)) for ttl in (1, 300))
    body = Entry(False, "application/json", b"x" * 100)
    client = redis_db(redis_server, 0)
    age = f"{prefix}:cache:age:team-a"

    async def run() -> None:
        await store.start()
        try:
            await store.put(CacheKey("team-a", "chat", "1"), body, short)
            await store.put(CacheKey("team-a", "other", "2"), body, long)  # keeps team-a's age set alive
            await until_expired(store, CacheKey("team-a", "chat", "1"))
            await store.put(CacheKey("team-b", "chat", "1"), body, long)  # drops team-a's expired answer
            assert client.zcard(age) == 2  # its member stays until team-a's next store
            await store.put(CacheKey("team-a", "chat", "3"), body, long)
            assert client.zrange(age, 0, -1) == [b"team-a/other/2", b"team-a/chat/3"]
        finally:
            await store.aclose()

    try:
        asyncio.run(run())
    finally:
        client.close()


def test_a_redis_that_does_not_answer_means_no_caching_not_failures(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path
) -> None:
    server = RedisServer(tmp_path).start()
    try:  # stopped whatever happens: the process outlived the test run before
        gw = start_gateway(objects(upstreams), redis_url=server.url, redis_key_prefix="down")
        assert gw.state.cache is not None
        assert isinstance(gw.state.cache.store, RedisStore)
        gw.state.cache.store.pause = 0  # ask again at every request, so that the return is seen at once
        text, before = unique(), calls(upstreams["v1"])
        server.stop()
        for _ in range(2):
            for stream in (False, True):
                answer = ask(gw, text, temperature=0, stream=stream)
                assert answer.status_code == 200, answer.text
                assert answer.headers[CACHE_HEADER] == "miss"
        assert calls(upstreams["v1"]) == before + 4
        assert gw.sample(CACHE_STORES, feature="chat") == 0
        server.start()
        ask(gw, text, temperature=0)
        stored(gw, 1)
        assert ask(gw, text, temperature=0).headers[CACHE_HEADER] == "hit"
    finally:
        server.stop()


def test_a_redis_that_never_answered_still_serves_every_request(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    gw = start_gateway(objects(upstreams), redis_url=f"redis://127.0.0.1:{free_port()}/0")
    for _ in range(2):
        answer = ask(gw, "same question", temperature=0)
        assert answer.status_code == 200, answer.text
        assert answer.headers[CACHE_HEADER] == "miss"


def leader_then_followers(gw: Gateway, upstream: Upstream, text: str, followers: int) -> list[httpx.Response]:
    """One request sent and seen at the backend, then `followers` identical ones while it is there; the
    answers, the first request's first."""
    before = calls(upstream)
    with ThreadPoolExecutor(max_workers=followers + 1) as pool:
        first = pool.submit(ask, gw, text, temperature=0)
        wait_until("the first request at the backend", lambda: calls(upstream) == before + 1, 5)
        rest = [pool.submit(ask, gw, text, temperature=0) for _ in range(followers)]
        return [first.result(), *(f.result() for f in rest)]


def test_identical_requests_in_flight_wait_for_the_first_answer_instead_of_the_backend(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    gw = start_gateway(objects(upstreams))
    text, before = f"{unique()} delay=0.5", calls(upstreams["v1"])
    answers = leader_then_followers(gw, upstreams["v1"], text, followers=4)
    assert [a.status_code for a in answers] == [200] * 5
    assert [a.headers[CACHE_HEADER] for a in answers] == ["miss"] + ["coalesced"] * 4
    assert all(a.content == answers[0].content for a in answers)
    assert calls(upstreams["v1"]) == before + 1  # the backend answered once for all five
    assert gw.sample(CACHE_COALESCED, feature="chat") == 4


def test_followers_of_a_failed_or_streamed_request_ask_the_backend_themselves(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    gw = start_gateway(objects(upstreams))
    text, before = f"{unique()} delay=0.5 status=500", calls(upstreams["v1"])
    answers = leader_then_followers(gw, upstreams["v1"], text, followers=2)
    assert [a.status_code for a in answers] == [500] * 3  # nobody was handed a failure as an answer
    assert calls(upstreams["v1"]) == before + 3
    streamed = f"{unique()} delay=0.3 chunks=2"
    before = calls(upstreams["v1"])
    with ThreadPoolExecutor(max_workers=3) as pool:
        streams = list(pool.map(lambda _: ask(gw, streamed, temperature=0, stream=True), range(3)))
    assert all(s.status_code == 200 for s in streams)
    assert calls(upstreams["v1"]) - before >= 2  # streams are relayed live, never held for another's answer
    assert gw.sample(CACHE_COALESCED, feature="chat") == 0
