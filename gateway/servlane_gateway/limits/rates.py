"""Token buckets for requests and tokens per minute, and in-flight caps, per API key and per feature.

A feature's buckets are keyed by its namespace and name: team A's `chat` and team B's `chat` are two
features with two budgets, never one shared by whoever calls either.

Requests are taken before proxying. Tokens are not known until the backend answers, so a request is
admitted while the token bucket is not in debt, and an estimate of its tokens is reserved (taken) at
once: concurrent requests then see each other's reservations, and the budget is overshot by at most one
request's reservation, not by every request admitted before the first one ends. When the request ends,
the reservation is replaced by the usage it reported (the difference taken or given back); without a
report, it stands (see `Admission.settle`). A bucket may go negative, which holds back the next
requests until it refills. A bucket holds at most one minute's allowance, so a limit of N per minute
allows a burst of N, then N/60 per second.

The estimate is the client's to inflate (`max_tokens`, `n`), and a feature's bucket is shared by every key
that calls the feature: so a reservation is at most one minute's allowance of the smallest token limit it
is taken from (`bounded_reservation`). A reservation that stands (the client left) then holds back the
feature's other callers for at most a minute, as a request that really used its whole budget would, and not
for as long as the client asked (a `max_tokens` of 10**300 did so until the gateway restarted). Usage is
charged as reported, up to `MAX_CHARGED_TOKENS`: the buckets count in floats (Redis in doubles), and a JSON
integer may be of any size.

`RateLimiter` keeps all of it in this process's memory: each gateway replica limits on its own.
`servlane_gateway.limits.redis_limiter.RedisLimiter` keeps the same buckets, reservations and in-flight places in
a Redis shared by the replicas, with the same semantics; both answer the `Limiter` protocol the request
path uses. The decisions both make from the same facts (which checks apply, what a refusal says) are here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from servlane_core.protocol.errors import OpenAIError

Clock = Callable[[], float]


class TokenBucket:
    def __init__(self, per_minute: float, clock: Clock = time.monotonic) -> None:
        if per_minute <= 0:
            raise ValueError("a bucket needs a positive rate")
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0  # per second
        self.level = float(per_minute)
        self._clock = clock
        self._updated = clock()

    def _refill(self) -> None:
        now = self._clock()
        self.level = min(self.capacity, self.level + (now - self._updated) * self.rate)
        self._updated = now

    def wait_for(self, amount: float) -> float:
        """Seconds until `amount` could be taken (0 when it can be now); takes nothing."""
        self._refill()
        missing = min(amount, self.capacity) - self.level
        return 0.0 if missing <= 0 else missing / self.rate

    def take(self, amount: float) -> None:
        """Take unconditionally (may go into debt): for charging what was already spent."""
        self._refill()
        self.level -= amount

    def available(self) -> float:
        """The level now, refilled (negative: in debt)."""
        self._refill()
        return self.level

    def give_back(self, amount: float) -> None:
        """Return part of a reservation; never above capacity (the bucket refilled meanwhile)."""
        self._refill()
        self.level = min(self.capacity, self.level + amount)


@dataclass(frozen=True)
class Limits:
    requests_per_minute: float = 0  # 0: unlimited
    tokens_per_minute: float = 0
    max_in_flight: int = 0  # requests admitted and not yet ended; 0: unlimited

    @property
    def limits_anything(self) -> bool:
        return self.requests_per_minute > 0 or self.tokens_per_minute > 0 or self.max_in_flight > 0


Scope = Literal["key", "feature"]
Kind = Literal["requests", "tokens", "in_flight"]


@dataclass(frozen=True)
class Check:
    """One limit a request is admitted by: `limit` per minute (requests, tokens) or at once (in_flight)."""

    scope: Scope
    name: str  # the key's name, or the feature's "namespace/name"
    kind: Kind
    limit: float

    def describe(self) -> str:
        """What a 429 says about this limit."""
        if self.kind == "in_flight":
            return f"{int(self.limit)} concurrent requests for this {self.scope}"
        what = "requests" if self.kind == "requests" else "tokens"
        return f"{what} per minute for this {self.scope}"


def plan_checks(
    per_key: Limits, per_feature: Limits, key_name: str | None, namespace: str, feature: str
) -> list[Check]:
    """The limits that apply to a request, key first: the ones configured (non-zero) for its key (with
    access control on) and for its feature, named by the feature's namespace."""
    scopes: list[tuple[Scope, str, Limits]] = [("feature", f"{namespace}/{feature}", per_feature)]
    if key_name is not None:
        scopes.insert(0, ("key", key_name, per_key))
    checks: list[Check] = []
    for scope, name, limits in scopes:
        kinds: tuple[tuple[Kind, float], ...] = (
            ("requests", limits.requests_per_minute),
            ("tokens", limits.tokens_per_minute),
            ("in_flight", float(limits.max_in_flight)),
        )
        for kind, limit in kinds:
            if limit > 0:
                checks.append(Check(scope, name, kind, limit))
    return checks


