"""The response cache's pure parts: which requests may be cached, their key, the model's answer version,
which answers are kept, and the in-memory store's bounds and TTL (a fake clock, no waiting)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from servlane_api import AIFeature, AIModel
from servlane_api.aifeature import MAX_RESPONSE_CACHE_BYTES, ResponseCache
from servlane_core.routing.model_version import answer_version
from servlane_core.routing.routes import Backend, Route, build_route_table
from servlane_gateway.app import answer_store_for, cache_budget_for, log_cache
from servlane_gateway.cache.redis_store import RedisStore, redis_keys, redis_member
from servlane_gateway.cache.rules import (
    DEFAULT_CACHE_MAX_BYTES,
    Bounds,
    CacheBudget,
    CacheKey,
    Caching,
    Entry,
    Recorder,
    cache_key,
    json_keepable,
    lookup_key,
    redis_database,
    redis_location,
    refusal,
    stream_keepable,
    with_database,
)
from servlane_gateway.cache.store import MemoryStore, ResponseCacher, Stored
from servlane_gateway.gateway_metrics import GatewayMetrics
from servlane_gateway.settings import GatewaySettings
from tests.support.gateway_harness import aifeature, aimodel

ROOT = Path(__file__).resolve().parents[2]

CHAT = "chat/completions"
HI = [{"role": "user", "content": "hi"}]
ON = ResponseCache(enabled=True)


def route(namespace: str = "prod", name: str = "chat", cache: ResponseCache = ON) -> Route:
    return Route(name, namespace, (backend(namespace),), response_cache=cache)


def backend(namespace: str = "prod", model: str = "chat-v1", version: str = "abc") -> Backend:
    return Backend(model, namespace, "http://x", model, True, 100, version)


def key(body: dict[str, Any], **where: Any) -> str:
    return cache_key(body, CHAT, route(), backend(**where)).digest


@pytest.mark.parametrize(
    ("body", "endpoint", "why"),
    [
        ({"temperature": 0}, CHAT, None),
        ({"temperature": 0.0, "n": 1}, CHAT, None),
        ({"temperature": 0.9, "seed": 7}, CHAT, None),
        ({"seed": 7, "n": 3}, "completions", None),
        ({"input": "x"}, "embeddings", None),
        ({}, CHAT, "sampled"),  # the backend's default temperature samples
        ({"temperature": 0.7}, CHAT, "sampled"),
        ({"temperature": 0, "seed": True}, CHAT, None),  # temperature 0 alone suffices
        ({"temperature": 0.5, "seed": True}, CHAT, "sampled"),  # a boolean is no seed
        ({"temperature": "0"}, CHAT, "sampled"),
        ({"temperature": 0, "tools": [{"type": "function"}]}, CHAT, "tools"),
        ({"seed": 1, "functions": [{"name": "f"}]}, CHAT, "tools"),
        ({"temperature": 0, "n": 2}, CHAT, "several samples"),
        ({"temperature": 0, "best_of": 3}, "completions", "several samples"),
        # JSON integers beyond a float's range: looked at as numbers, never converted (that was a 500)
        ({"temperature": 10**400}, CHAT, "sampled"),
        ({"temperature": 1, "seed": 10**400}, CHAT, None),
    ],
)
def test_only_deterministic_requests_are_cacheable(body: dict[str, Any], endpoint: str, why: str | None) -> None:
    assert refusal(body, endpoint) == why


def test_the_key_is_the_canonical_request_without_what_does_not_change_the_answer() -> None:
    body = {"messages": HI, "temperature": 0, "max_tokens": 5}
    reordered = {"max_tokens": 5, "temperature": 0, "messages": HI}
    assert key(body) == key(reordered)
    ignored = {**body, "model": "prod/chat", "user": "u-1", "stream_options": {"include_usage": True}}
    assert key(ignored) == key(body)
    assert key({**body, "stream": False}) == key(body)
    assert key({**body, "stream": True}) != key(body)  # a stream and a JSON answer are kept apart
    assert key({**body, "max_tokens": 6}) != key(body)
    assert key({**body, "messages": [{"role": "user", "content": "hi!"}]}) != key(body)
    # Other stream options change the answer: vLLM's continuous_usage_stats puts usage in every chunk.
    every_chunk = {"include_usage": True, "continuous_usage_stats": True}
    assert key({**body, "stream": True, "stream_options": every_chunk}) != key({**body, "stream": True})
    assert key({**body, "stream_options": {"continuous_usage_stats": False}}) != key(body)


def test_the_key_names_the_answering_model_and_its_version_and_the_namespace() -> None:
    body = {"messages": HI, "temperature": 0}
    assert key(body, version="def") != key(body)
    assert key(body, model="chat-v2") != key(body)
    other_ns = cache_key(body, CHAT, route("dev"), backend("dev"))
    same = cache_key(body, CHAT, route(), backend())
    assert (other_ns.namespace, same.namespace) == ("dev", "prod")
    assert other_ns.digest != same.digest
    assert cache_key(body, CHAT, route(name="other"), backend()).digest != same.digest
    assert cache_key(body, "completions", route(), backend()).digest != same.digest


def test_the_cache_looks_only_at_features_that_opt_in() -> None:
    body = {"messages": HI, "temperature": 0}
    assert lookup_key(body, CHAT, route(), backend()) is not None
    assert lookup_key(body, CHAT, route(cache=ResponseCache()), backend()) is None
    assert lookup_key(body, CHAT, route(), None) is None  # no backend ready
    assert lookup_key(body, CHAT, route(), backend(version="")) is None  # no AIModel behind it
    plain = Route("chat-v1", "prod", (backend(),), is_feature=False, response_cache=ON)
    assert lookup_key(body, CHAT, plain, backend()) is None
    assert lookup_key({**body, "temperature": 1}, CHAT, route(), backend()) is None


def model(**spec: Any) -> AIModel:
    obj = aimodel("chat-v1", "http://chat-v1:8000/v1")
    obj["spec"] |= spec
    return AIModel.model_validate(obj)


def test_the_answer_version_changes_with_what_changes_answers_only() -> None:
    base = answer_version(model().spec)
    assert answer_version(model().spec) == base
    for scaling in (
        {"replicas": 3},
        {"autoscaling": {"maxReplicas": 4, "minReplicas": 0, "targetInFlightPerReplica": 2}},
    ):
        assert answer_version(model(**scaling).spec) == base, scaling
    assert answer_version(model(scheduling={"nodeSelector": {"pool": "b"}}).spec) == base
    assert answer_version(model(source={"uri": "/models/y"}).spec) != base
    assert answer_version(model(engineOptions={"maxModelLen": 2048}).spec) != base
    assert answer_version(model(engine="vllm").spec) != base
    assert answer_version(model(servedModelName="other").spec) != base


def test_the_route_table_carries_versions_and_the_feature_cache() -> None:
    feature = aifeature("chat", [("chat-v1", 100)])
    feature["spec"]["responseCache"] = {"enabled": True, "ttlSeconds": 60}
    table = build_route_table([AIFeature.model_validate(feature)], [model()], ["default"])
    chat = table.lookup("chat")
    assert chat is not None
    assert chat.response_cache == ResponseCache(enabled=True, ttl_seconds=60)
    assert chat.backends[0].version == answer_version(model().spec)
    direct = table.lookup("chat-v1")
    assert direct is not None
    assert not direct.response_cache.enabled
    bare = build_route_table([AIFeature.model_validate(aifeature("chat", [("chat-v1", 100)]))], [model()])
    assert not bare.routes["default/chat"].response_cache.enabled


def test_rebuilt_tables_carry_each_models_current_version() -> None:
    """The builds remember versions by parsed object: a model parsed again (its manifest changed) is digested
    again, one handed over unchanged keeps its version, and a table's feature and model routes agree."""
    feature = AIFeature.model_validate(aifeature("chat", [("chat-v1", 100)]))
    first = model()

    def versions(table: Any) -> tuple[str, str]:
        return table.routes["default/chat"].backends[0].version, table.routes["default/chat-v1"].backends[0].version

    assert versions(build_route_table([feature], [first])) == (answer_version(first.spec),) * 2
    assert versions(build_route_table([feature], [first])) == (answer_version(first.spec),) * 2
    changed = model(engine="vllm")
    assert versions(build_route_table([feature], [changed])) == (answer_version(changed.spec),) * 2
    assert answer_version(changed.spec) != answer_version(first.spec)
    assert versions(build_route_table([feature], [first])) == (answer_version(first.spec),) * 2


