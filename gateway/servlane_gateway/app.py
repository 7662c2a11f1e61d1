"""The gateway's FastAPI app: OpenAI endpoints, /v1/models, /health, /ready; and /metrics on its own port."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from servlane_core.protocol.errors import model_not_found
from servlane_core.protocol.limits import RequestLimits
from servlane_core.routing.overrides import apply_overrides
from servlane_core.routing.routes import RouteTable, describe_ambiguity, describe_refused, resolve_plain_names
from servlane_core.routing.waking import HoldLimits
from servlane_gateway.access import KeyRing, names_for, parse_keys, route_for
from servlane_gateway.batch.service import BatchService
from servlane_gateway.cache.redis_store import RedisStore
from servlane_gateway.cache.rules import CacheBudget
from servlane_gateway.cache.store import AnswerStore, MemoryStore, ResponseCacher
from servlane_gateway.console.recent import RequestLog
from servlane_gateway.console.router import install_console
from servlane_gateway.endpoints import BY_PATH, document
from servlane_gateway.forwarding import handle
from servlane_gateway.gateway_metrics import GatewayMetrics
from servlane_gateway.http.metrics_listener import MetricsEndpoint, arrived_on
from servlane_gateway.http.proxy import Timeouts
from servlane_gateway.http.upstream import UpstreamPool
from servlane_gateway.limits.rates import Limiter, Limits, RateLimiter
from servlane_gateway.limits.redis_limiter import RedisLimiter
from servlane_gateway.routing.demand_lease import DemandSink, KubeDemandLease, NoDemand
from servlane_gateway.routing.hold import HoldQueue
from servlane_gateway.routing.kube_watch import KubeRouteSource, own_namespace
from servlane_gateway.routing.pods import PodRouter
from servlane_gateway.routing.slices import EndpointSliceSource, Services
from servlane_gateway.routing.sources import FileRouteSource, OnTable, RouteSource, file_signature
from servlane_gateway.settings import GatewaySettings, plain_name_namespaces
from servlane_gateway.state import GatewayState
from servlane_web.bodies import drain_unread_body
from servlane_web.errors import install_error_handlers
from servlane_web.http_server import ClientTimeouts
from servlane_web.routes import get_and_head
from servlane_web.tracing import TracingMiddleware, start_tracing, stop_tracing

log = logging.getLogger(__name__)


def load_key_ring(path: Path | None) -> KeyRing:
    """No path: access control off. A path: on, with the keys it holds (none: every request refused)."""
    return KeyRing(parse_keys(path.read_text())) if path is not None else KeyRing()


def log_key_ring(keys: KeyRing, path: Path, reloaded: bool = False) -> None:
    """Says why nobody gets in when the file holds no key; never logs a key."""
    if keys.enabled and not keys.keys:
        log.error("the keys file %s holds no API key: every request is refused (403) until keys are added", path)
    elif reloaded:
        log.info("reloaded %d API keys from %s", len(keys.keys), path)


async def _watch_keys(state: GatewayState, path: Path, poll_seconds: float) -> None:
    """Secret rotation: a mounted Secret changes in place; reload it. A file that no longer parses refuses
    every request until it is fixed (the previous keys may include one that edit meant to revoke), and
    /ready fails so a rollout of the broken Secret stops; one that parses to no keys refuses everyone too."""
    signature = file_signature(path)
    while True:
        await asyncio.sleep(poll_seconds)
        current = file_signature(path)
        if current is None or current == signature:
            continue
        signature = current
        try:
            keys = load_key_ring(path)
        except (OSError, ValueError) as exc:  # the message names a line number at most, never a key
            log.error("refusing every request: the keys file %s does not load (%s); fix it to serve again", path, exc)
            keys = KeyRing.unparsable()
        state.keys = keys
        state.metrics.keys_file_loaded(not keys.broken, time.time())
        if not keys.broken:
            log_key_ring(keys, path, reloaded=True)


def route_source_for(settings: GatewaySettings) -> RouteSource:
    if settings.routes_file is not None:
        return FileRouteSource(settings.routes_file, settings.reload_poll_seconds)
    return KubeRouteSource(settings.namespaces, cluster_domain=settings.cluster_domain)


def limiter_for(settings: GatewaySettings) -> RateLimiter | RedisLimiter:
    """Shared through Redis when a URL is set, else in this replica's memory; says which at start."""
    per_key = Limits(settings.key_requests_per_minute, settings.key_tokens_per_minute, settings.key_max_in_flight)
    per_feature = Limits(settings.feature_requests_per_minute, settings.feature_tokens_per_minute)
    if settings.redis_url is None:
        log.info(
            "rate limits and quotas are kept in this replica's memory (no --redis-url): with several "
            "replicas, each one applies every limit on its own"
        )
        return RateLimiter(per_key=per_key, per_feature=per_feature)
    password = settings.redis_password
    limiter = RedisLimiter(
        settings.redis_url.get_secret_value(),
        per_key=per_key,
        per_feature=per_feature,
        password=password.get_secret_value() if password is not None else None,
        prefix=settings.redis_key_prefix,
        timeout=settings.redis_timeout,
        lease=settings.redis_in_flight_lease,
        retry_after=settings.unavailable_retry_after,
    )
    log.info(
        "rate limits and quotas are shared by the gateway replicas through Redis at %s (key prefix %r, "
        "in-flight lease %gs); while it does not answer, limited requests get 503",
        limiter.where,
        limiter.prefix,
        limiter.lease,
    )
    return limiter