def refusal(waits: list[tuple[float, str]]) -> OpenAIError | None:
    """The 429 for the longest of the waits (seconds, what waits), or None when none waits."""
    wait, what = max(waits, default=(0.0, ""))
    if wait <= 0:
        return None
    message = f"Rate limit reached: {what}."
    return OpenAIError(429, message, type="rate_limit_error", code="rate_limit_exceeded", retry_after=math.ceil(wait))


# When a place in flight frees is not known; a second is a short, honest wait.
IN_FLIGHT_RETRY_AFTER = 1.0


class Hold(Protocol):
    """An admitted request's hold on a limiter, released by `settle` (see `Admission.settle`)."""

    reserved: int

    def settle(self, tokens: int | None) -> None: ...


class Limiter(Protocol):
    """What the request path needs of a limiter, in memory or shared."""

    mode: str  # "memory" or "redis": logged at start and exported as a metric label

    async def acquire(self, key_name: str | None, namespace: str, feature: str, reserve_tokens: int = 0) -> Hold:
        """Admit by every applicable limit or raise the 429 (a shared store it cannot reach: 503)."""
        ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


@dataclass
class _Buckets:
    requests: TokenBucket | None
    tokens: TokenBucket | None


ENDPOINTS_WITHOUT_COMPLETION = ("embeddings",)
DEFAULT_RESERVED_COMPLETION_TOKENS = 256  # for a completion without max_tokens; the runtime then allows the context
BYTES_PER_PROMPT_TOKEN = 4  # text is rarely denser; the JSON around it makes the estimate larger, not smaller


# More tokens than any request uses (a float counts integers exactly up to 2**53): what a reservation's estimate
# and a reported usage are cut to, so that arithmetic on buckets never overflows or loses the count.
MAX_CHARGED_TOKENS = 1 << 50


def bounded_reservation(checks: list[Check], estimate: int) -> int:
    """What a request reserves of its token buckets: its estimate, at most the smallest token limit among
    `checks` (one minute's allowance: see the module's docstring), and at most MAX_CHARGED_TOKENS."""
    reservation = min(estimate, MAX_CHARGED_TOKENS)
    for check in checks:
        if check.kind == "tokens":
            reservation = min(reservation, int(check.limit))
    return max(reservation, 0)


def charged_tokens(tokens: int) -> int:
    """A reported usage as it is charged: a backend's number, never more than MAX_CHARGED_TOKENS."""
    return min(max(tokens, 0), MAX_CHARGED_TOKENS)


def estimate_tokens(body: dict[str, Any], body_bytes: int, endpoint: str, default_completion: int) -> int:
    """The tokens reserved for a request at admission: its prompt, estimated from the body's size in bytes
    (the real count needs the backend's tokenizer), plus its completion allowance: `max_completion_tokens`
    or `max_tokens` (the feature's cap already applied), else `default_completion`, times `n`."""
    prompt = body_bytes // BYTES_PER_PROMPT_TOKEN
    if endpoint in ENDPOINTS_WITHOUT_COMPLETION:
        return prompt
    allowance = default_completion
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            allowance = value
            break
    n = body.get("n")
    choices = n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1
    # Cut before multiplying: the client's numbers may have thousands of digits.
    return prompt + min(allowance, MAX_CHARGED_TOKENS) * min(choices, MAX_CHARGED_TOKENS)


class Admission:
    """One admitted request's hold on the limiter: its in-flight places and its token reservation, both
    released exactly once by `settle` (later calls do nothing)."""

    def __init__(self, limiter: RateLimiter, places: list[tuple[str, str]], buckets: list[TokenBucket], reserved: int):
        self._limiter = limiter
        self._places = places
        self._buckets = buckets
        self.reserved = reserved
        self.settled = False

    def settle(self, tokens: int | None) -> None:
        """The request ended having used `tokens` (its reported usage; 0 when it surely used none, e.g. the
        backend answered an error). None: unknown though it may have generated (the client left, the stream
        was cut or timed out, no usage was reported), so the reservation stands as the charge."""
        if self.settled:
            return
        self.settled = True
        for place in self._places:
            self._limiter._leave(place)
        if tokens is None:
            return
        difference = charged_tokens(tokens) - self.reserved
        for bucket in self._buckets:
            if difference > 0:
                bucket.take(difference)
            elif difference < 0:
                bucket.give_back(-difference)


