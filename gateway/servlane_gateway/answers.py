"""The backend's answer to one call: opening and reading it (the pod's outcome judged on the way), the
response the client gets (relayed as a stream, or whole), and the call's counting when it ends: metrics,
usage charged to its admission, the answer kept by the response cache, the console's record."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

from pydantic_core import from_json
from starlette.responses import Response

from servlane_core.protocol.errors import OpenAIError
from servlane_gateway.cache.rules import CACHE_HEADER, MISS, Caching
from servlane_gateway.cache.store import Leading
from servlane_gateway.gateway_metrics import NONE, exemplar
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
from servlane_gateway.limits.rates import Hold
from servlane_gateway.routing.pods import Lease
from servlane_gateway.state import GatewayState
from servlane_web.tracing import NO_SPANS, Phase

CLIENT_CLOSED = 499  # the `code` label of a request the client abandoned (nginx's convention)


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


def note(
    state: GatewayState, call: Call, status: int, seconds: float, error: str | None = None, ttft: float | None = None
) -> None:
    """The console's record of a finished request (next to each final metrics record)."""
    if state.recent is not None:
        state.recent.add(call.namespace, call.feature, call.model, status, seconds, error, call.trace_id, ttft)


def _is_event_stream(upstream: UpstreamResponse) -> bool:
    return upstream.status_code < 400 and "text/event-stream" in upstream.headers.get("content-type", "")


async def exchange(
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


def respond(state: GatewayState, call: Call, upstream: UpstreamResponse, content: bytes | None) -> Response:
    after_upstream = time.perf_counter()
    headers = _response_headers(upstream)
    if call.caching is not None:
        headers[CACHE_HEADER] = MISS
        call.caching.content_type = headers["content-type"]
    if content is None:  # a stream: relayed as it comes
        headers |= {"cache-control": "no-cache", "x-accel-buffering": "no"}
        state.metrics.added.observe(call.gateway_seconds + time.perf_counter() - after_upstream)
        done = partial(stream_done, state, call, upstream.status_code)
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
    note(state, call, upstream.status_code, elapsed, ttft=elapsed if upstream.status_code < 400 else None)
    response = WholeAnswer(content, upstream.status_code, headers)
    state.metrics.added.observe(call.gateway_seconds + time.perf_counter() - after_upstream)
    return response


class WholeAnswer(Response):
    """A backend's whole answer as the client gets it: what Starlette's Response makes of the same content, status
    and headers, without its general header handling per request (the names here are lower-case already)."""

    def __init__(self, content: bytes, status_code: int, headers: dict[str, str]) -> None:
        self.status_code = status_code
        self.background = None
        self.body = content
        raw = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
        if status_code >= 200 and status_code not in (204, 304):  # as Response: no length for these
            raw.append((b"content-length", b"%d" % len(content)))
        self.raw_headers = raw


def _usage_of(content: bytes) -> object:
    try:
        parsed = from_json(content)  # pydantic's parser (Rust): an answer can be long
    except ValueError:
        return None
    return parsed.get("usage") if isinstance(parsed, dict) else None


def _count_usage(state: GatewayState, call: Call, usage: object) -> int | None:
    """Counts the usage in the metrics; the tokens to charge, or None without a usage object."""
    tokens = state.metrics.record_usage(call.namespace, call.feature, call.model, usage)
    return tokens if isinstance(usage, dict) else None


def stream_done(state: GatewayState, call: Call, status: int, result: StreamResult) -> None:
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
        note(state, call, CLIENT_CLOSED, elapsed)
    else:
        error = None if result.outcome == COMPLETED else result.outcome
        state.metrics.record(call.namespace, call.feature, call.model, status, elapsed, error, trace_id=call.trace_id)
        note(state, call, status, elapsed, error, first_chunk)