def answer(*reasons: str | None) -> bytes:
    choices = [{"index": i, "message": {"content": "x"}, "finish_reason": r} for i, r in enumerate(reasons)]
    return json.dumps({"object": "chat.completion", "choices": choices}).encode()


def sse(*events: dict[str, Any], done: bool = True) -> bytes:
    lines = [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events]
    return b"".join(lines) + (b"data: [DONE]\n\n" if done else b"")


def chunk(finish: str | None, index: int = 0) -> dict[str, Any]:
    return {"choices": [{"index": index, "delta": {"content": "x"}, "finish_reason": finish}]}


def test_only_answers_that_finished_well_are_kept() -> None:
    assert json_keepable(answer("stop"))
    assert json_keepable(answer("length", "stop"))
    assert json_keepable(json.dumps({"object": "list", "data": [{"embedding": [0.1]}]}).encode())
    assert not json_keepable(answer("error"))
    assert not json_keepable(answer("stop", "abort"))
    assert not json_keepable(answer(None))
    assert not json_keepable(answer())
    assert not json_keepable(b'{"error": {"message": "no"}}')
    assert not json_keepable(b"not json")

    usage = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}
    assert stream_keepable(sse(chunk(None), chunk("stop"), usage))
    assert stream_keepable(sse(chunk(None, 0), chunk("stop", 0), chunk("length", 1)))
    assert not stream_keepable(sse(chunk(None), chunk("stop"), done=False))  # cut before its end
    assert not stream_keepable(sse(chunk(None), chunk(None)))  # never said why it ended
    assert not stream_keepable(sse(chunk("stop", 0), chunk(None, 1)))  # one choice unfinished
    assert not stream_keepable(sse(chunk(None), chunk("error")))
    assert not stream_keepable(sse(chunk(None), {"error": {"message": "engine failed"}}))


