"""One OpenAI request through the gateway: authenticate, cap, route, authorise, limit, forward, count.

The body is parsed once into a dict; the feature's defaults and the backend's served model name are
written into it and it is serialised once per attempt. The pod of the picked backend is picked by the
feature's routing policy (servlane_gateway.routing.pods). A pod that refuses the connection is retried on
another pod of the same backend, and a backend with no pod left to try once on another ready backend;
nothing has reached the client at that point, and nothing is retried after the upstream accepted the
request.

Every stream is charged: the backend is always asked for its usage chunk (`stream_options.include_usage`),
and when the client did not ask for it, the relay cuts that one chunk out of what the client gets.
A request admitted by the limiter holds an `Admission` (an in-flight place, a token reservation) that is
settled exactly once when the request ends: with its usage, else as unknown or as nothing used.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from servlane_core.protocol.errors import OpenAIError, model_not_found, overloaded
from servlane_core.protocol.limits import RequestLimits, body_too_large, parse_json_object
from servlane_core.routing.defaults import apply_defaults
from servlane_core.routing.endpoint_pick import PREFIX_AFFINITY
from servlane_core.routing.picking import pick_backend
from servlane_core.routing.prompt_prefix import prompt_prefix
from servlane_core.routing.routes import Backend, Route
from servlane_core.routing.waking import waking_pick
from servlane_gateway.access import route_for
from servlane_gateway.cache.rules import CACHE_HEADER, COALESCED, HIT, MISS, CacheKey, Caching, Entry, lookup_key
from servlane_gateway.cache.store import Leading
from servlane_gateway.gateway_metrics import NONE, exemplar
from servlane_gateway.http.held_stream import HeldStreamResponse
from servlane_gateway.http.proxy import (
    CLIENT_GONE,
    COMPLETED,
    RelayResponse,
    StreamResult,
    UpstreamTimeout,
    open_upstream,
    read_body,
)
from servlane_gateway.http.upstream import (
    UpstreamConnectError,
    UpstreamConnectTimeout,
    UpstreamError,
    UpstreamResponse,
)
from servlane_gateway.limits.rates import Hold, estimate_tokens
from servlane_gateway.routing.pods import Lease
from servlane_gateway.state import GatewayState
from servlane_web.client_watch import ClientGone, unless_client_leaves
from servlane_web.tracing import NO_SPANS, Phase, RequestSpans, spans_of

log = logging.getLogger(__name__)

CLIENT_CLOSED = 499  # the `code` label of a request the client abandoned (nginx's convention)
# The runtime's admission queue serves waiters by `X-Priority` (servlane_runtime.admission reads exactly
# these values and answers others with a 400); checked here too so a bad value never reaches a backend.
PRIORITIES = ("high", "normal", "low")
STREAMING_ENDPOINTS = ("chat/completions", "completions")
# Pods of one backend tried for a request whose connections they refuse, before another backend (once).
# Two: a second refusal in a row says more about the version than the pod, and ejection keeps dead pods
# out of later picks.
MAX_POD_ATTEMPTS = 2


@dataclass
class Call:
    """Bookkeeping of one request, for the metrics."""

    started: float
    namespace: str = NONE
    feature: str = NONE
    model: str = NONE
    key_name: str | None = None
    gateway_seconds: float = 0.0  # time spent in the gateway before the upstream was called
    admission: Hold | None = None  # set once the limiter admitted the request; settled when it ends
    strip_usage: bool = False  # the gateway asked for the stream's usage chunk, the client did not
    caching: Caching | None = None  # the response cache missed: keep the answer under this key
    lease: Lease | None = None  # the pod relaying a stream: in flight until the stream ends
    trace_id: str | None = None  # with tracing on: the exemplar of its latency observations
    leading: Leading | None = None  # a cache miss that identical requests in flight wait for

    def settle(self, tokens: int | None) -> None:
        if self.admission is not None:
            self.admission.settle(tokens)

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()


_HEADERS_BY_NAME = "servlane.headers_by_name"


def header(request: Request, name: bytes) -> str | None:
    """The request's first header of a lower-case `name` (uvicorn lower-cases them). What
    `request.headers.get` answers, without its scan of every header and its KeyError when one is missing,
    for each of the several headers a proxied request reads: one dict per request, kept in its scope."""
    scope = request.scope
    by_name: dict[bytes, bytes] | None = scope.get(_HEADERS_BY_NAME)
    if by_name is None:
        by_name = scope[_HEADERS_BY_NAME] = {}
        for key, value in reversed(scope["headers"]):  # the first of repeated ones wins, as in Headers.get
            by_name[key.lower()] = value
    value = by_name.get(name)
    return None if value is None else value.decode("latin-1")


async def read_capped(request: Request, cap: int) -> bytes:
    too_large = body_too_large(cap)
    length = header(request, b"content-length") or ""
    if length.isdigit() and int(length) > cap:
        raise too_large
    parts: list[bytes] = []
    size = 0
    receive = request.receive  # read as Request.stream() does, without its async generator per request
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            raise too_large
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


def parse_body(raw: bytes, limits: RequestLimits) -> dict[str, Any]:
    """A JSON object within the limits (depth, list lengths: see servlane_core.protocol.limits) naming a model."""
    body = parse_json_object(raw, limits)
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise OpenAIError(400, "You must provide a model parameter.", param="model", code="missing_model")
    return body


def sticky_id(request: Request, body: dict[str, Any]) -> str | None:
    user = body.get("user")
    return header(request, b"x-request-id") or (user if isinstance(user, str) and user else None)


def priority_of(request: Request) -> str | None:
    """The client's `X-Priority`, normalised, or None when it sent none (the runtime then uses normal)."""
    raw = header(request, b"x-priority")
    if raw is None:
        return None
    value = raw.strip().lower()
    if value not in PRIORITIES:
        raise OpenAIError(
            400, "X-Priority must be one of high, normal, low.", param="X-Priority", code="invalid_priority"
        )
    return value


