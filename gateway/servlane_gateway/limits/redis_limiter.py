"""Limits shared by the gateway replicas through Redis: `RedisLimiter`, used instead of the in-memory
`rates.RateLimiter` when `--redis-url` is set, with the same semantics (see rates' docstring and
`Admission.settle`).

Each admission and each settlement is one Lua script (EVALSHA through redis-py's `register_script`), so
it is atomic across replicas: a request is admitted by every limit or by none. Buckets refill from the
time of Redis itself (`TIME`), so the replicas' clocks never matter. A place in flight is a member of a
sorted set scored by when its lease ends; the replica renews the leases of its requests while they run,
so the places of a replica that dies free themselves within one lease.

Fail closed: a Redis that does not answer within the timeouts (connect, read, and a deadline around each
call) refuses requests with 503 and Retry-After (OpenAI-style JSON) and makes /ready fail. A settlement or
renewal that fails is logged: the lease then frees the place, and the reservation stands as the charge.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from servlane_core.protocol.errors import OpenAIError
from servlane_gateway.limits.rates import Check, Kind, Limits, Scope, bounded_reservation, charged_tokens, plan_checks
from servlane_gateway.limits.shared import (
    RENEW_FRACTION,
    ScriptCall,
    admit_call,
    admit_refusal,
    redact_url,
    renew_call,
    settle_call,
    store_key,
)

log = logging.getLogger(__name__)

STORE_UNAVAILABLE = "limits_unavailable"  # the `code` of the 503 while the store does not answer
RENEW_BATCH = 256  # leases renewed per script call

# TokenBucket's arithmetic in Redis: `now` in µs from Redis' clock; a bucket holds one minute's allowance.
_BUCKET = """
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function level_of(key, capacity, now)
  local v = redis.call('HMGET', key, 'level', 'ts')
  local level, ts = tonumber(v[1]), tonumber(v[2])
  if level == nil or ts == nil then return capacity end
  if now > ts then level = math.min(capacity, level + (now - ts) * capacity / 60000000) end
  return level
end
local function store(key, capacity, level, now)
  local ts = tonumber(redis.call('HGET', key, 'ts'))
  if ts == nil or now > ts then ts = now end -- Redis' clock stepped back (a failover): refill from the later
  redis.call('HSET', key, 'level', string.format('%.17g', level), 'ts', string.format('%.17g', ts))
  -- Left alone until it is full again, a bucket is the same as no bucket: it expires then.
  redis.call('PEXPIRE', key, math.ceil(math.max(0, capacity - level) * 60000 / capacity) + 1000)
end
"""

# KEYS: one per check. ARGV: reserve, member, lease (µs), then per check its kind and limit.
# Returns {admitted, wait of each check in ms (an in-flight check: 1 when full)}.
ADMIT = (
    _BUCKET
    + """
local now = now_us()
local reserve, member, lease = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local levels, answer, refused = {}, {0}, false
for i = 1, #KEYS do
  local kind, limit = ARGV[2 + 2 * i], tonumber(ARGV[3 + 2 * i])
  local wait = 0
  if kind == 'in_flight' then
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', string.format('%.17g', now)) -- leases that ended
    if redis.call('ZCARD', KEYS[i]) >= limit then wait = 1 end
  else
    levels[i] = level_of(KEYS[i], limit, now)
    local missing = math.min(1, limit) - levels[i] -- admitted while one request (or token) is left
    if missing > 0 then wait = math.ceil(missing / (limit / 60000000) / 1000) end
  end
  if wait > 0 then refused = true end
  answer[i + 1] = wait
end
if refused then return answer end
for i = 1, #KEYS do
  local kind, limit = ARGV[2 + 2 * i], tonumber(ARGV[3 + 2 * i])
  if kind == 'requests' then
    store(KEYS[i], limit, levels[i] - 1, now)
  elseif kind == 'tokens' then
    store(KEYS[i], limit, levels[i] - reserve, now)
  else
    redis.call('ZADD', KEYS[i], string.format('%.17g', now + lease), member)
    redis.call('PEXPIRE', KEYS[i], math.ceil(lease / 1000))
  end
end
answer[1] = 1
return answer
"""
)

# KEYS: the token buckets, then the in-flight sets. ARGV: member, difference (taken; negative: given back,
# never above the limit), how many buckets, their limits.
SETTLE = (
    _BUCKET
    + """
