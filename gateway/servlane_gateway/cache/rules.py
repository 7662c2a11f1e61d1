"""The response cache's pure part: which requests are deterministic, their key, and which answers are kept.

A feature opts in with `spec.responseCache.enabled`. Then a request is looked up, and its answer kept,
only when the answer cannot vary: `temperature` 0 (greedy) or a `seed`, after the feature's defaults
were applied; an embeddings request always (no sampling). Never with `tools` or `functions` (the caller
usually acts on the answer, and tool results feed the next turn), never for `n` or `best_of` above 1
without a seed (several samples of one request are drawn from one generator only when seeded).

The key is a digest of the canonical request (JSON, sorted keys) and of what answers it: the endpoint,
the route's namespace and feature, and the AIModel the request was routed to (name, served name and
`answer_version`, a digest of its spec), so a rollout, a canary step or a spec change never serves another
version's answer. Left out of the request: `model` (the client's name for the route, which the route
itself stands for), `user` (an end-user id for abuse tracking: it does not change the answer, so callers
share the answers of a feature) and `stream_options` (streams are kept with their usage chunk and that is
cut on replay when not asked for). `stream` stays in: a stream and a JSON answer cannot be turned into
one another exactly (ids, chunking), so each is kept apart. Keys are scoped by namespace and feature, so
one namespace never reads another's answers; the feature's bounds hold per feature, clamped by the admin's
(`CacheBudget`: a cap, a share per namespace, a size per answer), which no feature can raise.

Kept: 200 answers only, whose choices all finished with a reason other than `error` or `abort`; a stream
only when it ended with `data: [DONE]` and carried no error event.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from servlane_api.aifeature import ResponseCache
from servlane_core.routing.routes import Backend, Route

CACHE_HEADER = "x-servlane-cache"  # hit, miss or coalesced, on every answer of a request the cache looked up
HIT = "hit"
MISS = "miss"
COALESCED = "coalesced"  # the answer of an identical request that was in flight when this one missed
IGNORED_FIELDS = frozenset({"model", "user", "stream_options"})
FAILED_FINISH = frozenset({"error", "abort"})
SAMPLING_ENDPOINTS = ("chat/completions", "completions")
EMBEDDINGS = "embeddings"


@dataclass(frozen=True)
class CacheKey:
    namespace: str
    feature: str
    digest: str  # sha256 of the canonical request and the answering model's identity


@dataclass(frozen=True)
class Entry:
    """One kept answer: a JSON body, or a stream's bytes as the backend sent them (its usage chunk in)."""

    stream: bool
    content_type: str
    body: bytes

    def encode(self) -> bytes:
        """As stored in Redis: a JSON header line, then the body."""
        head = json.dumps({"stream": self.stream, "content_type": self.content_type}).encode()
        return head + b"\n" + self.body

    @classmethod
    def decode(cls, data: bytes) -> Entry | None:
        """None for bytes that are not an entry (written by another version of the gateway, say)."""
        head, newline, body = data.partition(b"\n")
        try:
            meta = json.loads(head)
        except ValueError:
            return None
        if not newline or not isinstance(meta, dict):
            return None
        stream, content_type = meta.get("stream"), meta.get("content_type")
        if not isinstance(stream, bool) or not isinstance(content_type, str):
            return None
        return cls(stream, content_type, body)


def _number(value: object) -> int | float | None:
    """A JSON number as parsed (not converted: an integer may be too large for a float), else None."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def refusal(body: dict[str, Any], endpoint: str) -> str | None:
    """Why this request's answer may vary (so it is neither looked up nor kept); None when it cannot."""
    if endpoint == EMBEDDINGS:
        return None
    if endpoint not in SAMPLING_ENDPOINTS:
        return "endpoint"
    if body.get("tools") or body.get("functions"):
        return "tools"
    seeded = _number(body.get("seed")) is not None
    if not seeded and _number(body.get("temperature")) != 0:
        return "sampled"
    for count in ("n", "best_of"):
        value = body.get(count)
        if value is not None and value != 1 and not seeded:
            return "several samples"
    return None


def cache_key(body: dict[str, Any], endpoint: str, route: Route, backend: Backend) -> CacheKey:
    request = {k: v for k, v in body.items() if k not in IGNORED_FIELDS}
    request["stream"] = body.get("stream") is True
    # include_usage is the gateway's to add and cut (the relay strips the usage chunk for whoever did not ask);
    # any other stream option may change the answer (vLLM's continuous_usage_stats puts usage in every chunk).
    options = body.get("stream_options")
    if options is not None:
        rest = {k: v for k, v in options.items() if k != "include_usage"} if isinstance(options, dict) else options
        if rest:
            request["stream_options"] = rest
    identity = {
        "endpoint": endpoint,
        "namespace": route.namespace,
        "feature": route.name,
        "model": [backend.namespace, backend.model, backend.served_model_name, backend.version],
        "request": request,
    }
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return CacheKey(route.namespace, route.name, hashlib.sha256(canonical.encode()).hexdigest())


def lookup_key(body: dict[str, Any], endpoint: str, route: Route, backend: Backend | None) -> CacheKey | None:
    """The key to look up and keep this request's answer under; None when the cache stays out of it."""
    if backend is None or not route.is_feature or not route.response_cache.enabled:
        return None
    if not backend.version or refusal(body, endpoint) is not None:
        return None
    return cache_key(body, endpoint, route, backend)