def test_entries_round_trip_and_foreign_bytes_are_no_entry() -> None:
    entry = Entry(True, "text/event-stream", b"data: x\n\ndata: [DONE]\n\n")
    assert Entry.decode(entry.encode()) == entry
    assert Entry.decode(b"garbage") is None
    assert Entry.decode(b'{"stream": "yes", "content_type": "x"}\nbody') is None


def test_a_recorder_gives_up_past_its_limit() -> None:
    recorder = Recorder(limit=5)
    recorder(b"abc")
    assert recorder.content() == b"abc"
    recorder(b"def")
    recorder(b"g")
    assert recorder.content() is None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def entry(size: int) -> Entry:
    return Entry(False, "application/json", b"x" * size)


def k(digest: str, namespace: str = "prod", feature: str = "chat") -> CacheKey:
    return CacheKey(namespace, feature, digest)


def bounds(policy: ResponseCache) -> Bounds:
    """The feature's bounds under the default budget (far above these tests' sizes)."""
    return CacheBudget().bounds(policy)


def test_memory_store_expires_entries_after_their_ttl() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    policy = bounds(ResponseCache(enabled=True, ttl_seconds=10))

    async def run() -> None:
        assert await store.put(k("a"), entry(3), policy) == Stored(True)
        clock.now += 9
        assert await store.get(k("a")) == entry(3)
        clock.now += 1
        assert await store.get(k("a")) is None

    asyncio.run(run())


def test_memory_store_bounds_each_feature_by_entries_and_bytes() -> None:
    store = MemoryStore(Clock())
    by_entries = bounds(ResponseCache(enabled=True, max_entries=2))
    by_bytes = bounds(ResponseCache(enabled=True, max_bytes=2048))

    async def run() -> None:
        await store.put(k("a"), entry(10), by_entries)
        await store.put(k("b"), entry(10), by_entries)
        assert await store.put(k("c"), entry(10), by_entries) == Stored(True, evicted=1)
        assert await store.get(k("a")) is None  # the oldest went first
        assert await store.get(k("c")) is not None
        assert await store.put(k("c"), entry(10), by_entries) == Stored(True)  # a replacement evicts nothing

        await store.put(k("a", feature="big"), entry(1000), by_bytes)
        await store.put(k("b", feature="big"), entry(1000), by_bytes)
        assert await store.put(k("c", feature="big"), entry(1000), by_bytes) == Stored(True, evicted=1)
        assert await store.put(k("d", feature="big"), entry(4096), by_bytes) == Stored(False)  # never fits
        assert await store.get(k("b")) is not None  # the other feature's bounds are its own

    asyncio.run(run())


def test_memory_store_keeps_namespaces_apart() -> None:
    store = MemoryStore(Clock())

    async def run() -> None:
        await store.put(k("same", namespace="team-a"), entry(1), bounds(ON))
        assert await store.get(k("same", namespace="team-b")) is None
        assert await store.get(k("same", namespace="team-a")) == entry(1)

    asyncio.run(run())


