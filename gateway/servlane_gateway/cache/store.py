"""Where the response cache keeps answers: this replica's memory, or a Redis shared by the replicas.

Both keep each feature's answers under that feature's bounds (`spec.responseCache`): at most
`maxEntries` answers and `maxBytes` bytes, the oldest dropped first, each served for `ttlSeconds`; and
under the admin's (`cache.rules.CacheBudget`), which no feature raises: a share per namespace, a cap on
all, a size per answer. Eviction never crosses namespaces: an answer stored evicts only older answers of
its own namespace, and is refused when the cap is full of others' (they leave as they expire).

Redis (`--cache-redis-url`, else the rate limits' `--redis-url` at another database,
`--cache-redis-database`): the gateway's answers are five kinds of keys under its key prefix (see `PUT`).
A store is one script, atomic across replicas: it drops expired answers, adds the new one and evicts the
namespace's oldest beyond the bounds. A lookup is one script that serves an answer only before it
expires. The cache keeps its own byte budget, so it never needs Redis' eviction: the Redis of the rate
limits must run `maxmemory-policy noeviction` (an evicted bucket is a limit forgotten).

Fail open: the cache only ever saves work, so a Redis that does not answer means no caching (logged once
per outage), never a failed request; for a few seconds after a failure the cache does not ask again, so
requests do not each wait out the timeout of a Redis that is down.

`ResponseCacher` is what the request path calls: the store, its metrics, and stores sent off in the
background (a stream is kept from its end callback, which cannot wait).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from starlette.responses import Response

from servlane_api.aifeature import ResponseCache
from servlane_gateway.cache.rules import (
    CACHE_HEADER,
    HIT,
    Bounds,
    CacheBudget,
    CacheKey,
    Caching,
    Entry,
    Recorder,
    json_keepable,
    stream_keepable,
)
from servlane_gateway.gateway_metrics import GatewayMetrics
from servlane_gateway.http.proxy import UsageScanner

log = logging.getLogger(__name__)

Clock = Callable[[], float]


@dataclass(frozen=True)
class Stored:
    # False: larger than one answer may be, the cap full of other namespaces' answers, or no answer
    kept: bool
    evicted: int = 0  # older answers of the same namespace dropped to make room (not the expired ones)


class AnswerStore(Protocol):
    mode: str

    async def get(self, key: CacheKey) -> Entry | None: ...

    async def put(self, key: CacheKey, entry: Entry, bounds: Bounds) -> Stored: ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


@dataclass
class _Shelf:
    """The answers of one feature or of one namespace, oldest first, and their bytes."""

    order: OrderedDict[tuple[str, str], None] = field(default_factory=OrderedDict)  # (feature, digest)
    size: int = 0

    def oldest(self) -> tuple[str, str] | None:
        return next(iter(self.order), None)


@dataclass(frozen=True)
class _Kept:
    expires: float
    entry: Entry


class MemoryStore:
    """In this process's memory, under the bounds of `Bounds`; `clock` (seconds, monotonic) is injectable
    for tests. Expired answers are found through a heap of expiry times (entries replaced or evicted
    meanwhile are skipped when their time comes), so a namespace that went idle frees its bytes."""

    mode = "memory"

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self._kept: dict[tuple[str, str, str], _Kept] = {}  # (namespace, feature, digest)
        self._features: dict[tuple[str, str], _Shelf] = {}
        self._namespaces: dict[str, _Shelf] = {}
        self._expiry: list[tuple[float, tuple[str, str, str]]] = []
        self.total = 0  # bytes of every namespace's answers

    async def start(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    def namespace_bytes(self, namespace: str) -> int:
        shelf = self._namespaces.get(namespace)
        return shelf.size if shelf is not None else 0

    async def get(self, key: CacheKey) -> Entry | None:
        where = (key.namespace, key.feature, key.digest)
        kept = self._kept.get(where)
        if kept is None:
            return None
        if self.clock() >= kept.expires:
            self._drop(where)
            return None
        return kept.entry

    def _drop(self, where: tuple[str, str, str]) -> None:
        namespace, feature, digest = where
        kept = self._kept.pop(where)
        size = len(kept.entry.body)
        self.total -= size
        for shelf in (self._features[(namespace, feature)], self._namespaces[namespace]):
            del shelf.order[(feature, digest)]
            shelf.size -= size
        if not self._features[(namespace, feature)].order:
            del self._features[(namespace, feature)]
        if not self._namespaces[namespace].order:
            del self._namespaces[namespace]

    def _drop_expired(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] <= now:
            expires, where = heapq.heappop(self._expiry)
            kept = self._kept.get(where)
            if kept is not None and kept.expires == expires:
                self._drop(where)
        # Answers evicted or replaced leave their expiry behind until its time: without this, a tenant
        # storing fast under a long TTL would grow the heap far beyond the answers the budget holds.
        if len(self._expiry) > 2 * len(self._kept) + 1024:
            self._expiry = [(kept.expires, where) for where, kept in self._kept.items()]
            heapq.heapify(self._expiry)

    async def put(self, key: CacheKey, entry: Entry, bounds: Bounds) -> Stored:
        if not bounds.fits(entry):
            return Stored(False)
        now = self.clock()
        self._drop_expired(now)  # not counted as evicted
        where = (key.namespace, key.feature, key.digest)
        if where in self._kept:
            self._drop(where)
        expires = now + bounds.ttl_seconds
        self._kept[where] = _Kept(expires, entry)
        heapq.heappush(self._expiry, (expires, where))
        size = len(entry.body)
        self.total += size
        feature = self._features.setdefault((key.namespace, key.feature), _Shelf())
        namespace = self._namespaces.setdefault(key.namespace, _Shelf())
        for shelf in (feature, namespace):
            shelf.order[(key.feature, key.digest)] = None
            shelf.size += size
        mine = (key.feature, key.digest)
        evicted = 0

        def evict_oldest(shelf: _Shelf) -> bool:
            """The shelf's oldest answer, never the one being stored: always the storing namespace's own."""
            nonlocal evicted
            oldest = shelf.oldest()
            if oldest is None or oldest == mine:
                return False
            self._drop((key.namespace, *oldest))
            evicted += 1
            return True

        while len(feature.order) > bounds.max_entries or feature.size > bounds.feature_bytes:
            if not evict_oldest(feature):
                break
        while namespace.size > bounds.namespace_bytes and evict_oldest(namespace):
            pass
        while self.total > bounds.total_bytes and evict_oldest(namespace):
            pass
        if self.total > bounds.total_bytes or namespace.size > bounds.namespace_bytes:
            self._drop(where)  # the cap is full of other namespaces' answers: theirs are never evicted
            return Stored(False, evicted)
        return Stored(True, evicted)


@dataclass
class Leading:
    """A missed non-streamed request on its way to the backend, which identical requests arriving meanwhile
    wait for instead of asking the backend again (in this gateway process)."""

    key: CacheKey
    answer: asyncio.Future[Entry | None]
    entry: Entry | None = None  # set when its answer was kept


class ResponseCacher:
    """The request path's side of the cache: look up and keep answers, counting hits, misses, stores and
    evictions per namespace and feature."""

    def __init__(self, store: AnswerStore, metrics: GatewayMetrics, budget: CacheBudget | None = None) -> None:
        self.store = store
        self.budget = budget or CacheBudget()
        self.metrics = metrics
        self._tasks: set[asyncio.Task[None]] = set()
        self._leading: dict[CacheKey, Leading] = {}

    def leader(self, key: CacheKey) -> Leading | None:
        return self._leading.get(key)

    def lead(self, key: CacheKey) -> Leading:
        leading = Leading(key, asyncio.get_running_loop().create_future())
        self._leading[key] = leading
        return leading

    def release(self, leading: Leading) -> None:
        """However the leader ended: its followers get its kept answer, or None (then they ask the backend)."""
        if self._leading.get(leading.key) is leading:
            del self._leading[leading.key]
        if not leading.answer.done():
            leading.answer.set_result(leading.entry)

    async def follow(self, leading: Leading, limit_seconds: float) -> Entry | None:
        try:
            entry = await asyncio.wait_for(asyncio.shield(leading.answer), limit_seconds)
        except TimeoutError:
            return None
        if entry is not None:
            self.metrics.cache_coalesced.labels(leading.key.namespace, leading.key.feature).inc()
        return entry

    async def get(self, key: CacheKey) -> Entry | None:
        entry = await self.store.get(key)
        counter = self.metrics.cache_hits if entry is not None else self.metrics.cache_misses
        counter.labels(key.namespace, key.feature).inc()
        return entry

    def keep(self, key: CacheKey, entry: Entry, policy: ResponseCache) -> None:
        """Stores in the background: the answer has been sent (or is being sent) already."""
        task = asyncio.get_running_loop().create_task(self._keep(key, entry, self.budget.bounds(policy)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _keep(self, key: CacheKey, entry: Entry, bounds: Bounds) -> None:
        stored = await self.store.put(key, entry, bounds)
        if stored.kept:
            self.metrics.cache_stores.labels(key.namespace, key.feature).inc()
        if stored.evicted:
            self.metrics.cache_evictions.labels(key.namespace, key.feature).inc(stored.evicted)

    def keep_answer(self, caching: Caching, content: bytes) -> Entry | None:
        if not json_keepable(content):
            return None
        entry = Entry(False, caching.content_type, content)
        self.keep(caching.key, entry, caching.policy)
        return entry

    def record(self, caching: Caching) -> Recorder:
        """What a relayed stream feeds its chunks to, so that it can be kept when it ends well."""
        # The admin's bound on one answer, never the feature's own alone: a stream is held in memory.
        caching.recorder = Recorder(self.budget.bounds(caching.policy).entry_bytes)
        return caching.recorder

    def keep_stream(self, caching: Caching) -> None:
        content = caching.recorder.content() if caching.recorder is not None else None
        if content is not None and stream_keepable(content):
            self.keep(caching.key, Entry(True, caching.content_type, content), caching.policy)

    @staticmethod
    def replay(entry: Entry, strip_usage: bool, request_id: str | None, how: str = HIT) -> Response:
        """A kept answer as the backend gave it: a stream loses its usage chunk when not asked for, like
        a relayed one (proxy.UsageScanner). The request id is the caller's own, never the kept one."""
        headers = {"content-type": entry.content_type, CACHE_HEADER: how}
        if request_id:
            headers["x-request-id"] = request_id
        body = entry.body
        if entry.stream:
            headers |= {"cache-control": "no-cache", "x-accel-buffering": "no"}
            scanner = UsageScanner(strip_usage)
            body = scanner.feed(body) + scanner.finish()
        return Response(body, status_code=200, headers=headers)

    async def settled(self) -> None:
        """Waits for the stores sent off so far (tests, and shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def start(self) -> None:
        await self.store.start()

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.settled(), timeout=2)
        await self.store.aclose()