def ask_for_usage(body: dict[str, Any], endpoint: str) -> bool:
    """Asks the backend for a stream's usage chunk, so the stream can be charged whatever the client sent;
    True when the client did not ask for it itself (the relay then cuts it out). A `stream_options` or
    `include_usage` of the wrong type is left alone, for the backend to refuse with its 400."""
    if endpoint not in STREAMING_ENDPOINTS or body.get("stream") is not True:
        return False
    options = body.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        return False
    if options.get("include_usage") is True:
        return False
    body["stream_options"] = {**options, "include_usage": True}
    return True


def error_response(error: OpenAIError) -> JSONResponse:
    """The error as OpenAI-style JSON. With a Retry-After (the gateway's own 429 and 503), the error object
    also carries `retry_after`, the same whole seconds, for clients that do not read headers."""
    body = error.body()
    headers = error.headers()
    if "Retry-After" in headers:
        body["error"]["retry_after"] = int(headers["Retry-After"])
    return JSONResponse(body, status_code=error.status, headers=headers)


def unavailable(state: GatewayState, message: str) -> OpenAIError:
    return overloaded(503, message, state.unavailable_retry_after)


async def handle(state: GatewayState, request: Request, endpoint: str) -> Response:
    """The whole pipeline; every outcome is counted exactly once."""
    call = Call(started=time.perf_counter())
    try:
        try:
            return await _handle(state, request, endpoint, call)
        except BaseException:
            call.release()  # a stream's pod is released when its relay ends; no relay follows an error
            raise
    except (ClientGone, ClientDisconnect):
        _client_left(state, call)
        return Response(status_code=CLIENT_CLOSED)  # nobody reads it; the connection is gone
    except OpenAIError as exc:
        error = exc
    except Exception:  # a bug: still one error shape, and still counted
        log.exception("unexpected error while proxying%s", _trace_note(spans_of(request.scope)))
        error = OpenAIError(500, "The gateway had an error while processing your request.", type="server_error")
    _failed(state, call, error)
    return error_response(error)


def _client_left(state: GatewayState, call: Call) -> None:
    call.release()
    call.settle(None)  # the backend may have generated before the call was cancelled
    state.metrics.record(call.namespace, call.feature, call.model, CLIENT_CLOSED, time.perf_counter() - call.started)
    _note(state, call, CLIENT_CLOSED, time.perf_counter() - call.started)