def answer_store_for(settings: GatewaySettings) -> AnswerStore:
    """The response cache's store: its Redis (its own, else another database of the limits'), else this
    process's memory."""
    url = settings.cache_redis
    if url is None:
        return MemoryStore()
    # The limits' password goes to the limits' server only: a Redis of the cache's own carries its own.
    password = settings.redis_password if settings.cache_redis_url is None else None
    return RedisStore(
        url,
        password=password.get_secret_value() if password is not None else None,
        prefix=settings.redis_key_prefix,
        timeout=settings.redis_timeout,
        pause=settings.unavailable_retry_after,
    )


def cache_budget_for(settings: GatewaySettings) -> CacheBudget:
    return CacheBudget(settings.cache_max_bytes, settings.cache_namespace_max_bytes, settings.cache_max_entry_bytes)


def log_cache(cache: ResponseCacher) -> None:
    """Where the response cache keeps answers and within what: an admin sizing memory reads it here."""
    store, budget = cache.store, cache.budget
    where = f"Redis at {store.where}" if isinstance(store, RedisStore) else "this process's memory"
    log.info(
        "the response cache keeps at most %d bytes of answers in %s: %d per namespace, %d per answer",
        budget.max_bytes,
        where,
        budget.namespace_share,
        budget.max_entry_bytes,
    )


def batch_service_for(settings: GatewaySettings, state: GatewayState) -> BatchService:
    url = settings.batch_database_url
    return BatchService(
        state,
        url.get_secret_value() if url is not None else None,
        concurrency=settings.batch_concurrency_per_feature,
        lease=settings.batch_lease_seconds,
        poll=settings.batch_poll_seconds,
        max_file_bytes=settings.batch_max_file_bytes,
        max_owner_bytes=settings.batch_max_owner_bytes,
        allow_without_keys=settings.batch_allow_without_keys,
        uploads_at_once=(settings.batch_uploads_at_once, settings.batch_uploads_at_once_per_key),
    )


FIRST_TABLE_WAIT_SECONDS = 20.0


