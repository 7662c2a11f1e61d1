"""OpenTelemetry tracing for the gateway and the runtime: off unless an OTLP endpoint is configured.

The endpoint and the sampler come from OpenTelemetry's own environment variables
(`servlane_core.tracing`). Context crosses processes as W3C `traceparent` (OTel's default propagator).
The SDK is imported only when tracing is on, so a server without it pays nothing.

A caller's `traceparent` is trusted only where the server is told to (`trust_incoming`): under a
parent-based sampler a sampled parent forces its child's sampling, so a caller that sets the flag on
every request has every request traced (an exporter's and a collector's worth of load, on the server's
bill). Untrusted, the server span starts a new trace and links the caller's span instead: the configured
sampler decides as for any root span. It does not continue the caller's trace id under its own decision:
TraceIdRatioBased decides by the trace id, which the caller would then choose.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from typing import Any

from servlane_core.redaction import redact
from servlane_core.tracing import TRACE_ID_HEADER, tracing_endpoint

log = logging.getLogger(__name__)


def start_tracing(service_name: str) -> Any | None:
    """A tracer for `service_name` when tracing is configured, else None (and nothing is imported)."""
    if tracing_endpoint() is None:
        return None
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or service_name})
    provider = TracerProvider(resource=resource)  # the sampler comes from OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    endpoint = redact(str(tracing_endpoint()))  # a collector's URL may carry a password
    log.info("tracing on: OTLP/HTTP to %s as %s", endpoint, resource.attributes["service.name"])
    return trace.get_tracer(service_name)


def stop_tracing() -> None:
    """Export what is buffered (at shutdown)."""
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    shutdown = getattr(provider, "shutdown", None)
    if shutdown is not None:
        shutdown()


class Phase:
    """A child span of a request (no-op when tracing is off)."""

    def __init__(self, span: Any = None) -> None:
        self._span = span

    @property
    def recording(self) -> bool:
        """Whether attributes and events are kept: callers skip building them when not (tracing off)."""
        return self._span is not None

    def event(self, name: str, **attributes: Any) -> None:
        if self._span is not None:
            self._span.add_event(name, attributes)

    def set(self, **attributes: Any) -> None:
        if self._span is not None:
            self._span.set_attributes({k: v for k, v in attributes.items() if v is not None})

    def fail(self, description: str) -> None:
        if self._span is not None:
            from opentelemetry.trace import Status, StatusCode

            self._span.set_status(Status(StatusCode.ERROR, description))

    def headers(self) -> dict[str, str]:
        """This span's context as W3C `traceparent` headers, for the next process (empty when off)."""
        if self._span is None:
            return {}
        from opentelemetry import propagate, trace

        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(self._span))
        return carrier

    def end(self) -> None:
        if self._span is not None:
            self._span.end()
            self._span = None

    def __enter__(self) -> Phase:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _tb: object) -> None:
        if self._span is None:  # tracing off (or ended already): nothing to record
            return
        if exc is not None and not isinstance(exc, GeneratorExit):
            self.fail(f"{type(exc).__name__}: {exc}")
        self.end()


class RequestSpans(Phase):
    """The server span of one request and a way to open its children (all no-ops when tracing is off)."""

    def __init__(self, tracer: Any = None, span: Any = None) -> None:
        super().__init__(span)
        self._tracer = tracer
        self.trace_id: str | None = None
        if span is not None:
            self.trace_id = format(span.get_span_context().trace_id, "032x")

    def phase(self, name: str, attributes: dict[str, Any] | None = None, *, client: bool = False) -> Phase:
        """A child span, ended by `with` or by end(); `client`: a call to another process."""
        if self._tracer is None or self._span is None:
            return NO_PHASE  # no object per phase per request when tracing is off
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        kind = SpanKind.CLIENT if client else SpanKind.INTERNAL
        context = trace.set_span_in_context(self._span)
        span = self._tracer.start_span(name, context=context, kind=kind, attributes=attributes or None)
        return Phase(span)


NO_SPANS = RequestSpans()
NO_PHASE = Phase()  # holds no span, so ending or failing it does nothing: one is shared by every request
SCOPE_KEY = "servlane.spans"


def spans_of(scope: MutableMapping[str, Any]) -> RequestSpans:
    """The request's spans that TracingMiddleware put in its ASGI scope (NO_SPANS without tracing)."""
    found = scope.get(SCOPE_KEY)
    return found if isinstance(found, RequestSpans) else NO_SPANS


class TracingMiddleware:
    """Pure ASGI: a server span around each OpenAI request (continuing a caller's `traceparent`), ended when
    the response is done (a stream's last byte), with the trace id in the `x-trace-id` response header so an
    error a client reports leads to its trace. Without `trust_incoming`, the caller's context becomes a
    link of a new root span (see the module's docstring), never the parent."""

    def __init__(self, app: Any, tracer: Any, prefix: str = "/v1/", trust_incoming: bool = True) -> None:
        self.app = app
        self.tracer = tracer
        self.prefix = prefix
        self.trust_incoming = trust_incoming

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        from opentelemetry import propagate, trace
        from opentelemetry.context import Context
        from opentelemetry.trace import Link, SpanKind

        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers") or []}
        name = f"{scope['method']} {scope['path']}"
        attributes = {"http.request.method": scope["method"], "url.path": scope["path"]}
        incoming = propagate.extract(carrier)
        if self.trust_incoming:
            span = self.tracer.start_span(name, context=incoming, kind=SpanKind.SERVER, attributes=attributes)
        else:
            caller = trace.get_current_span(incoming).get_span_context()
            links = [Link(caller)] if caller.is_valid else None
            span = self.tracer.start_span(
                name, context=Context(), kind=SpanKind.SERVER, attributes=attributes, links=links
            )
        spans = RequestSpans(self.tracer, span)
        scope[SCOPE_KEY] = spans
        trace_id = (spans.trace_id or "").encode()

        async def send_with_trace_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status = int(message["status"])
                spans.set(**{"http.response.status_code": status})
                if status >= 500:
                    spans.fail(f"HTTP {status}")
                message = {**message, "headers": [*message.get("headers", []), (TRACE_ID_HEADER.encode(), trace_id)]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_trace_id)
        except BaseException as exc:
            spans.fail(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            spans.end()