def _failed(state: GatewayState, call: Call, error: OpenAIError) -> None:
    """Counts a request that ended with the gateway's own error (`error`), and settles its admission."""
    call.release()
    # A timed-out backend may have generated; every other error here means no backend answer to charge.
    call.settle(None if error.status == 504 else 0)
    reason = {503: "upstream_unavailable", 502: "upstream_unavailable", 504: "upstream_timeout"}.get(error.status)
    elapsed = time.perf_counter() - call.started
    state.metrics.record(call.namespace, call.feature, call.model, error.status, elapsed, reason)
    _note(state, call, error.status, elapsed, reason)


def _note(
    state: GatewayState, call: Call, status: int, seconds: float, error: str | None = None, ttft: float | None = None
) -> None:
    """The console's record of a finished request (next to each final metrics record)."""
    if state.recent is not None:
        state.recent.add(call.namespace, call.feature, call.model, status, seconds, error, call.trace_id, ttft)


async def _handle(state: GatewayState, request: Request, endpoint: str, call: Call) -> Response:
    spans = spans_of(request.scope)
    call.trace_id = spans.trace_id
    with spans.phase("auth"):
        # The key first, from the headers alone: a caller without a valid key gets its 401 at once,
        # never after the gateway waited for (and buffered) a body of up to max_body_bytes.
        key = state.keys.authenticate(header(request, b"authorization"))
        raw = await read_capped(request, state.limits.max_body_bytes)
    call.key_name = key.name if key else None
    priority = priority_of(request)
    with spans.phase("route") as routing:
        body = parse_body(raw, state.limits)
        table = state.table
        if table is None:
            raise model_not_found(body["model"])
        route = route_for(key, table, body["model"])  # a scoped key's plain names: in its own namespaces
        call.feature = route.name
        call.namespace = route.namespace
        spans.set(**{"gen_ai.request.model": body["model"], "servlane.namespace": route.namespace})
        spans.set(**{"servlane.feature": route.name, "servlane.key": call.key_name})
        apply_defaults(body, route.defaults, endpoint)  # first: the feature's max_tokens cap sizes the reservation
        reserve = estimate_tokens(body, len(raw), endpoint, state.reserved_completion_tokens)
        call.admission = await state.limiter.acquire(call.key_name, route.namespace, route.name, reserve)
        routing.event("admitted")
    call.strip_usage = ask_for_usage(body, endpoint)
    return await _forward(state, request, endpoint, call, route, body, priority)


async def _forward(
    state: GatewayState,
    request: Request,
    endpoint: str,
    call: Call,
    route: Route,
    body: dict[str, Any],
    priority: str | None,
) -> Response:
    sticky = sticky_id(request, body)
    # A client (its key, else its sticky id) stays pinned to a version only up to its fair share of it.
    pick = state.sticky_guard.pick(route, sticky, call.key_name or sticky)
    backend = pick.backend
    if pick.unpinned and backend is not None:
        state.metrics.sticky_unpinned.labels(route.namespace, route.name, backend.model).inc()
    if backend is None and state.hold is not None and (waking := waking_pick(route, sticky)) is not None:
        return await _when_ready(state, request, endpoint, call, route, body, priority, sticky, waking)
    # After admission, so the limits hold for answers from the cache too (they are charged no tokens).
    key = lookup_key(body, endpoint, route, backend) if state.cache is not None else None
    if state.cache is not None and key is not None and (entry := await state.cache.get(key)) is not None:
        return _from_cache(state, call, request, entry, HIT)
    to_backend = partial(_to_backend, state, request, endpoint, call, route, body, priority, backend, key, sticky)
    if state.cache is None or key is None or body.get("stream"):
        return await to_backend()
    # Identical non-streamed requests while the first is on its way: one asks the backend, the others take
    # its answer (a stream is not held back for a whole answer: it goes to the backend).
    if (leader := state.cache.leader(key)) is not None:
        following = state.cache.follow(leader, state.timeouts.first_byte)
        entry = await unless_client_leaves(request.scope, request.receive, following)
        if entry is not None:
            return _from_cache(state, call, request, entry, COALESCED)
        return await to_backend()
    call.leading = state.cache.lead(key)
    try:
        return await to_backend()
    finally:
        state.cache.release(call.leading)