local now = now_us()
local member, difference, buckets = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 1, buckets do
  local limit = tonumber(ARGV[3 + i])
  local level = level_of(KEYS[i], limit, now) - difference
  if difference < 0 then level = math.min(limit, level) end
  store(KEYS[i], limit, level, now)
end
for i = buckets + 1, #KEYS do redis.call('ZREM', KEYS[i], member) end
return 1
"""
)

# KEYS: in-flight sets. ARGV: lease (µs), then the member held in each. XX: a place already released (or
# lost with a restarted Redis) is not brought back by a renewal that crossed its release.
RENEW = (
    _BUCKET
    + """
local now = now_us()
local lease = tonumber(ARGV[1])
for i = 1, #KEYS do
  if redis.call('ZADD', KEYS[i], 'XX', 'CH', string.format('%.17g', now + lease), ARGV[1 + i]) > 0 then
    redis.call('PEXPIRE', KEYS[i], math.ceil(lease / 1000))
  end
end
return 1
"""
)

# KEYS[1]; ARGV: kind, limit. Reads only: a bucket's level now (a string), or the places in flight.
PEEK = (
    _BUCKET
    + """
local now = now_us()
if ARGV[1] == 'in_flight' then
  return redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%.17g', now), '+inf')
end
return string.format('%.17g', level_of(KEYS[1], tonumber(ARGV[2]), now))
"""
)


def redis_client(url: str, password: str | None, timeout: float, client_name: str) -> Redis:
    """The gateway's Redis client (shared limits, response cache): every call bounded by `timeout`, one
    immediate retry, named for `CLIENT LIST`; a password in the URL itself takes precedence."""
    options: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 1),
        "client_name": client_name,
    }
    if password is not None:
        options["password"] = password
    return Redis.from_url(url, **options)


class StoreUnavailable(Exception):
    """Redis did not answer in time, or answered with an error."""


class RedisAdmission:
    """One admitted request's hold on the shared limits, released exactly once by `settle` (its semantics
    are `rates.Admission.settle`'s). The release is sent to Redis in the background: `settle` is called
    where the request ends, e.g. a stream's callback, which cannot wait."""

    def __init__(self, limiter: RedisLimiter, checks: list[Check], member: str, reserved: int) -> None:
        self._limiter = limiter
        self._checks = checks
        self._member = member
        self.reserved = reserved
        self.settled = False

    def settle(self, tokens: int | None) -> None:
        if self.settled:
            return
        self.settled = True
        charge = 0 if tokens is None else charged_tokens(tokens) - self.reserved
        self._limiter._release(self._checks, self._member, charge)