@dataclass
class RateLimiter:
    """Buckets per (scope, name), e.g. ("key", "team-a") or ("feature", "prod/chat"), created on first use."""

    per_key: Limits = field(default_factory=Limits)
    per_feature: Limits = field(default_factory=Limits)
    clock: Clock = time.monotonic
    mode: str = field(default="memory", init=False)
    _buckets: dict[tuple[str, str], _Buckets] = field(default_factory=dict)
    _in_flight: dict[tuple[str, str], int] = field(default_factory=dict)

    def _limits(self, scope: str) -> Limits:
        return self.per_key if scope == "key" else self.per_feature

    def _get(self, scope: str, name: str) -> _Buckets:
        found = self._buckets.get((scope, name))
        if found is None:
            limits = self._limits(scope)
            rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
            found = _Buckets(
                TokenBucket(rpm, self.clock) if rpm > 0 else None,
                TokenBucket(tpm, self.clock) if tpm > 0 else None,
            )
            self._buckets[(scope, name)] = found
        return found

    def _scopes(self, key_name: str | None, namespace: str, feature: str) -> list[tuple[str, str, _Buckets]]:
        name = f"{namespace}/{feature}"
        scopes = [("feature", name, self._get("feature", name))]
        if key_name is not None:
            scopes.insert(0, ("key", key_name, self._get("key", key_name)))
        return scopes

    def in_flight(self, scope: str, name: str) -> int:
        """Requests of ("key", name) or ("feature", "namespace/name") admitted and not yet ended, where
        that scope has an in-flight cap (only those are counted)."""
        return self._in_flight.get((scope, name), 0)

    def tokens_left(self, scope: str, name: str) -> float | None:
        """The token bucket's level now (negative: in debt), or None without a token limit."""
        bucket = self._get(scope, name).tokens
        if bucket is None:
            return None
        return bucket.available()

    def _leave(self, place: tuple[str, str]) -> None:
        left = self._in_flight.get(place, 0) - 1
        if left > 0:
            self._in_flight[place] = left
        else:
            self._in_flight.pop(place, None)

    def admit(self, key_name: str | None, namespace: str, feature: str, reserve_tokens: int = 0) -> Admission:
        """Take one request from every applicable bucket, a place in flight and `reserve_tokens` from every
        token bucket, or none of it and raise 429 with Retry-After. `namespace`/`feature`: the resolved
        route's, never the name the client sent. The caller settles the returned Admission when it ends."""
        if not (self.per_key.limits_anything or self.per_feature.limits_anything):
            return Admission(self, [], [], reserve_tokens)  # nothing to take, count or settle
        waits: list[tuple[float, str]] = []
        scopes = self._scopes(key_name, namespace, feature)
        checks = plan_checks(self.per_key, self.per_feature, key_name, namespace, feature)
        reserve_tokens = bounded_reservation(checks, reserve_tokens)
        for check in checks:
            buckets = self._get(check.scope, check.name)
            if check.kind == "requests" and buckets.requests is not None:
                waits.append((buckets.requests.wait_for(1), check.describe()))
            elif check.kind == "tokens" and buckets.tokens is not None:
                # Admitted while not in debt: at least one token left.
                waits.append((buckets.tokens.wait_for(1), check.describe()))
            elif check.kind == "in_flight" and self.in_flight(check.scope, check.name) >= check.limit:
                waits.append((IN_FLIGHT_RETRY_AFTER, check.describe()))
        refused = refusal(waits)
        if refused is not None:
            raise refused
        places: list[tuple[str, str]] = []
        token_buckets: list[TokenBucket] = []
        for scope, name, buckets in scopes:
            if buckets.requests is not None:
                buckets.requests.take(1)
            if buckets.tokens is not None:
                buckets.tokens.take(reserve_tokens)
                token_buckets.append(buckets.tokens)
            if self._limits(scope).max_in_flight > 0:
                self._in_flight[(scope, name)] = self.in_flight(scope, name) + 1
                places.append((scope, name))
        return Admission(self, places, token_buckets, reserve_tokens)

    async def acquire(self, key_name: str | None, namespace: str, feature: str, reserve_tokens: int = 0) -> Hold:
        return self.admit(key_name, namespace, feature, reserve_tokens)

    async def start(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    def charge_tokens(self, key_name: str | None, namespace: str, feature: str, tokens: int) -> None:
        tokens = charged_tokens(tokens)
        for _, _, buckets in self._scopes(key_name, namespace, feature):
            if buckets.tokens is not None and tokens > 0:
                buckets.tokens.take(tokens)
