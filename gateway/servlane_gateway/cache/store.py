"""Where the response cache keeps answers: this replica's memory, or a Redis shared by the replicas.

Both keep each feature's answers under that feature's bounds (`spec.responseCache`): at most
`maxEntries` answers and `maxBytes` bytes, the oldest dropped first, each served for `ttlSeconds`; and
under the admin's (`response_cache.CacheBudget`), which no feature raises: a share per namespace, a cap on
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
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError
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
from servlane_gateway.limits.redis_limiter import redis_client
from servlane_gateway.limits.shared import redact_url

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


# Redis: every answer of the gateway (its key prefix) in five kinds of keys, so that one script sees the
# bytes of the feature, of its namespace and of all: a member is `<namespace>/<feature>/<digest>`
# (Kubernetes names hold no '/').
#   <prefix>:cache:entries               hash: member -> entry
#   <prefix>:cache:sizes                 hash: member -> bytes; '#total', '#ns:<ns>', '#bytes:<ns>/<feature>',
#                                        '#count:<ns>/<feature>' (the sums) and '#seq' (the store order)
#   <prefix>:cache:expiry                sorted set: member -> when it expires (ms of Redis' clock)
#   <prefix>:cache:age:<ns>              sorted set: member -> store order, the namespace's oldest first
#   <prefix>:cache:age:<ns>/<feature>    sorted set: the same for the feature
# An age set may hold members dropped meanwhile (expired, from a store of another namespace): skipped and
# removed when met. Every key expires after the longest TTL stored in it, so an idle cache leaves nothing.

# KEYS: entries, expiry. ARGV: member. The entry, or nil when absent or expired.
GET = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expires = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[1]))
if expires == nil or expires <= now then return false end
return redis.call('HGET', KEYS[1], ARGV[1])
"""

# KEYS: entries, sizes, expiry, namespace age, feature age.
# ARGV: member, entry, ttl (ms), max entries, feature bytes, namespace bytes, total bytes, namespace, feature.
# Returns {kept (1/0), answers evicted to make room}: only ever the storing namespace's own.
PUT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local member, entry, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local max_entries, feature_bytes = tonumber(ARGV[4]), tonumber(ARGV[5])
local namespace_bytes, total_bytes = tonumber(ARGV[6]), tonumber(ARGV[7])
local ns_sum, feature_sum = '#ns:' .. ARGV[8], '#bytes:' .. ARGV[8] .. '/' .. ARGV[9]
local feature_count = '#count:' .. ARGV[8] .. '/' .. ARGV[9]
local function sum(field) return tonumber(redis.call('HGET', KEYS[2], field)) or 0 end
local function add(field, delta)
  if redis.call('HINCRBY', KEYS[2], field, delta) == 0 then redis.call('HDEL', KEYS[2], field) end
end
local function drop(m)
  local size = tonumber(redis.call('HGET', KEYS[2], m))
  redis.call('ZREM', KEYS[4], m)
  redis.call('ZREM', KEYS[5], m)
  if size == nil then return end
  local ns, feature = string.match(m, '^([^/]+)/([^/]+)/')
  redis.call('HDEL', KEYS[1], m)
  redis.call('HDEL', KEYS[2], m)
  redis.call('ZREM', KEYS[3], m)
  add('#total', -size)
  add('#ns:' .. ns, -size)
  add('#bytes:' .. ns .. '/' .. feature, -size)
  add('#count:' .. ns .. '/' .. feature, -1)
end
local function oldest(age)
  while true do
    local m = redis.call('ZRANGE', age, 0, 0)[1]
    if m == nil or redis.call('HEXISTS', KEYS[2], m) == 1 then return m end
    redis.call('ZREM', age, m)
  end
end
local evicted = 0
local function evict(age)
  local m = oldest(age)
  if m == nil or m == member then return false end
  drop(m)
  evicted = evicted + 1
  return true