async def _when_ready(
    state: GatewayState,
    request: Request,
    endpoint: str,
    call: Call,
    route: Route,
    body: dict[str, Any],
    priority: str | None,
    sticky: str | None,
    backend: Backend,
) -> Response:
    """No backend of the route is ready, `backend` (picked by weight among the waking ones) is on its way:
    the request goes to it now if a pod of it already takes requests, else once one does (held: see
    servlane_gateway.routing.hold). A held stream gets its response head at once (held_stream). Not answered from
    the response cache: the request has waited for a model that was not up, nothing identical was answered."""
    assert state.hold is not None
    send_to = partial(_to_backend, state, request, endpoint, call, route, body, priority)
    if state.endpoints.is_live(backend):
        return await send_to(backend, None, sticky)
    ticket = state.hold.enter(backend)  # 429 when its model's or namespace's queue is full
    call.model = backend.model
    if body.get("stream") is True and endpoint in STREAMING_ENDPOINTS:
        forward = partial(_forward_released, send_to, sticky)
        failed, left = partial(_failed, state, call), partial(_client_left, state, call)
        return HeldStreamResponse(ticket, state.hold.limits.keep_alive, forward, failed, left)
    try:
        released = await unless_client_leaves(request.scope, request.receive, ticket.wait())
    finally:
        ticket.leave()
    return await send_to(released, None, sticky)


async def _forward_released(
    send_to: Callable[[Backend, CacheKey | None, str | None], Awaitable[Response]], sticky: str | None, backend: Backend
) -> Response:
    return await send_to(backend, None, sticky)


def _from_cache(state: GatewayState, call: Call, request: Request, entry: Entry, how: str) -> Response:
    assert state.cache is not None
    call.settle(0)
    spans_of(request.scope).set(**{"servlane.cache": how})
    state.metrics.record(call.namespace, call.feature, NONE, 200, time.perf_counter() - call.started)
    return state.cache.replay(entry, call.strip_usage, header(request, b"x-request-id"), how)


async def _to_backend(
    state: GatewayState,
    request: Request,
    endpoint: str,
    call: Call,
    route: Route,
    body: dict[str, Any],
    priority: str | None,
    backend: Backend | None,
    key: CacheKey | None,
    sticky: str | None,
) -> Response:
    spans = spans_of(request.scope)
    headers = {"content-type": "application/json", "accept": header(request, b"accept") or "*/*"}
    if request_id := header(request, b"x-request-id"):
        headers["x-request-id"] = request_id
    if priority is not None:
        headers["x-priority"] = priority
    tried: list[str] = []  # backends
    tried_targets: list[str] = []  # pods (or Service URLs) whose connection was refused
    on_backend = 0  # of those, on the current backend
    stream = bool(body.get("stream"))
    prefix = prompt_prefix(body) if route.routing == PREFIX_AFFINITY else None
    while True:
        if backend is None:
            raise unavailable(state, f"No backend of '{route.name}' is ready; try again shortly.")
        with spans.phase("pick", {"servlane.model": backend.model, "servlane.routing": route.routing}) as picking:
            lease = state.endpoints.choose(backend, route.routing, prefix, exclude=tried_targets)
            picking.set(**{"server.address": lease.base_url if lease is not None else None})
        if lease is None:  # a pod of this backend was tried, and no other pod is left to try
            backend = _another_backend(state, call, route, backend, sticky, tried)
            on_backend = 0
            continue
        call.model = backend.model
        body["model"] = backend.served_model_name
        payload = json.dumps(body).encode()
        if not tried_targets:
            call.gateway_seconds = time.perf_counter() - call.started
        url = lease.base_url + _PATHS[endpoint]
        attempt = spans.phase(
            "upstream", {"server.address": lease.base_url, "servlane.model": backend.model}, client=True
        )
        try:
            with attempt:
                exchange = _exchange(state, url, payload, headers | attempt.headers(), stream, lease, attempt)
                upstream, content = await unless_client_leaves(request.scope, request.receive, exchange)
                attempt.set(**{"http.response.status_code": upstream.status_code})
            break
        except UpstreamConnectError:
            log.warning(
                "backend %s/%s refused the connection (%s)%s",
                backend.namespace, backend.model, lease.base_url, _trace_note(spans),
            )  # fmt: skip
            tried_targets.append(lease.key)
            on_backend += 1
            if lease.endpoint is None or on_backend >= MAX_POD_ATTEMPTS:  # a Service URL has no other pod
                backend = _another_backend(state, call, route, backend, sticky, tried)
                on_backend = 0
    if content is None:
        call.lease = lease  # a stream: its pod is in flight until the relay ends
    if key is not None and (key := lookup_key(body, endpoint, route, backend)) is not None:
        call.caching = Caching(key, route.response_cache)  # of the backend that answered (after a retry)
    return _respond(state, call, upstream, content)


