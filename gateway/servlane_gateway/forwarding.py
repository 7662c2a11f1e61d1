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

import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, NamedTuple

from fastapi import Request
from pydantic_core import to_json
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from servlane_core.protocol.errors import OpenAIError, model_not_found, overloaded
from servlane_core.routing.defaults import apply_defaults
from servlane_core.routing.endpoint_pick import PREFIX_AFFINITY
from servlane_core.routing.picking import pick_backend
from servlane_core.routing.prompt_prefix import prompt_prefix
from servlane_core.routing.routes import Backend, Route
from servlane_core.routing.waking import waking_pick
from servlane_gateway.access import route_for
from servlane_gateway.answers import CLIENT_CLOSED, Call, exchange, note, respond
from servlane_gateway.cache.rules import COALESCED, HIT, CacheKey, Caching, Entry, lookup_key
from servlane_gateway.endpoints import ENDPOINTS
from servlane_gateway.gateway_metrics import NONE
from servlane_gateway.http.held_stream import HeldStreamResponse
from servlane_gateway.http.request import (
    STREAMING_ENDPOINTS,
    ask_for_usage,
    error_response,
    header,
    parse_body,
    priority_of,
    read_capped,
    sticky_id,
)
from servlane_gateway.http.upstream import (
    UpstreamConnectError,
)
from servlane_gateway.limits.rates import estimate_tokens
from servlane_gateway.state import GatewayState
from servlane_web.client_watch import ClientGone, unless_client_leaves
from servlane_web.tracing import NO_PHASE, RequestSpans, spans_of

log = logging.getLogger(__name__)

# Pods of one backend tried for a request whose connections they refuse, before another backend (once).
# Two: a second refusal in a row says more about the version than the pod, and ejection keeps dead pods
# out of later picks.
MAX_POD_ATTEMPTS = 2


class Asked(NamedTuple):
    """A request past authentication, routing and the limits, on its way to a backend."""

    request: Request
    endpoint: str
    call: Call
    route: Route
    body: dict[str, Any]
    priority: str | None


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
        log.exception("unexpected error while proxying%s", _tracenote(spans_of(request.scope)))
        error = OpenAIError(500, "The gateway had an error while processing your request.", type="server_error")
    _failed(state, call, error)
    return error_response(error)


def _client_left(state: GatewayState, call: Call) -> None:
    call.release()
    call.settle(None)  # the backend may have generated before the call was cancelled
    state.metrics.record(call.namespace, call.feature, call.model, CLIENT_CLOSED, time.perf_counter() - call.started)
    note(state, call, CLIENT_CLOSED, time.perf_counter() - call.started)


def _failed(state: GatewayState, call: Call, error: OpenAIError) -> None:
    """Counts a request that ended with the gateway's own error (`error`), and settles its admission."""
    call.release()
    # A timed-out backend may have generated; every other error here means no backend answer to charge.
    call.settle(None if error.status == 504 else 0)
    reason = {503: "upstream_unavailable", 502: "upstream_unavailable", 504: "upstream_timeout"}.get(error.status)
    elapsed = time.perf_counter() - call.started
    state.metrics.record(call.namespace, call.feature, call.model, error.status, elapsed, reason)
    note(state, call, error.status, elapsed, reason)


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
        if spans.recording:
            spans.set(**{"gen_ai.request.model": body["model"], "servlane.namespace": route.namespace})
            spans.set(**{"servlane.feature": route.name, "servlane.key": call.key_name})
        apply_defaults(body, route.defaults, endpoint)  # first: the feature's max_tokens cap sizes the reservation
        reserve = estimate_tokens(body, len(raw), endpoint, state.reserved_completion_tokens)
        call.admission = await state.limiter.acquire(call.key_name, route.namespace, route.name, reserve)
        routing.event("admitted")
    call.strip_usage = ask_for_usage(body, endpoint)
    return await _forward(state, Asked(request, endpoint, call, route, body, priority))


