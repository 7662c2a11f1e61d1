"""The response cache's answers in a Redis shared by the replicas (`--cache-redis-url`, else the rate limits'
`--redis-url` at another database): one script per store, atomic across replicas, one per lookup; fail open
(see servlane_gateway.cache.store for the bounds and the fail-open rule)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from servlane_gateway.cache.rules import Bounds, CacheKey, Entry
from servlane_gateway.cache.store import Clock, Stored
from servlane_gateway.limits.redis_limiter import redis_client
from servlane_gateway.limits.shared import redact_url

log = logging.getLogger(__name__)


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