def _trace_note(spans: RequestSpans) -> str:
    return f" (trace {spans.trace_id})" if spans.trace_id else ""


def _another_backend(
    state: GatewayState, call: Call, route: Route, refused: Backend, sticky: str | None, tried: list[str]
) -> Backend | None:
    """After `refused` refused every connection: once, another ready backend of the route."""
    tried.append(refused.model)
    backend = pick_backend(route, sticky, exclude=tried) if len(tried) == 1 else None
    if backend is not None:
        # A refused attempt that gets retried counts against the refused model, so a dead canary shows as
        # failing to the canary analysis even when the retry saves the client's request. (When no retry
        # follows, the request's own 503 is counted against it.) A pod refusing while another pod of the
        # same model answers is not counted here: the model answered; the pod's ejection shows it.
        elapsed = time.perf_counter() - call.started
        state.metrics.record(call.namespace, call.feature, refused.model, 502, elapsed, "upstream_unavailable")
    return backend


_PATHS = {endpoint: f"/v1/{endpoint}" for endpoint in ("chat/completions", "completions", "embeddings")}


def _is_event_stream(upstream: UpstreamResponse) -> bool:
    return upstream.status_code < 400 and "text/event-stream" in upstream.headers.get("content-type", "")


async def _exchange(
    state: GatewayState,
    url: str,
    payload: bytes,
    headers: dict[str, str],
    stream: bool,
    lease: Lease,
    attempt: Phase = NO_SPANS,
) -> tuple[UpstreamResponse, bytes | None]:
    """Open the upstream call and, unless it answers with a stream to relay, read the whole answer: one
    awaitable, so one client-disconnect watch covers both. UpstreamConnectError propagates (retry).
    The lease (the pod in flight) is released here unless a stream follows (the caller then owns it)."""
    try:
        upstream = await _open(state, url, payload, headers, lease)
        attempt.event("first_byte")
        if stream and _is_event_stream(upstream):
            return upstream, None
    except BaseException:
        lease.release()
        raise
    try:
        return upstream, await _read(state, upstream)
    finally:
        lease.release()


async def _open(
    state: GatewayState, url: str, payload: bytes, headers: dict[str, str], lease: Lease
) -> UpstreamResponse:
    """The answer's head; the pod's outcome is judged here (outlier detection)."""
    assert state.pool is not None
    try:
        upstream = await open_upstream(state.pool, url, payload, headers, state.timeouts.first_byte)
    except UpstreamTimeout as exc:
        if isinstance(exc.__cause__, UpstreamConnectTimeout) and lease.endpoint is not None:
            # A pod that does not even accept connections (its node gone, a network partition): nothing was
            # sent, so it counts as a failure and another pod is tried, as for a refused connection.
            lease.answered(None)
            raise UpstreamConnectError(str(exc)) from exc
        # Slow, not dead (or a Service URL, where kube-proxy picks): no verdict on the pod, no retry.
        raise OpenAIError(504, f"{exc}.", type="server_error", code="upstream_timeout") from exc
    except UpstreamConnectError:
        lease.answered(None)
        raise
    except UpstreamError as exc:
        lease.answered(None)  # reset before any answer
        raise OpenAIError(502, "The backend failed before answering.", type="server_error") from exc
    lease.answered(upstream.status_code)
    return upstream


async def _read(state: GatewayState, upstream: UpstreamResponse) -> bytes:
    try:
        return await read_body(upstream, state.timeouts)
    except UpstreamTimeout as exc:
        raise OpenAIError(504, f"{exc}.", type="server_error", code="upstream_timeout") from exc
    except UpstreamError as exc:
        raise OpenAIError(502, "The backend failed while answering.", type="server_error") from exc