async def _forward(state: GatewayState, asked: Asked) -> Response:
    request, endpoint, call, route, body, _ = asked
    sticky = sticky_id(request, body)
    # A client (its key, else its sticky id) stays pinned to a version only up to its fair share of it.
    pick = state.sticky_guard.pick(route, sticky, call.key_name or sticky)
    backend = pick.backend
    if pick.unpinned and backend is not None:
        state.metrics.sticky_unpinned.labels(route.namespace, route.name, backend.model).inc()
    if backend is None and state.hold is not None and (waking := waking_pick(route, sticky)) is not None:
        return await _when_ready(state, asked, sticky, waking)
    # After admission, so the limits hold for answers from the cache too (they are charged no tokens).
    key = lookup_key(body, endpoint, route, backend) if state.cache is not None else None
    if state.cache is not None and key is not None and (entry := await state.cache.get(key)) is not None:
        return _from_cache(state, call, request, entry, HIT)
    to_backend = partial(_to_backend, state, asked, backend, key, sticky)
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


async def _when_ready(state: GatewayState, asked: Asked, sticky: str | None, backend: Backend) -> Response:
    """No backend of the route is ready, `backend` (picked by weight among the waking ones) is on its way:
    the request goes to it now if a pod of it already takes requests, else once one does (held: see
    servlane_gateway.routing.hold). A held stream gets its response head at once (held_stream). Not answered from
    the response cache: the request has waited for a model that was not up, nothing identical was answered."""
    request, endpoint, call, _, body, _ = asked
    assert state.hold is not None
    send_to = partial(_to_backend, state, asked)
    if state.pods.is_live(backend):
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
    state: GatewayState, asked: Asked, backend: Backend | None, key: CacheKey | None, sticky: str | None
) -> Response:
    request, endpoint, call, route, body, priority = asked
    spans = spans_of(request.scope)
    # identity: the relay passes the body on as it comes and says no Content-Encoding, so the backend must not
    # compress (a missing Accept-Encoding allows any coding, RFC 9110).
    headers = {
        "content-type": "application/json",
        "accept": header(request, b"accept") or "*/*",
        "accept-encoding": "identity",
    }
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
        picking = NO_PHASE
        if spans.recording:
            picking = spans.phase("pick", {"servlane.model": backend.model, "servlane.routing": route.routing})
        with picking:
            lease = state.pods.choose(backend, route.routing, prefix, exclude=tried_targets)
            if picking.recording:
                picking.set(**{"server.address": lease.base_url if lease is not None else None})
        if lease is None:  # a pod of this backend was tried, and no other pod is left to try
            backend = _another_backend(state, call, route, backend, sticky, tried)
            on_backend = 0
            continue
        call.model = backend.model
        body["model"] = backend.served_model_name
        # pydantic's serialiser (Rust), the parser's twin: 2.7x json.dumps on a chat turn, 5x on a 100 kB prompt.
        payload = to_json(body)
        if not tried_targets:
            call.gateway_seconds = time.perf_counter() - call.started
        url = lease.base_url + _PATHS[endpoint]
        attempt = NO_PHASE
        if spans.recording:
            attempt = spans.phase(
                "upstream", {"server.address": lease.base_url, "servlane.model": backend.model}, client=True
            )
        try:
            with attempt:
                sent_headers = headers | attempt.headers() if attempt.recording else headers
                exchanging = exchange(state, url, payload, sent_headers, stream, lease, attempt)
                upstream, content = await unless_client_leaves(request.scope, request.receive, exchanging)
                if attempt.recording:
                    attempt.set(**{"http.response.status_code": upstream.status_code})
            break
        except UpstreamConnectError:
            log.warning(
                "backend %s/%s refused the connection (%s)%s",
                backend.namespace, backend.model, lease.base_url, _tracenote(spans),
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
    return respond(state, call, upstream, content)


def _tracenote(spans: RequestSpans) -> str:
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


_PATHS = {e.name: e.path for e in ENDPOINTS}
