"""Where the response cache keeps answers: this replica's memory, or a Redis shared by the replicas.

Both keep each feature's answers apart, under that feature's bounds (`spec.responseCache`): at most
`maxEntries` answers and `maxBytes` bytes, the oldest dropped first, each served for `ttlSeconds`.

Redis (with `--redis-url`, the one the rate limits use): a feature's answers are three keys under the
gateway's key prefix, `<prefix>:cache:{<namespace>/<feature>}:entries` (a hash: digest -> entry),
`:sizes` (a hash: digest -> bytes, and `#total`) and `:expiry` (a sorted set: digest -> when it expires,
in ms of Redis' clock). A store is one script, atomic across replicas: it drops the expired answers, adds
the new one and drops the oldest beyond the bounds. A lookup is one script that serves an answer only
before it expires. The three keys expire with the last answer stored, so an idle feature leaves nothing.

Fail open: the cache only ever saves work, so a Redis that does not answer means no caching (logged once
per outage), never a failed request; for a few seconds after a failure the cache does not ask again, so
requests do not each wait out the timeout of a Redis that is down.

`ResponseCacher` is what the request path calls: the store, its metrics, and stores sent off in the
background (a stream is kept from its end callback, which cannot wait).
"""

from __future__ import annotations

import asyncio
import contextlib
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
from servlane_gateway.gateway_metrics import GatewayMetrics
from servlane_gateway.proxy import UsageScanner
from servlane_gateway.redis_limits import redis_client
from servlane_gateway.response_cache import (
    CACHE_HEADER,
    HIT,
    CacheKey,
    Caching,
    Entry,
    Recorder,
    fits,
    json_keepable,
    stream_keepable,
)
from servlane_gateway.shared_limits import redact_url

log = logging.getLogger(__name__)

Clock = Callable[[], float]
TOTAL = "#total"  # the field of the sizes hash holding their sum (a digest never starts with '#')


@dataclass(frozen=True)
class Stored:
    kept: bool  # False: larger than the feature's maxBytes, or the store did not answer
    evicted: int = 0  # older answers dropped to make room (not the expired ones)


class AnswerStore(Protocol):
    mode: str

    async def get(self, key: CacheKey) -> Entry | None: ...

    async def put(self, key: CacheKey, entry: Entry, policy: ResponseCache) -> Stored: ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


@dataclass
class _Shelf:
    """One feature's answers, oldest first: digest -> (expires at, entry)."""

    entries: OrderedDict[str, tuple[float, Entry]] = field(default_factory=OrderedDict)
    size: int = 0

    def drop(self, digest: str) -> None:
        _, entry = self.entries.pop(digest)
        self.size -= len(entry.body)


class MemoryStore:
    """In this replica's memory; `clock` (seconds, monotonic) is injectable for tests."""

    mode = "memory"

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self._shelves: dict[tuple[str, str], _Shelf] = {}

    async def start(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    async def get(self, key: CacheKey) -> Entry | None:
        shelf = self._shelves.get((key.namespace, key.feature))
        found = shelf.entries.get(key.digest) if shelf is not None else None
        if shelf is None or found is None:
            return None
        expires, entry = found
        if self.clock() >= expires:
            shelf.drop(key.digest)
            return None
        return entry

    async def put(self, key: CacheKey, entry: Entry, policy: ResponseCache) -> Stored:
        if not fits(entry, policy):
            return Stored(False)
        now = self.clock()
        shelf = self._shelves.setdefault((key.namespace, key.feature), _Shelf())
        if key.digest in shelf.entries:
            shelf.drop(key.digest)
        while shelf.entries and next(iter(shelf.entries.values()))[0] <= now:  # expired: not counted as evicted
            shelf.drop(next(iter(shelf.entries)))
        shelf.entries[key.digest] = (now + policy.ttl_seconds, entry)
        shelf.size += len(entry.body)
        evicted = 0
        while len(shelf.entries) > policy.max_entries or shelf.size > policy.max_bytes:
            shelf.drop(next(iter(shelf.entries)))
            evicted += 1
        return Stored(True, evicted)


# KEYS: entries, sizes, expiry. ARGV: digest. The entry, or nil when absent or expired.
GET = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expires = tonumber(redis.call('ZSCORE', KEYS[3], ARGV[1]))
if expires == nil or expires <= now then return false end
return redis.call('HGET', KEYS[1], ARGV[1])
"""

# KEYS: entries, sizes, expiry. ARGV: digest, entry, ttl (ms), max entries, max bytes.
# Returns {kept (1/0), answers evicted to make room}.
PUT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local digest, entry, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local max_entries, max_bytes = tonumber(ARGV[4]), tonumber(ARGV[5])
local function drop(member)
  local size = tonumber(redis.call('HGET', KEYS[2], member)) or 0
  redis.call('HDEL', KEYS[1], member)
  redis.call('HDEL', KEYS[2], member)
  redis.call('HINCRBY', KEYS[2], '#total', -size)
  redis.call('ZREM', KEYS[3], member)
end
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do drop(member) end
if redis.call('ZSCORE', KEYS[3], digest) then drop(digest) end
redis.call('HSET', KEYS[1], digest, entry)
redis.call('HSET', KEYS[2], digest, string.len(entry))
local total = redis.call('HINCRBY', KEYS[2], '#total', string.len(entry))
redis.call('ZADD', KEYS[3], now + ttl, digest)
local evicted = 0
while redis.call('ZCARD', KEYS[3]) > max_entries or total > max_bytes do
  local oldest = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if oldest == nil then break end
  drop(oldest)
  total = tonumber(redis.call('HGET', KEYS[2], '#total'))
  if oldest ~= digest then evicted = evicted + 1 end
end
-- Every answer expires within the TTL of the last one stored: so do the keys that hold them.
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ttl) end
if redis.call('ZSCORE', KEYS[3], digest) then return {1, evicted} end
return {0, evicted}
"""


def redis_keys(prefix: str, key: CacheKey) -> list[str]:
    """The feature's three keys; the braces put them in one hash slot, should the Redis be a cluster."""
    base = f"{prefix}:cache:{{{key.namespace}/{key.feature}}}"
    return [f"{base}:entries", f"{base}:sizes", f"{base}:expiry"]


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
            found = await self._script("get", redis_keys(self.prefix, key), [key.digest])
        except StoreDown:
            return None
        return Entry.decode(found) if isinstance(found, bytes) else None

    async def put(self, key: CacheKey, entry: Entry, policy: ResponseCache) -> Stored:
        if not fits(entry, policy):
            return Stored(False)
        args: list[Any] = [key.digest, entry.encode(), policy.ttl_seconds * 1000, policy.max_entries]
        try:
            kept, evicted = await self._script("put", redis_keys(self.prefix, key), [*args, policy.max_bytes])
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

    def __init__(self, store: AnswerStore, metrics: GatewayMetrics) -> None:
        self.store = store
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
        task = asyncio.get_running_loop().create_task(self._keep(key, entry, policy))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _keep(self, key: CacheKey, entry: Entry, policy: ResponseCache) -> None:
        stored = await self.store.put(key, entry, policy)
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
        caching.recorder = Recorder(caching.policy.max_bytes)
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