class GatewayApp(FastAPI):
    """FastAPI for the small endpoints; the proxied POSTs go straight to the handler. Profiling showed
    FastAPI's and Starlette's middleware and routing layers costing more per request than the gateway's
    own work, and the handler needs none of them: it answers every outcome itself, errors included."""

    traced: TracingMiddleware | None = None  # set when tracing is on: a server span around each OpenAI request
    metrics_listener: tuple[int, MetricsEndpoint] | None = None  # (port, what it answers): see create_app
    client_timeouts = ClientTimeouts()  # what the server's protocol gives a client to send its request

    def trace_with(self, tracer: Any, trust_traceparent: bool = False) -> None:
        self.traced = TracingMiddleware(self._serve, tracer, trust_incoming=trust_traceparent)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.metrics_listener is not None and scope["type"] == "http":
            port, endpoint = self.metrics_listener
            if arrived_on(scope, port):
                await endpoint(scope, receive, send)
                return
        if self.traced is not None:
            await self.traced(scope, receive, send)  # type: ignore[arg-type]
            return
        await self._serve(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in BY_PATH:
            response = await handle(self.state.gateway, Request(scope, receive, send), BY_PATH[scope["path"]])
            # Refused before its body was read to its end (a bad key, a body over the cap): the rest is dropped
            # first, or closing on unread data resets the connection and the client may never see the answer.
            await drain_unread_body(scope, receive)
            await response(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def hold_limits_for(settings: GatewaySettings) -> HoldLimits:
    return HoldLimits(
        per_model=settings.hold_max_per_model,
        per_namespace=settings.hold_max_per_namespace,
        max_wait=settings.hold_max_wait_seconds,
        keep_alive=settings.hold_keep_alive_seconds,
    )


def gateway_state_for(settings: GatewaySettings) -> GatewayState:
    """The shared state, its limiter and response cache made (not started); fails fast on a malformed keys file."""
    timeouts = Timeouts(settings.connect_timeout, settings.first_byte_timeout, settings.idle_timeout)
    state = GatewayState(
        metrics=GatewayMetrics(),
        limiter=limiter_for(settings),
        timeouts=timeouts,
        limits=RequestLimits(
            max_body_bytes=settings.max_body_bytes,
            max_json_depth=settings.max_json_depth,
            max_list_items=settings.max_list_items,
        ),
        unavailable_retry_after=settings.unavailable_retry_after,
        keys=load_key_ring(settings.keys_file),  # fails fast on a malformed keys file
        reserved_completion_tokens=settings.reserved_completion_tokens,
    )
    state.cache = ResponseCacher(answer_store_for(settings), state.metrics, cache_budget_for(settings))
    log_cache(state.cache)
    state.metrics.limits_store.labels(state.limiter.mode).set(1)
    if settings.keys_file is not None:
        state.metrics.keys_file_loaded(True, time.time())  # it parsed: a broken one stops the start above
        log_key_ring(state.keys, settings.keys_file)
    return state


def hold_queue_for(
    settings: GatewaySettings, state: GatewayState, routes: RouteSource, demand: DemandSink | None
) -> HoldQueue | None:
    """The queue of requests for models with no ready pod; None (a 503 at once) when either bound is 0."""
    limits = hold_limits_for(settings)
    if limits.per_model > 0 and limits.per_namespace > 0:  # else a model with no ready pod is a 503 at once
        if demand is None:
            demand = KubeDemandLease() if isinstance(routes, KubeRouteSource) else NoDemand()
        return HoldQueue(state.pods, state.metrics, limits, demand, settings.unavailable_retry_after)
    return None


def table_listener(state: GatewayState, settings: GatewaySettings, first_table: asyncio.Event) -> OnTable:
    """What a new route table does: overrides and plain names applied, what changed logged, then swapped in."""
    serving = plain_name_namespaces(settings, own_namespace)
    log.info(
        "plain model names resolve in namespace(s) %s for callers whose API key names no namespace (a name "
        "several hold is ambiguous: refused); elsewhere call '<namespace>/<name>'",
        ", ".join(serving),
    )

    def on_table(table: RouteTable) -> None:
        first_table.set()
        table = resolve_plain_names(apply_overrides(table, settings.endpoint_overrides), serving)
        previous = state.table
        if previous is None or table.ambiguous != previous.ambiguous:  # once per change, not per watch event
            for line in describe_ambiguity(table):
                log.warning(line)
        if previous is None or table.refused != previous.refused:
            for line in describe_refused(table):
                log.warning(line)
        state.table = table
        state.metrics.set_weights(table)
        if state.recent is not None:
            state.recent.keep_only(lambda namespace, feature: f"{namespace}/{feature}" in table.routes)
        if state.hold is not None:
            state.hold.table_changed(table)

    return on_table


def services_changed(state: GatewayState, services: Services) -> None:
    """The pods of the AIModels' Services changed (the EndpointSlice watch)."""
    state.pods.update(services)
    if state.hold is not None:
        state.hold.poke()  # a pod that became ready releases the requests held for its model now


def _model_object(name: str, created: int) -> dict[str, Any]:
    """OpenAI's model object; `created` is the AIFeature's or AIModel's creationTimestamp."""
    return {"id": name, "object": "model", "created": created, "owned_by": "servlane"}


def install_probes(app: FastAPI, state: GatewayState, settings: GatewaySettings) -> None:
    """/v1/models (what the caller's key may call), /health and /ready."""

    @get_and_head(app, "/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        key = state.keys.authenticate(request.headers.get("authorization"))
        table = state.table
        if table is None:
            return {"object": "list", "data": []}
        # Each model the key may call, named as a request of this key resolves it (ambiguous ones qualified).
        data = [_model_object(name, route.created) for name, route in names_for(key, table)]
        return {"object": "list", "data": data}

    @get_and_head(app, "/v1/models/{model:path}")
    async def model(request: Request, model: str) -> dict[str, Any]:
        # OpenAI's retrieve, for a name this key may call, resolved as its requests are: any other is
        # model_not_found, the answer for a name that does not exist (no name leaks out of a key's scope).
        key = state.keys.authenticate(request.headers.get("authorization"))
        table = state.table
        if table is None:
            raise model_not_found(model)
        return _model_object(model, route_for(key, table, model).created)

    @get_and_head(app, "/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @get_and_head(app, "/ready")
    async def ready() -> JSONResponse:
        if state.table is None:
            return JSONResponse({"status": "waiting for routes"}, status_code=503, headers={"Retry-After": "1"})
        keys_file = "none" if settings.keys_file is None else "invalid" if state.keys.broken else "valid"
        if state.keys.broken:
            # Not ready: a rollout of a broken keys Secret stops here instead of replacing working replicas.
            detail = {"status": "the API keys file does not parse", "keys_file": keys_file}
            return JSONResponse(detail, status_code=503, headers={"Retry-After": "5"})
        # The shared limit store is deliberately not checked: its outage hits every replica at once, and
        # taking them all out of the Service would turn the limited requests' 503 + Retry-After into
        # connection errors and fail the requests no limit applies to as well.
        return JSONResponse({"status": "ready", "keys_file": keys_file})


def create_app(
    settings: GatewaySettings, source: RouteSource | None = None, demand: DemandSink | None = None
) -> FastAPI:
    """`demand`: where the demand for models at zero goes; default: their demand Leases when watching the
    cluster, nowhere with a routes file (servlane_gateway.routing.demand_lease)."""
    state = gateway_state_for(settings)
    timeouts = state.timeouts
    batch = batch_service_for(settings, state)
    tracer = start_tracing("servlane-gateway")
    routes = source or route_source_for(settings)
    state.pods = PodRouter(state.metrics)
    # The pods behind each AIModel's Service, when watching the cluster; else its Service URL is called.
    slices = EndpointSliceSource(settings.namespaces) if isinstance(routes, KubeRouteSource) else None
    state.hold = hold_queue_for(settings, state, routes, demand)
    first_table = asyncio.Event()
    on_table = table_listener(state, settings, first_table)
    on_services = partial(services_changed, state)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.pool = UpstreamPool(
            timeouts.connect, settings.upstream_max_idle_seconds, settings.upstream_max_lifetime_seconds
        )
        limiter: Limiter = state.limiter  # the one started is the one closed
        cache = state.cache
        assert cache is not None
        await limiter.start()
        await cache.start()
        if slices is not None:
            await slices.start(on_services)
        await routes.start(on_table)
        # uvicorn lets a process take connections once this startup returns: waiting for the routes here keeps
        # a worker that starts (or is restarted) next to serving ones from answering 404 for every model.
        # Bounded: with the API server away, the gateway still comes up, not ready (/ready says why).
        with suppress(TimeoutError):
            await asyncio.wait_for(first_table.wait(), FIRST_TABLE_WAIT_SECONDS)
        await batch.start()
        keys_task = None
        if settings.keys_file is not None:
            keys_task = asyncio.create_task(_watch_keys(state, settings.keys_file, settings.reload_poll_seconds))
        try:
            yield
        finally:
            if keys_task is not None:
                keys_task.cancel()
                with suppress(asyncio.CancelledError):
                    await keys_task
            await batch.stop()
            await routes.stop()
            if slices is not None:
                await slices.stop()
            if state.hold is not None:
                await state.hold.aclose()
            await limiter.aclose()
            await cache.aclose()
            await state.pool.aclose()
            if tracer is not None:
                stop_tracing()

    app = GatewayApp(title="Servlane gateway", lifespan=lifespan)
    app.client_timeouts = ClientTimeouts(
        settings.client_head_timeout, settings.client_body_timeout, settings.client_read_stall_timeout
    )
    if tracer is not None:
        app.trace_with(tracer, settings.trust_traceparent)
    app.state.gateway = state
    install_error_handlers(app)

    document(app, partial(handle, state))
    batch.install(app)
    if settings.console_enabled:
        state.recent = RequestLog(settings.console_slow_seconds)
        objects = routes.latest_objects if isinstance(routes, FileRouteSource | KubeRouteSource) else lambda: ([], [])
        install_console(app, state, objects, state.recent, settings.trace_url_template, batch.latest)

    install_probes(app, state, settings)

    # Not a route: /metrics answers only on the metrics port (metrics_listener), OpenMetrics with the exemplars
    # that link a latency bucket to a trace when asked (one worker process only: the multiprocess files hold none).
    app.metrics_listener = (settings.metrics_port, MetricsEndpoint(state.metrics.scrape_registry()))
    return app
