"""Token buckets for requests and tokens per minute, per API key and per feature.

A feature's buckets are keyed by its namespace and name: team A's `chat` and team B's `chat` are two
features with two budgets, never one shared by whoever calls either.

Requests are taken before proxying. Tokens are not known until the backend answers, so a request is
admitted while the token bucket is not in debt, and the usage it reports is charged afterwards (the
bucket may go negative, which holds back the next requests until it refills). A bucket holds at most
one minute's allowance, so a limit of N per minute allows a burst of N, then N/60 per second.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class Limits:
    requests_per_minute: float = 0  # 0: unlimited
    tokens_per_minute: float = 0


@dataclass
class _Buckets:
    requests: TokenBucket | None
    tokens: TokenBucket | None


@dataclass
class RateLimiter:
    """Buckets per (scope, name), e.g. ("key", "team-a") or ("feature", "prod/chat"), created on first use."""

    per_key: Limits = field(default_factory=Limits)
    per_feature: Limits = field(default_factory=Limits)
    clock: Clock = time.monotonic
    _buckets: dict[tuple[str, str], _Buckets] = field(default_factory=dict)

    def _get(self, scope: str, name: str) -> _Buckets:
        found = self._buckets.get((scope, name))
        if found is None:
            limits = self.per_key if scope == "key" else self.per_feature
            rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
            found = _Buckets(
                TokenBucket(rpm, self.clock) if rpm > 0 else None,
                TokenBucket(tpm, self.clock) if tpm > 0 else None,
            )
            self._buckets[(scope, name)] = found
        return found

    def _scopes(self, key_name: str | None, namespace: str, feature: str) -> list[tuple[str, _Buckets]]:
        scopes = [("feature", self._get("feature", f"{namespace}/{feature}"))]
        if key_name is not None:
            scopes.insert(0, ("key", self._get("key", key_name)))
        return scopes

    def admit(self, key_name: str | None, namespace: str, feature: str) -> None:
        """Take one request from every applicable bucket, or none of them and raise 429 with Retry-After.
        `namespace`/`feature`: the resolved route's, never the name the client sent."""
        waits: list[tuple[float, str]] = []
        scopes = self._scopes(key_name, namespace, feature)
        for scope, buckets in scopes:
            if buckets.requests is not None:
                waits.append((buckets.requests.wait_for(1), f"requests per minute for this {scope}"))
            if buckets.tokens is not None:
                # Admitted while not in debt: at least one token left.
                waits.append((buckets.tokens.wait_for(1), f"tokens per minute for this {scope}"))
        wait, what = max(waits, default=(0.0, ""))
        if wait > 0:
            message = f"Rate limit reached: {what}."
            raise OpenAIError(
                429, message, type="rate_limit_error", code="rate_limit_exceeded", retry_after=math.ceil(wait)
            )
        for _, buckets in scopes:
            if buckets.requests is not None:
                buckets.requests.take(1)

    def charge_tokens(self, key_name: str | None, namespace: str, feature: str, tokens: int) -> None:
        for _, buckets in self._scopes(key_name, namespace, feature):
            if buckets.tokens is not None and tokens > 0:
                buckets.tokens.take(tokens)