class RedisLimiter:
    """The `rates.Limiter` whose buckets and places in flight live in a Redis shared by the replicas."""

    mode = "redis"

    def __init__(
        self,
        url: str,
        *,
        per_key: Limits,
        per_feature: Limits,
        password: str | None = None,
        prefix: str = "servlane-gateway",
        timeout: float = 0.5,
        lease: float = 30.0,
        retry_after: float = 5.0,
    ) -> None:
        self.per_key = per_key
        self.per_feature = per_feature
        self.prefix = prefix
        self.lease = lease
        self.retry_after = retry_after
        self.where = redact_url(url)  # all that is ever logged of the URL
        self._url = url
        self._password = password
        self._timeout = timeout
        # One connect and one read, retried once on a fresh connection (a pooled one that Redis closed):
        # every call ends within this, whatever the network does.
        self._deadline = 4 * timeout
        self._client: Redis | None = None
        self._scripts: dict[str, AsyncScript] = {}
        self._replica = uuid.uuid4().hex[:12]  # members are unique across replicas without coordination
        self._ids = itertools.count()
        self._held: dict[str, list[tuple[str, str]]] = {}  # member -> (in-flight set, member): leases to renew
        self._tasks: set[asyncio.Task[None]] = set()
        self._renewer: asyncio.Task[None] | None = None
        self._reachable: bool | None = None  # last known; None before the first call

    async def start(self) -> None:
        self._client = redis_client(self._url, self._password, self._timeout, f"servlane-gateway-{self._replica}")
        for name, text in (("admit", ADMIT), ("settle", SETTLE), ("renew", RENEW), ("peek", PEEK)):
            self._scripts[name] = self._client.register_script(text)
        self._renewer = asyncio.create_task(self._renew_forever())
        await self._ping()  # an unreachable store is logged at once, not at the first request

    async def aclose(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
        if self._tasks:  # releases already sent off: let them land, within their deadline
            await asyncio.wait(set(self._tasks), timeout=self._deadline)
        if self._client is not None:
            await self._client.aclose()

    async def _ping(self) -> None:
        # An outage is logged by _call (where, why); requests then get 503 on their own.
        with contextlib.suppress(StoreUnavailable):
            await self._call(lambda client: client.ping())

    async def acquire(
        self, key_name: str | None, namespace: str, feature: str, reserve_tokens: int = 0
    ) -> RedisAdmission:
        checks = plan_checks(self.per_key, self.per_feature, key_name, namespace, feature)
        if not checks:  # no limit applies: nothing to ask, so a store outage does not matter here
            return RedisAdmission(self, [], "", reserve_tokens)
        reserve_tokens = bounded_reservation(checks, reserve_tokens)
        member = f"{self._replica}:{next(self._ids)}"
        call = admit_call(self.prefix, checks, reserve_tokens, member, self.lease)
        try:
            reply = await self._script("admit", call)
        except StoreUnavailable as exc:
            raise OpenAIError(
                503,
                "Rate limits cannot be checked right now (the gateway's limit store does not answer); "
                "try again shortly.",
                type="server_error",
                code=STORE_UNAVAILABLE,
                retry_after=self.retry_after,
            ) from exc
        refused = admit_refusal(checks, reply)
        if refused is not None:
            raise refused
        places = [(store_key(self.prefix, c), member) for c in checks if c.kind == "in_flight"]
        if places:
            self._held[member] = places
        return RedisAdmission(self, checks, member, reserve_tokens)

    async def in_flight(self, scope: Scope, name: str) -> int:
        """Requests of this scope in flight across the replicas, leases not ended (0 without a cap)."""
        check = self._check(scope, name, "in_flight")
        return 0 if check is None else int(await self._script("peek", self._peek(check)))

    async def tokens_left(self, scope: Scope, name: str) -> float | None:
        """The shared token bucket's level now (negative: in debt), or None without a token limit."""
        check = self._check(scope, name, "tokens")
        return None if check is None else float(await self._script("peek", self._peek(check)))

    def _check(self, scope: Scope, name: str, kind: Kind) -> Check | None:
        limits = self.per_key if scope == "key" else self.per_feature
        per_kind = {"requests": limits.requests_per_minute, "tokens": limits.tokens_per_minute}
        limit = per_kind.get(kind, float(limits.max_in_flight))
        return Check(scope, name, kind, limit) if limit > 0 else None

    def _peek(self, check: Check) -> ScriptCall:
        return ScriptCall([store_key(self.prefix, check)], [check.kind, repr(float(check.limit))])

    def _release(self, checks: list[Check], member: str, difference: int) -> None:
        self._held.pop(member, None)  # first: a renewal from now on leaves this place alone
        call = settle_call(self.prefix, checks, member, difference)
        if not call.keys:
            return
        task = asyncio.get_running_loop().create_task(self._settle(call))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, call: ScriptCall) -> None:
        try:
            await self._script("settle", call)
        except StoreUnavailable:
            log.warning(
                "a request's end was not recorded in Redis: its place in flight frees when its lease ends "
                "(within %gs), and its token reservation stands as its charge",
                self.lease,
            )

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease * RENEW_FRACTION)  # the renewal period, not a synchronisation
            held = [place for places in list(self._held.values()) for place in places]
            for start in range(0, len(held), RENEW_BATCH):
                try:
                    await self._script("renew", renew_call(held[start : start + RENEW_BATCH], self.lease))
                except StoreUnavailable:
                    break  # logged by _call; the next period tries again

    async def _script(self, name: str, call: ScriptCall) -> Any:
        script = self._scripts[name]
        return await self._call(lambda client: script(keys=call.keys, args=call.args, client=client))

    async def _call(self, work: Any) -> Any:
        if self._client is None:
            raise StoreUnavailable("the limit store is not started")
        try:
            async with asyncio.timeout(self._deadline):
                result = await work(self._client)
        except (RedisError, OSError, TimeoutError) as exc:
            # The exception's text names the host and port at most, never the password.
            reason = f"the limit store (Redis at {self.where}) does not answer: {type(exc).__name__}: {exc}"
            if self._reachable is not False:
                log.error("%s; requests are refused with 503 until it does", reason)
            self._reachable = False
            raise StoreUnavailable(reason) from exc
        if self._reachable is False:
            log.info("the limit store (Redis at %s) answers again", self.where)
        self._reachable = True
        return result