def test_redis_members_and_age_sets_carry_the_namespace() -> None:
    keys = redis_keys("gw", k("d", namespace="team-a", feature="chat"))
    assert keys == [
        "gw:cache:entries",
        "gw:cache:sizes",
        "gw:cache:expiry",
        "gw:cache:age:team-a",
        "gw:cache:age:team-a/chat",
    ]
    assert redis_member(k("d", namespace="team-a")) == "team-a/chat/d"
    assert redis_member(k("d", namespace="team-b")) != redis_member(k("d", namespace="team-a"))


# --- the admin's budget: what no feature can raise, and what one namespace can do to another -------------

SMALL = CacheBudget(max_bytes=4000, namespace_max_bytes=2000, max_entry_bytes=1000)
GREEDY = ResponseCache(enabled=True, max_bytes=MAX_RESPONSE_CACHE_BYTES, max_entries=1_000_000)


def test_the_admins_budget_clamps_every_features_bounds() -> None:
    budget = CacheBudget(max_bytes=1 << 20, max_entry_bytes=64 << 10)
    big = budget.bounds(GREEDY)
    assert big.namespace_bytes == (1 << 20) // 4  # the default share: a quarter of the cap
    assert big.feature_bytes == big.namespace_bytes  # no feature holds more than its namespace's share
    assert (big.total_bytes, big.entry_bytes) == (1 << 20, 64 << 10)
    small = budget.bounds(ResponseCache(enabled=True, max_bytes=4096))
    assert (small.feature_bytes, small.entry_bytes) == (4096, 4096)  # the feature's own when lower
    assert CacheBudget(max_bytes=1000, namespace_max_bytes=5000).namespace_share == 1000  # never above the cap
    nothing = CacheBudget(max_bytes=0).bounds(ON)
    assert not nothing.fits(entry(1))
    assert CacheBudget().max_bytes == DEFAULT_CACHE_MAX_BYTES == 256 << 20


def test_memory_store_a_namespace_beyond_its_share_evicts_only_its_own() -> None:
    store = MemoryStore(Clock())
    bounds = SMALL.bounds(GREEDY)

    async def run() -> None:
        assert await store.put(k("a", namespace="team-a"), entry(900), bounds) == Stored(True)
        b_keys = [k(f"b{i}", namespace="team-b", feature=f"f{i % 2}") for i in range(10)]
        results = [await store.put(key, entry(900), bounds) for key in b_keys]  # five times its share
        assert all(r.kept for r in results)
        assert sum(r.evicted for r in results) == 8  # its own, across its two features
        assert [await store.get(key) is not None for key in b_keys] == [False] * 8 + [True] * 2
        assert store.namespace_bytes("team-b") == 1800
        assert await store.get(k("a", namespace="team-a")) == entry(900)  # untouched
        assert await store.put(k("big", namespace="team-b"), entry(1001), bounds) == Stored(False)  # one answer's bound

    asyncio.run(run())


def test_memory_store_refuses_past_the_cap_rather_than_evict_another_namespace() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    bounds = SMALL.bounds(GREEDY)  # the TTL: 300 s
    held = [k(d, namespace=ns) for ns in ("team-a", "team-b") for d in ("1", "2")]

    async def run() -> None:
        for key in held:
            assert (await store.put(key, entry(900), bounds)).kept
        assert await store.put(k("1", namespace="team-c"), entry(900), bounds) == Stored(False)
        assert [await store.get(key) is not None for key in held] == [True] * 4
        assert store.total == 3600
        clock.now += 300  # theirs expire: idle namespaces free the cap without another store of theirs
        assert await store.put(k("1", namespace="team-c"), entry(900), bounds) == Stored(True)
        assert store.total == 900

    asyncio.run(run())


def test_memory_store_at_the_cap_a_namespace_makes_room_from_its_own_answers() -> None:
    store = MemoryStore(Clock())
    bounds = SMALL.bounds(GREEDY)
    others = [k("1", namespace="team-b"), k("2", namespace="team-b"), k("1", namespace="team-c")]

    async def run() -> None:
        await store.put(k("1", namespace="team-a"), entry(900), bounds)
        for key in others:
            await store.put(key, entry(900), bounds)
        # 4500 bytes would pass the cap, though team-a is within its share: its own oldest goes, no other's.
        assert await store.put(k("2", namespace="team-a"), entry(900), bounds) == Stored(True, evicted=1)
        assert await store.get(k("1", namespace="team-a")) is None
        assert [await store.get(key) is not None for key in others] == [True] * 3
        assert store.total == 3600

    asyncio.run(run())