def _finished(choices: object) -> bool:
    if not isinstance(choices, list):
        return False
    reasons = [c.get("finish_reason") for c in choices if isinstance(c, dict)]
    return bool(reasons) and len(reasons) == len(choices) and all(r and r not in FAILED_FINISH for r in reasons)


def json_keepable(content: bytes) -> bool:
    """A whole answer worth keeping: an object without error, whose choices all finished well (an
    embeddings answer has data instead)."""
    try:
        answer = json.loads(content)
    except ValueError:
        return False
    if not isinstance(answer, dict) or answer.get("error") is not None:
        return False
    if "choices" in answer:
        return _finished(answer["choices"])
    return isinstance(answer.get("data"), list)


def stream_keepable(content: bytes) -> bool:
    """A stream worth keeping: ended with `data: [DONE]`, no error event, and every choice index it
    streamed finished with a reason other than error or abort."""
    done = False
    reasons: dict[object, object] = {}
    for line in content.splitlines():
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            done = True
            continue
        try:
            event = json.loads(payload)
        except ValueError:
            return False
        if not isinstance(event, dict) or event.get("error") is not None:
            return False
        for choice in event.get("choices") or []:
            if isinstance(choice, dict):
                reasons.setdefault(choice.get("index"), None)
                if choice.get("finish_reason") is not None:
                    reasons[choice.get("index")] = choice["finish_reason"]
    return done and bool(reasons) and all(r and r not in FAILED_FINISH for r in reasons.values())


@dataclass
class Recorder:
    """A stream's bytes as they arrive, up to `limit`: a longer stream is not kept."""

    limit: int
    parts: list[bytes] = field(default_factory=list)
    size: int = 0
    overflow: bool = False

    def __call__(self, chunk: bytes) -> None:
        if self.overflow:
            return
        self.size += len(chunk)
        if self.size > self.limit:
            self.overflow, self.parts = True, []
            return
        self.parts.append(chunk)

    def content(self) -> bytes | None:
        return None if self.overflow else b"".join(self.parts)


@dataclass
class Caching:
    """A request the cache looked up and missed: where to keep its answer, and a stream's bytes so far."""

    key: CacheKey
    policy: ResponseCache
    content_type: str = "application/json"
    recorder: Recorder | None = None


DEFAULT_CACHE_MAX_BYTES = 256 << 20  # per gateway process in memory; in all with a Redis
DEFAULT_MAX_ENTRY_BYTES = 4 << 20  # larger answers are relayed, never kept
NAMESPACE_SHARE_DIVISOR = 4  # without a namespace share set: a quarter of the cap


@dataclass(frozen=True)
class Bounds:
    """What one store of a feature's answer may take: the feature's own bounds clamped by the admin's."""

    ttl_seconds: int
    max_entries: int  # of the feature
    feature_bytes: int  # of the feature: min(its maxBytes, its namespace's share, the cap)
    namespace_bytes: int  # of all the features of its namespace together
    total_bytes: int  # of every namespace together
    entry_bytes: int  # of one answer

    def fits(self, entry: Entry) -> bool:
        return len(entry.body) <= self.entry_bytes


@dataclass(frozen=True)
class CacheBudget:
    """The admin's bounds over the cache (gateway settings), which no AIFeature can raise: a cap on every
    namespace's answers together, each namespace's share of it, and the size of one answer.

    A namespace's answers evict only that namespace's own (oldest first), so the share is what a namespace
    can hold at most and what no other can take from it once held. The cap is hard too: a store that would
    pass it evicts older answers of the storing namespace only, and is refused when they do not make room,
    so namespaces that filled their shares make others wait for expiry, never lose answers to them. With
    the default share (a quarter of the cap) any four namespaces can fill theirs.
    """

    max_bytes: int = DEFAULT_CACHE_MAX_BYTES
    namespace_max_bytes: int | None = None  # None: max_bytes // NAMESPACE_SHARE_DIVISOR
    max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES

    @property
    def namespace_share(self) -> int:
        share = self.namespace_max_bytes
        return min(self.max_bytes // NAMESPACE_SHARE_DIVISOR if share is None else share, self.max_bytes)

    def bounds(self, policy: ResponseCache) -> Bounds:
        feature_bytes = min(policy.max_bytes, self.namespace_share, self.max_bytes)
        return Bounds(
            ttl_seconds=policy.ttl_seconds,
            max_entries=policy.max_entries,
            feature_bytes=feature_bytes,
            namespace_bytes=self.namespace_share,
            total_bytes=self.max_bytes,
            entry_bytes=min(self.max_entry_bytes, feature_bytes),
        )


def redis_database(url: str) -> int:
    """The database a Redis URL selects, as redis-py reads it: `?db=N`, else the path `/N`, else 0."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    path = parts.path.strip("/") if parts.scheme != "unix" else ""
    value = query.get("db") or path or "0"
    if not value.isdigit():
        raise ValueError("the Redis URL's database is not a number")
    return int(value)


def redis_location(url: str) -> tuple[str | None, int | None, str, int]:
    """Which database of which server a URL names (host, port, socket path, database): never its password."""
    parts = urlsplit(url)
    socket = parts.path if parts.scheme == "unix" else ""
    return parts.hostname, parts.port, socket, redis_database(url)


def with_database(url: str, database: int) -> str:
    """The same Redis URL (its password kept) selecting another database."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "db"]
    if parts.scheme == "unix":
        return urlunsplit(parts._replace(query=urlencode([*query, ("db", str(database))])))
    return urlunsplit(parts._replace(path=f"/{database}", query=urlencode(query)))
