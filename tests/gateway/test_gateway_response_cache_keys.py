"""The response cache's pure parts: which requests may be cached, their key, the model's answer version,
which answers are kept, and the in-memory store's bounds and TTL (a fake clock, no waiting)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from servlane_api import AIFeature, AIModel
from servlane_api.aifeature import ResponseCache
from servlane_core.routing.model_version import answer_version
from servlane_core.routing.routes import Backend, Route, build_route_table
from servlane_gateway.cache_store import MemoryStore, Stored, redis_keys
from servlane_gateway.response_cache import (
    CacheKey,
    Entry,
    Recorder,
    cache_key,
    json_keepable,
    lookup_key,
    refusal,
    stream_keepable,
)
from tests.gateway.gateway_harness import aifeature, aimodel

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
        {"autoscaling": {"maxReplicas": 4, "metric": {"type": "Pods", "name": "m", "targetAverageValue": "2"}}},
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


def test_memory_store_expires_entries_after_their_ttl() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    policy = ResponseCache(enabled=True, ttl_seconds=10)

    async def run() -> None:
        assert await store.put(k("a"), entry(3), policy) == Stored(True)
        clock.now += 9
        assert await store.get(k("a")) == entry(3)
        clock.now += 1
        assert await store.get(k("a")) is None

    asyncio.run(run())


def test_memory_store_bounds_each_feature_by_entries_and_bytes() -> None:
    store = MemoryStore(Clock())
    by_entries = ResponseCache(enabled=True, max_entries=2)
    by_bytes = ResponseCache(enabled=True, max_bytes=2048)

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
        await store.put(k("same", namespace="team-a"), entry(1), ON)
        assert await store.get(k("same", namespace="team-b")) is None
        assert await store.get(k("same", namespace="team-a")) == entry(1)

    asyncio.run(run())


def test_redis_keys_are_per_namespace_and_feature_in_one_slot() -> None:
    keys = redis_keys("gw", k("d", namespace="team-a", feature="chat"))
    assert keys == ["gw:cache:{team-a/chat}:entries", "gw:cache:{team-a/chat}:sizes", "gw:cache:{team-a/chat}:expiry"]
    assert redis_keys("gw", k("d", namespace="team-b")) != redis_keys("gw", k("d", namespace="team-a"))