def test_a_stream_is_recorded_only_up_to_the_admins_bound_on_one_answer() -> None:
    cacher = ResponseCacher(MemoryStore(Clock()), GatewayMetrics(), CacheBudget(max_entry_bytes=2048))
    recorder = cacher.record(Caching(k("s"), GREEDY))  # the feature alone would hold 256 MiB in memory
    assert recorder.limit == 2048


def test_an_aifeature_stored_under_the_old_maximum_still_routes() -> None:
    old = aifeature("chat", [("chat-v1", 100)])
    old["spec"]["responseCache"] = {"enabled": True, "maxBytes": 1 << 32}  # the maximum was 4 GiB
    assert AIFeature.model_validate(old).spec.response_cache.max_bytes == MAX_RESPONSE_CACHE_BYTES
    crd = yaml.safe_load((ROOT / "crds" / "aifeatures.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["responseCache"]["properties"]["maxBytes"]["maximum"] == 256 << 20


def test_the_caches_database_is_set_in_the_url_its_password_kept() -> None:
    assert [redis_database(u) for u in ("redis://:pw@r:6379/3", "redis://r", "unix:///s.sock?db=2")] == [3, 0, 2]
    assert with_database("redis://:p%40w@r:6379/0", 1) == "redis://:p%40w@r:6379/1"
    assert with_database("rediss://u:pw@r", 4) == "rediss://u:pw@r/4"
    assert redis_database(with_database("unix:///s.sock?db=2&x=1", 5)) == 5
    assert redis_location("redis://:a@r:1/0") == redis_location("redis://:b@r:1")  # the password is no place
    with pytest.raises(ValueError, match="not a number"):
        redis_database("redis://r/zero")


def test_the_cache_never_shares_the_rate_limits_database(tmp_path: Path) -> None:
    routes = {"routes_file": tmp_path / "routes.yaml"}
    assert GatewaySettings(**routes, redis_url="redis://:pw@r:6379/2").cache_redis == "redis://:pw@r:6379/3"
    assert GatewaySettings(**routes).cache_redis is None  # memory
    own = GatewaySettings(**routes, redis_url="redis://:pw@r:6379/0", cache_redis_url="redis://c:6379/0")
    assert own.cache_redis == "redis://c:6379/0"
    for same in ({"cache_redis_database": 2}, {"cache_redis_url": "redis://r:6379/2"}):
        with pytest.raises(ValidationError) as refused:
            GatewaySettings(**routes, redis_url="redis://:pw@r:6379/2", **same)
        message = refused.value.errors()[0]["msg"]
        assert "the rate limits' own" in message
        assert "pw" not in message


def test_a_cache_redis_of_its_own_never_gets_the_limits_password(tmp_path: Path) -> None:
    routes = {"routes_file": tmp_path / "routes.yaml", "redis_url": "redis://r:6379/0", "redis_password": "limits"}
    shared = answer_store_for(GatewaySettings(**routes))
    own = answer_store_for(GatewaySettings(**routes, cache_redis_url="redis://c:6379/0"))
    assert isinstance(shared, RedisStore)
    assert isinstance(own, RedisStore)
    assert (shared._password, own._password) == ("limits", None)


def test_the_start_log_says_where_answers_live_and_within_what(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = GatewaySettings(
        routes_file=tmp_path / "routes.yaml", redis_url="redis://:secret@r:6379/0", cache_max_bytes=1 << 20
    )
    cacher = ResponseCacher(answer_store_for(settings), GatewayMetrics(), cache_budget_for(settings))
    with caplog.at_level(logging.INFO, logger="servlane_gateway.app"):
        log_cache(cacher)
    assert "at most 1048576 bytes of answers in Redis at redis://:***@r:6379/1: 262144 per namespace" in caplog.text
    assert "secret" not in caplog.text


def test_memory_store_keeps_no_more_expiry_records_than_its_answers_need() -> None:
    store = MemoryStore(Clock())
    bounds = SMALL.bounds(ResponseCache(enabled=True, max_entries=2, ttl_seconds=86_400))

    async def run() -> None:
        for i in range(5000):  # each evicts an older one, whose expiry is a day away
            await store.put(k(str(i)), entry(10), bounds)

    asyncio.run(run())
    assert len(store._kept) == 2
    assert len(store._expiry) <= 2 * 2 + 1024 + 1