end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 100)) do drop(m) end
oldest(KEYS[4])  -- the members another namespace's store dropped, at the head of the age sets, go too
oldest(KEYS[5])
drop(member)
local size = string.len(entry)
redis.call('HSET', KEYS[1], member, entry)
redis.call('HSET', KEYS[2], member, size)
redis.call('ZADD', KEYS[3], now + ttl, member)
local seq = redis.call('HINCRBY', KEYS[2], '#seq', 1)
redis.call('ZADD', KEYS[4], seq, member)
redis.call('ZADD', KEYS[5], seq, member)
add('#total', size)
add(ns_sum, size)
add(feature_sum, size)
add(feature_count, 1)
while (sum(feature_count) > max_entries or sum(feature_sum) > feature_bytes) and evict(KEYS[5]) do end
while sum(ns_sum) > namespace_bytes and evict(KEYS[4]) do end
while sum('#total') > total_bytes and evict(KEYS[4]) do end
local kept = 1
if sum('#total') > total_bytes or sum(ns_sum) > namespace_bytes then
  drop(member)
  kept = 0
end
for i = 1, 5 do
  if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
end
return {kept, evicted}
"""


def redis_member(key: CacheKey) -> str:
    return f"{key.namespace}/{key.feature}/{key.digest}"


def redis_keys(prefix: str, key: CacheKey) -> list[str]:
    """The five keys a store of this answer touches (see above)."""
    base = f"{prefix}:cache"
    ns = key.namespace
    return [f"{base}:entries", f"{base}:sizes", f"{base}:expiry", f"{base}:age:{ns}", f"{base}:age:{ns}/{key.feature}"]


class StoreDown(Exception):
    pass


class RedisStore:
    """In a Redis shared by the replicas (the rate limits' own settings); every failure is a miss."""

    mode = "redis"

    def __init__(
        self,
        url: str,
        *,
        password: str | None = None,
        prefix: str = "servlane-gateway",
        timeout: float = 0.5,
        pause: float = 5.0,
        clock: Clock = time.monotonic,
    ) -> None:
        self.prefix = prefix
        self.where = redact_url(url)  # all that is ever logged of the URL
        self.pause = pause  # seconds without asking after a failure
        self.clock = clock
        self._url = url
        self._password = password
        self._timeout = timeout
        self._deadline = 4 * timeout  # one connect and one read, retried once (as the limiter's calls)
        self._client: Redis | None = None
        self._scripts: dict[str, AsyncScript] = {}
        self._paused_until = float("-inf")
        self._reachable: bool | None = None

    async def start(self) -> None:
        name = f"servlane-gateway-cache-{uuid.uuid4().hex[:12]}"
        self._client = redis_client(self._url, self._password, self._timeout, name)
        self._scripts = {"get": self._client.register_script(GET), "put": self._client.register_script(PUT)}

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def get(self, key: CacheKey) -> Entry | None:
        try:
            entries, _, expiry, *_ = redis_keys(self.prefix, key)
            found = await self._script("get", [entries, expiry], [redis_member(key)])
        except StoreDown:
            return None
        return Entry.decode(found) if isinstance(found, bytes) else None

    async def put(self, key: CacheKey, entry: Entry, bounds: Bounds) -> Stored:
        if not bounds.fits(entry):
            return Stored(False)
        sizes = [bounds.max_entries, bounds.feature_bytes, bounds.namespace_bytes, bounds.total_bytes]
        args: list[Any] = [redis_member(key), entry.encode(), bounds.ttl_seconds * 1000, *sizes]
        try:
            keys = redis_keys(self.prefix, key)
            kept, evicted = await self._script("put", keys, [*args, key.namespace, key.feature])
        except StoreDown:
            return Stored(False)
        return Stored(bool(kept), int(evicted))

    async def _script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        if self._client is None or self.clock() < self._paused_until:
            raise StoreDown
        script = self._scripts[name]
        try:
            async with asyncio.timeout(self._deadline):
                result = await script(keys=keys, args=args, client=self._client)
        except (RedisError, OSError, TimeoutError) as exc:
            self._paused_until = self.clock() + self.pause
            if self._reachable is not False:
                # The exception's text names the host and port at most, never the password.
                log.error(
                    "the response cache (Redis at %s) does not answer: %s: %s; requests go uncached until it does",
                    self.where,
                    type(exc).__name__,
                    exc,
                )
            self._reachable = False
            raise StoreDown from exc
        if self._reachable is False:
            log.info("the response cache (Redis at %s) answers again", self.where)
        self._reachable = True
        return result


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
