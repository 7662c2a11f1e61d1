"""The pure part of the limits shared by the gateway replicas through Redis (`redis_limiter` does the I/O).

Here: the store's key names, what the scripts are sent for a request and what their answers mean, and the
Redis URL as a log may show it. The bucket arithmetic is `rates.TokenBucket`'s, done inside Redis by
the scripts (so that it is atomic across replicas and reads Redis' clock, not the replicas').

Key layout, under a configurable prefix (the chart's: `servlane:<release namespace>:<gateway>`, so two
installations sharing one Redis never share a budget): `<prefix>:key:<key name>:<kind>` and
`<prefix>:feature:<namespace>/<feature>:<kind>`, kind being `requests`, `tokens` (hashes: level and
last refill time) or `in_flight` (a sorted set: one member per admitted request, scored by when its lease
ends). The kind is the last part and holds no `:`, so no two checks share a key whatever their names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from servlane_core.protocol.errors import OpenAIError
from servlane_gateway.limits.rates import IN_FLIGHT_RETRY_AFTER, Check, refusal

MICROS = 1_000_000
# The part of the lease after which a replica renews the leases of its requests in flight: a lease then
# survives two failed renewals (a Redis hiccup) before the request stops being counted.
RENEW_FRACTION = 1 / 3


def store_key(prefix: str, check: Check) -> str:
    return f"{prefix}:{check.scope}:{check.name}:{check.kind}"


@dataclass(frozen=True)
class ScriptCall:
    keys: list[str]
    args: list[str]


def admit_call(prefix: str, checks: Sequence[Check], reserve_tokens: int, member: str, lease: float) -> ScriptCall:
    """The admission script's keys and arguments: reserve, member, lease (µs), then per check kind and limit."""
    args = [str(reserve_tokens), member, str(round(lease * MICROS))]
    for check in checks:
        args += [check.kind, repr(float(check.limit))]
    return ScriptCall([store_key(prefix, c) for c in checks], args)


def admit_refusal(checks: Sequence[Check], reply: Sequence[int]) -> OpenAIError | None:
    """The admission script's answer: [admitted (1/0), then per check its wait in ms (0: none; an in-flight
    check: non-zero when full)]. None when admitted, else the 429 an in-memory limiter would give."""
    admitted, waits = int(reply[0]), [int(w) for w in reply[1:]]
    if len(waits) != len(checks):
        raise ValueError(f"the admission script answered {len(waits)} waits for {len(checks)} checks")
    if admitted:
        return None
    found = [
        (IN_FLIGHT_RETRY_AFTER if c.kind == "in_flight" else w / 1000, c.describe())
        for c, w in zip(checks, waits, strict=True)
        if w > 0
    ]
    # Refused with no wait named cannot happen with the script as written; still a 429, never an admission.
    return refusal(found) or refusal([(IN_FLIGHT_RETRY_AFTER, "a limit of this request")])


def settle_call(prefix: str, checks: Sequence[Check], member: str, difference: int) -> ScriptCall:
    """The settle script's keys and arguments: the token buckets to take `difference` from (negative: give
    back), then the in-flight sets to leave; args: member, difference, how many buckets, their limits."""
    tokens = [c for c in checks if c.kind == "tokens"] if difference else []
    places = [c for c in checks if c.kind == "in_flight"]
    args = [member, str(difference), str(len(tokens)), *(repr(float(c.limit)) for c in tokens)]
    return ScriptCall([store_key(prefix, c) for c in [*tokens, *places]], args)


def renew_call(places: Sequence[tuple[str, str]], lease: float) -> ScriptCall:
    """The lease renewal's keys (in-flight sets) and arguments: lease (µs), then the member held in each."""
    return ScriptCall([key for key, _ in places], [str(round(lease * MICROS)), *(member for _, member in places)])


def redact_url(url: str) -> str:
    """The URL with its password (if any) replaced by ***, for logs; unparseable: a placeholder only."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return "<a Redis URL that does not parse>"
    query = "***" if "pass" in parts.query.lower() else parts.query  # a password given as a query argument
    if "@" not in parts.netloc:
        return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))
    user = parts.username or ""
    credentials = f"{user}:***" if parts.password is not None else user
    if ":" in host:  # an IPv6 address goes back in brackets
        host = f"[{host}]"
    return urlunsplit((parts.scheme, f"{credentials}@{host}{port}", parts.path, query, parts.fragment))
