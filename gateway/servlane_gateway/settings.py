"""The gateway's settings, checked (types, schemes, names, combinations that cannot work); read from the
flags and the environment by servlane_gateway.flags."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from servlane_api.children import DEFAULT_CLUSTER_DOMAIN
from servlane_api.runtime_config import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_JSON_DEPTH, DEFAULT_MAX_LIST_ITEMS
from servlane_core.routing.overrides import parse_override_env, parse_override_items
from servlane_gateway.cache.rules import (
    DEFAULT_CACHE_MAX_BYTES,
    DEFAULT_MAX_ENTRY_BYTES,
    redis_database,
    redis_location,
    with_database,
)
from servlane_gateway.http.upstream import DEFAULT_MAX_IDLE_SECONDS, DEFAULT_MAX_LIFETIME_SECONDS
from servlane_gateway.limits.rates import DEFAULT_RESERVED_COMPLETION_TOKENS

BATCH_DATABASE_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg", "sqlite")
NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class GatewaySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "0.0.0.0"
    port: int = Field(default=8080, ge=0, le=65535)
    metrics_port: int = Field(
        default=9090,
        ge=1,
        le=65535,
        description="Port of /metrics (the API port has none): what it lists (every namespace's traffic, trace "
        "ids) is for the scraper alone, which a NetworkPolicy can then admit to this port only.",
    )
    workers: int = Field(
        default=0,
        ge=0,
        le=64,
        description="Processes serving requests on the one port; 0: one per CPU the gateway is given (its "
        "cgroup CPU limit, else the CPUs it may run on), at most 8, and 1 where one process must hold the state "
        "(rate limits without --redis-url, a SQLite batch database), which also refuses more.",
    )
    routes_file: Path | None = Field(default=None, description="YAML/JSON AIFeature+AIModel objects; else watch.")
    watch: bool = Field(default=False, description="Watch AIFeature/AIModel objects in the cluster.")
    namespaces: list[str] = Field(default_factory=list, description="Namespaces to watch; empty: all.")
    cluster_domain: str = Field(
        default=DEFAULT_CLUSTER_DOMAIN,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        description="With --watch, each AIModel is called at its own Service, "
        "model-<name>.<namespace>.svc.<cluster domain> (never at the status' endpoint, which whoever may "
        "patch an AIModel's status could point anywhere); the operator's clusterDomain.",
    )
    serving_namespaces: list[str] = Field(
        default_factory=list,
        description="Where plain model names resolve for callers whose API key names no namespace (a name "
        "several of them hold is ambiguous: refused, 400); other namespaces only as <namespace>/<name>. "
        "Default: with --routes-file 'default'; with --watch "
        "--namespaces, those; watching all namespaces, the gateway's own namespace.",
    )
    keys_file: Path | None = Field(default=None, description="API keys file; none: access control off.")
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1, description="Larger bodies are a 413.")
    max_json_depth: int = Field(
        default=DEFAULT_MAX_JSON_DEPTH, ge=2, le=128, description="Deeper JSON nesting is a 400."
    )
    max_list_items: int = Field(
        default=DEFAULT_MAX_LIST_ITEMS, ge=1, description="Longer JSON arrays (messages, prompt, input) are a 400."
    )
    key_requests_per_minute: float = Field(default=0, ge=0, description="Per API key; 0: unlimited.")
    key_tokens_per_minute: float = Field(default=0, ge=0)
    feature_requests_per_minute: float = Field(default=0, ge=0, description="Per feature; 0: unlimited.")
    feature_tokens_per_minute: float = Field(default=0, ge=0)
    key_max_in_flight: int = Field(
        default=0, ge=0, description="Most requests of one API key in flight at once (more: 429); 0: unlimited."
    )
    reserved_completion_tokens: int = Field(
        default=DEFAULT_RESERVED_COMPLETION_TOKENS,
        ge=0,
        description="Tokens reserved against token limits for a completion that sets no max_tokens, until "
        "its usage is known.",
    )
    redis_url: SecretStr | None = Field(
        default=None,
        description="redis://[user:password@]host:port/db (or rediss://, unix://): the rate limits and quotas "
        "are shared by every gateway replica given this Redis; unset: each replica keeps its own, in memory.",
    )
    redis_password: SecretStr | None = Field(
        default=None,
        description="The Redis password when the URL carries none (set it through the environment: a flag "
        "shows in the process list).",
    )
    redis_key_prefix: str = Field(
        default="servlane-gateway",
        pattern=r"^[^\s]+$",
        description="Prefix of the gateway's Redis keys: gateways with the same prefix share their budgets.",
    )
    redis_timeout: float = Field(
        default=0.5, gt=0, description="Seconds to connect to Redis and for each answer (a call ends within 4x)."
    )
    redis_in_flight_lease: float = Field(
        default=30.0,
        gt=0,
        description="Seconds a request's place in flight is held in Redis without renewal: the places of a "
        "replica that dies free themselves within this.",
    )
    cache_max_bytes: int = Field(
        default=DEFAULT_CACHE_MAX_BYTES,
        ge=0,
        description="Most bytes of response-cache answers, every namespace together: per gateway process in "
        "memory, in all in Redis. No AIFeature's maxBytes goes above it; 0: nothing is cached.",
    )
    cache_namespace_max_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Most bytes of response-cache answers of one namespace, all its features together (its "
        "answers evict only its own); default: a quarter of --cache-max-bytes.",
    )
    cache_max_entry_bytes: int = Field(
        default=DEFAULT_MAX_ENTRY_BYTES,
        ge=0,
        description="Largest answer the response cache keeps (a stream is held in memory up to this).",
    )
    cache_redis_url: SecretStr | None = Field(
        default=None,
        description="A Redis of the response cache's own (redis://, rediss://, unix://, its password in it: "
        "--redis-password is the limits'); unset: the rate limits' --redis-url at --cache-redis-database, else "
        "memory.",
    )
    cache_redis_database: int | None = Field(
        default=None,
        ge=0,
        description="The database of the rate limits' Redis that the response cache uses when it has no "
        "--cache-redis-url, never the limits' own; default: the limits' database + 1.",
    )
    connect_timeout: float = Field(default=5.0, gt=0)
    first_byte_timeout: float = Field(default=300.0, gt=0)
    idle_timeout: float = Field(default=60.0, gt=0)
    client_head_timeout: float = Field(
        default=30.0, gt=0, description="A request's head must arrive whole within this of its first byte; else 408."
    )
    client_body_timeout: float = Field(
        default=60.0, gt=0, description="Longest pause while a request's body arrives; else 408."
    )
    client_read_stall_timeout: float = Field(
        default=60.0,
        gt=0,
        description="Longest a client may leave its answer unread with the socket's buffers full; else the "
        "connection is cut (and the request upstream with it).",
    )
    upstream_max_idle_seconds: float = Field(
        default=DEFAULT_MAX_IDLE_SECONDS, gt=0, description="A pooled backend connection idle longer is closed."
    )
    upstream_max_lifetime_seconds: float = Field(
        default=DEFAULT_MAX_LIFETIME_SECONDS,
        gt=0,
        description="A pooled backend connection open longer is closed, not reused (so one never pins a pod).",
    )
    unavailable_retry_after: float = Field(default=5.0, gt=0, description="Retry-After when no backend is ready.")
    reload_poll_seconds: float = Field(default=0.2, gt=0, description="How often the files are checked.")
    hold_max_per_model: int = Field(
        default=100,
        ge=0,
        le=100_000,
        description="Requests held at once for one AIModel with no ready pod (at zero, or starting) while it "
        "wakes; more: 429 with Retry-After. 0: never hold (503 at once). Per gateway process.",
    )
    hold_max_per_namespace: int = Field(
        default=200,
        ge=0,
        le=1_000_000,
        description="Requests held at once for all of one namespace's models; more: 429 with Retry-After "
        "(one team's flood never takes another's places). Per gateway process.",
    )
    hold_max_wait_seconds: float = Field(
        default=300.0, gt=0, le=3600, description="Longest a request is held for a pod; then 503 with Retry-After."
    )
    hold_keep_alive_seconds: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="A held stream gets its 200 head at once and an SSE comment this often while it waits, so "
        "proxies and SDKs do not time it out.",
    )
    log_level: str = "info"
    batch_database_url: SecretStr | None = Field(
        default=None,
        description="The Batch API's database: postgresql://user:password@host/db (shared by the replicas) or "
        "sqlite:///path (one process); unset: /v1/files and /v1/batches answer that the Batch API is off.",
    )
    batch_concurrency_per_feature: int = Field(
        default=4, ge=1, description="Most batch requests in flight per feature on each replica."
    )
    batch_lease_seconds: float = Field(
        default=60.0,
        gt=0,
        description="Seconds a replica's claim on batch work lasts without renewal: the work of a replica that "
        "dies is taken over after this.",
    )
    batch_poll_seconds: float = Field(default=1.0, gt=0, description="How often idle workers look for batch work.")
    batch_max_file_bytes: int = Field(default=200 * 1024 * 1024, ge=1, description="Largest batch input file.")
    batch_max_owner_bytes: int = Field(
        default=10 * 1024 * 1024 * 1024,
        ge=1,
        description="Most bytes one API key may keep in the Batch API's database: its files (inputs and results) "
        "and, for each of its batches not yet ended, a copy of its input and the answers recorded so far; an "
        "upload or a batch past it is refused (403 storage_quota_exceeded) until files are deleted or batches "
        "end, and an answer past it is not kept and cancels its batch.",
    )
    batch_uploads_at_once: int = Field(
        default=4,
        ge=1,
        description="Most uploads to /v1/files received at once by each replica (each holds a database "
        "connection and a chunk of its file in memory while its sender sends); more: 503 with Retry-After.",
    )
    batch_uploads_at_once_per_key: int = Field(
        default=2,
        ge=1,
        description="Most uploads one API key has received at once by each replica, so that one key's slow "
        "uploads cannot take every place; more: 503 with Retry-After.",
    )
    batch_allow_without_keys: bool = Field(
        default=False,
        description="Serve the Batch API without a keys file. Dangerous: batches belong to the key that "
        "created them, so without keys every caller is the same owner and can read everyone's files and "
        "results. Only for a gateway with a single user (servlane serve sets it).",
    )
    console_enabled: bool = Field(
        default=True, description="Serve the read-only console at /console (behind the same keys as /v1/models)."
    )
    console_slow_seconds: float = Field(
        default=10.0, gt=0, description="The console lists requests that took at least this many seconds."
    )
    trace_url_template: str | None = Field(
        default=None,
        description="Link from the console to a request's trace, e.g. http://jaeger:16686/trace/{trace_id}.",
    )
    trust_traceparent: bool = Field(
        default=False,
        description="Continue a caller's W3C traceparent (its sampled flag then forces tracing). Off: each "
        "request starts a new trace, linked to the caller's, sampled by OTEL_TRACES_SAMPLER alone. Turn on "
        "only when every caller is trusted (e.g. another traced service of yours).",
    )
    endpoint_overrides: dict[str, str] = Field(
        default_factory=dict,
        description="FROM=TO (repeatable): rewrite backend base URLs starting with FROM, e.g. "
        "http://m.ns.svc.cluster.local:8000=http://127.0.0.1:39001 (port-forwards, local runtimes).",
    )

    @field_validator("endpoint_overrides", mode="before")
    @classmethod
    def _overrides(cls, value: object) -> object:
        """Normalised whatever the form: a mapping, a list of FROM=TO, or the environment's string."""
        if isinstance(value, str):
            return parse_override_env(value)
        if isinstance(value, dict):
            return parse_override_items(f"{k}={v}" for k, v in value.items())
        if isinstance(value, list):
            return parse_override_items(str(item) for item in value)
        return value

    @field_validator("trace_url_template", mode="before")
    @classmethod
    def _empty_template_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("trace_url_template")
    @classmethod
    def _trace_template(cls, value: str | None) -> str | None:
        # Only http(s) links, so a setting can never turn the console's links into javascript: URLs.
        if value is not None and (not value.startswith(("http://", "https://")) or "{trace_id}" not in value):
            raise ValueError("the trace URL template must be an http(s) URL containing {trace_id}")
        return value

    @field_validator(
        "redis_url",
        "redis_password",
        "batch_database_url",
        "cache_redis_url",
        "cache_redis_database",
        "cache_namespace_max_bytes",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("redis_url", "cache_redis_url")
    @classmethod
    def _redis_scheme(cls, value: SecretStr | None) -> SecretStr | None:
        # The message never repeats the URL: it may hold a password.
        if value is None:
            return None
        try:
            parts = urlsplit(value.get_secret_value())
            parts.port  # noqa: B018 - parsed here so a bad port fails the settings, not the start
            redis_location(value.get_secret_value())
        except ValueError:
            raise ValueError("the Redis URL does not parse (its port? its database?)") from None
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError("the Redis URL must start with redis://, rediss:// or unix://")
        return value

    @field_validator("batch_database_url")
    @classmethod
    def _database_scheme(cls, value: SecretStr | None) -> SecretStr | None:
        # The message never repeats the URL: it may hold a password.
        if value is not None and value.get_secret_value().partition("://")[0] not in BATCH_DATABASE_SCHEMES:
            raise ValueError("the Batch API's database URL must start with postgresql:// or sqlite:///")
        return value

    @field_validator("serving_namespaces")
    @classmethod
    def _namespace_names(cls, value: list[str]) -> list[str]:
        bad = [ns for ns in value if not NAMESPACE_NAME.fullmatch(ns)]
        if bad:
            raise ValueError(f"not namespace names: {', '.join(map(repr, bad))}")
        return value

    @property
    def cache_redis(self) -> str | None:
        """The response cache's Redis URL: its own, else the rate limits' at its database; None: memory."""
        if self.cache_redis_url is not None:
            return self.cache_redis_url.get_secret_value()
        if self.redis_url is not None:
            limits = self.redis_url.get_secret_value()
            database = self.cache_redis_database
            return with_database(limits, redis_database(limits) + 1 if database is None else database)
        return None

    @model_validator(mode="after")
    def _cache_apart_from_limits(self) -> GatewaySettings:
        # Fail closed: answers written into the limits' database could make Redis evict limit buckets, or
        # be counted with them. The messages never repeat a URL: it may hold a password.
        cache = self.cache_redis
        if cache is not None and self.redis_url is not None:
            try:
                same = redis_location(cache) == redis_location(self.redis_url.get_secret_value())
            except ValueError:
                raise ValueError("a Redis URL's database is not a number") from None
            if same:
                raise ValueError(
                    "the response cache's Redis database is the rate limits' own: set --cache-redis-database "
                    "(or --cache-redis-url) to another"
                )
        return self

    @model_validator(mode="after")
    def _one_source(self) -> GatewaySettings:
        if (self.routes_file is None) == (not self.watch):
            raise ValueError("set exactly one of --routes-file or --watch")
        return self

    @model_validator(mode="after")
    def _metrics_port_of_its_own(self) -> GatewaySettings:
        # On the API port, /metrics would be readable by every client and inseparable from /v1 by a NetworkPolicy.
        if self.metrics_port == self.port:
            raise ValueError(f"--metrics-port {self.metrics_port} is the API port: /metrics needs a port of its own")
        return self

    @property
    def limits_in_memory(self) -> bool:
        """Rate limits are set and kept in each process's memory (no Redis to share them)."""
        limits = (
            self.key_requests_per_minute,
            self.key_tokens_per_minute,
            self.feature_requests_per_minute,
            self.feature_tokens_per_minute,
            self.key_max_in_flight,
        )
        return self.redis_url is None and any(limit > 0 for limit in limits)

    @property
    def one_process_only(self) -> str | None:
        """Why these settings need a single worker process, if they do."""
        if self.limits_in_memory:
            return "rate limits are kept in memory (no --redis-url), which only one process can apply exactly"
        url = self.batch_database_url
        if url is not None and url.get_secret_value().startswith("sqlite"):
            return "the Batch API's SQLite database takes one process (PostgreSQL takes several)"
        return None

    @model_validator(mode="after")
    def _workers_that_can_share(self) -> GatewaySettings:
        # Fail closed: N processes each keeping a budget in memory would let a key spend N times its limit.
        if self.workers > 1 and self.one_process_only:
            fix = "set --redis-url" if self.limits_in_memory else "use PostgreSQL"
            raise ValueError(f"--workers {self.workers} is more than one process, but {self.one_process_only}: {fix}")
        return self


DEFAULT_NAMESPACE = "default"  # where an object written without a namespace lives


def plain_name_namespaces(settings: GatewaySettings, own_namespace: Callable[[], str]) -> list[str]:
    """The serving namespaces: where plain model names resolve, in order. Never every namespace: an
    object created in some other namespace must not be able to take over a name clients call."""
    if settings.serving_namespaces:
        return list(settings.serving_namespaces)
    if settings.routes_file is not None:
        return [DEFAULT_NAMESPACE]
    if settings.namespaces:
        return list(settings.namespaces)
    return [own_namespace()]