def _response_headers(upstream: UpstreamResponse) -> dict[str, str]:
    headers = {"content-type": upstream.headers.get("content-type", "application/json")}
    if request_id := upstream.headers.get("x-request-id"):
        headers["x-request-id"] = request_id
    # A backend's overload answer (the runtime's 429 queue full, 503 waited too long or loading) says when
    # to come back; relayed unchanged, the client backs off as long as the backend asked.
    if retry_after := upstream.headers.get("retry-after"):
        headers["retry-after"] = retry_after
    return headers


def _respond(state: GatewayState, call: Call, upstream: UpstreamResponse, content: bytes | None) -> Response:
    after_upstream = time.perf_counter()
    headers = _response_headers(upstream)
    if call.caching is not None:
        headers[CACHE_HEADER] = MISS
        call.caching.content_type = headers["content-type"]
    if content is None:  # a stream: relayed as it comes
        headers |= {"cache-control": "no-cache", "x-accel-buffering": "no"}
        state.metrics.added_latency.observe(call.gateway_seconds + time.perf_counter() - after_upstream)
        done = partial(_stream_done, state, call, upstream.status_code)
        tap = state.cache.record(call.caching) if state.cache and call.caching else None
        return RelayResponse(upstream, state.timeouts, headers, done, strip_usage=call.strip_usage, tap=tap)
    elapsed = after_upstream - call.started
    if upstream.status_code < 400:
        ttft = state.metrics.latency_histograms(call.namespace, call.feature, call.model)[1]
        ttft.observe(elapsed, exemplar(call.trace_id))
        # Parsing the answer only when there is something to count; an answer without usage keeps its reservation.
        call.settle(_count_usage(state, call, _usage_of(content)) if b'"usage"' in content else None)
        if state.cache is not None and call.caching is not None and upstream.status_code == 200:
            entry = state.cache.keep_answer(call.caching, content)
            if call.leading is not None:
                call.leading.entry = entry  # for the identical requests waiting on this one
    else:
        call.settle(0)  # the backend refused or failed: nothing generated
    state.metrics.record(
        call.namespace, call.feature, call.model, upstream.status_code, elapsed, trace_id=call.trace_id
    )
    _note(state, call, upstream.status_code, elapsed, ttft=elapsed if upstream.status_code < 400 else None)
    response = Response(content, status_code=upstream.status_code, headers=headers)
    state.metrics.added_latency.observe(call.gateway_seconds + time.perf_counter() - after_upstream)
    return response


def _usage_of(content: bytes) -> object:
    try:
        parsed = json.loads(content)
    except ValueError:
        return None
    return parsed.get("usage") if isinstance(parsed, dict) else None


def _count_usage(state: GatewayState, call: Call, usage: object) -> int | None:
    """Counts the usage in the metrics; the tokens to charge, or None without a usage object."""
    tokens = state.metrics.record_usage(call.namespace, call.feature, call.model, usage)
    return tokens if isinstance(usage, dict) else None


def _stream_done(state: GatewayState, call: Call, status: int, result: StreamResult) -> None:
    elapsed = time.perf_counter() - call.started
    first_chunk: float | None = None
    if result.first_chunk_at is not None and result.outcome == COMPLETED:
        # Successes only: a stream that opens with an error event must not look quick.
        first_chunk = result.first_chunk_at - call.started
        ttft = state.metrics.latency_histograms(call.namespace, call.feature, call.model)[1]
        ttft.observe(first_chunk, exemplar(call.trace_id))
    # Without a usage chunk (the client left, the stream was cut or failed) the reservation stands.
    call.settle(_count_usage(state, call, result.usage))
    if state.cache is not None and call.caching is not None and status == 200 and result.outcome == COMPLETED:
        state.cache.keep_stream(call.caching)
    call.release()
    if result.outcome == CLIENT_GONE:
        state.metrics.record(call.namespace, call.feature, call.model, CLIENT_CLOSED, elapsed)
        _note(state, call, CLIENT_CLOSED, elapsed)
    else:
        error = None if result.outcome == COMPLETED else result.outcome
        state.metrics.record(call.namespace, call.feature, call.model, status, elapsed, error, trace_id=call.trace_id)
        _note(state, call, status, elapsed, error, first_chunk)
