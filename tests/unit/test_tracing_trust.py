"""A caller's `traceparent` decides nothing unless trusted: its sampled flag would otherwise force a trace of
every request it sends. Untrusted, the server span is a new root the configured sampler decides on, linked
to the caller's span. OpenTelemetry's own SDK and samplers, spans kept in memory."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, Sampler, TraceIdRatioBased

from servlane_core.tracing import TRACE_ID_HEADER
from servlane_gateway.flags import parse_settings
from servlane_web.tracing import TracingMiddleware

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
SAMPLED = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def serve(root: Sampler, trust: bool, traceparent: str | None) -> tuple[list[ReadableSpan], str]:
    """One request through the middleware under ParentBased(`root`), the chart's kind of sampler; the
    spans exported and the trace id the response named."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(root))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    middleware = TracingMiddleware(_ok, provider.get_tracer("test"), trust_incoming=trust)
    headers = [(b"traceparent", traceparent.encode())] if traceparent else []
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    asyncio.run(middleware(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    trace_id = dict(start["headers"])[TRACE_ID_HEADER.encode()].decode()
    return list(exporter.get_finished_spans()), trace_id


NEVER = TraceIdRatioBased(0.0)  # a ratio no new trace passes: only a parent could force one


def test_a_trusted_callers_sampled_traceparent_forces_the_trace() -> None:
    (span,), trace_id = serve(NEVER, trust=True, traceparent=SAMPLED)
    assert trace_id == CALLER_TRACE
    assert format(span.parent.span_id, "016x") == CALLER_SPAN  # type: ignore[union-attr]


def test_an_untrusted_callers_sampled_traceparent_decides_nothing() -> None:
    spans, trace_id = serve(NEVER, trust=False, traceparent=SAMPLED)
    assert spans == []  # the gateway's sampler said no, whatever the caller's flag
    assert trace_id != CALLER_TRACE  # a new trace: the caller does not pick the id a ratio decides on


def test_an_untrusted_caller_is_linked_not_continued() -> None:
    (span,), trace_id = serve(ALWAYS_ON, trust=False, traceparent=SAMPLED)
    assert span.parent is None
    assert format(span.context.trace_id, "032x") == trace_id != CALLER_TRACE
    (link,) = span.links
    assert (format(link.context.trace_id, "032x"), format(link.context.span_id, "016x")) == (CALLER_TRACE, CALLER_SPAN)


def test_without_a_traceparent_the_sampler_decides_as_before() -> None:
    (span,), _ = serve(ALWAYS_ON, trust=False, traceparent=None)
    assert span.parent is None
    assert not span.links
    assert serve(NEVER, trust=True, traceparent=None)[0] == []


def test_the_gateway_trusts_no_traceparent_unless_told(tmp_path: Path) -> None:
    routes = ["--routes-file", str(tmp_path / "routes.yaml")]
    assert parse_settings(routes, {}).trust_traceparent is False
    assert parse_settings([*routes, "--trust-traceparent", "true"], {}).trust_traceparent is True
    assert parse_settings(routes, {"SERVLANE_GATEWAY_TRUST_TRACEPARENT": "true"}).trust_traceparent is True


def test_the_collectors_password_never_reaches_the_log() -> None:
    """start_tracing logged the OTLP endpoint as given, userinfo and all (a child process: the tracer provider
    is global and set once)."""
    import os
    import subprocess
    import sys

    code = "import logging; logging.basicConfig(level=logging.INFO); from servlane_web.tracing import start_tracing; "
    code += "start_tracing('servlane-gateway')"
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "https://tenant:OTLPSECRETpass1@collector.invalid:4318"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "tracing on: OTLP/HTTP to https://***@collector.invalid:4318" in done.stderr, done.stderr
    assert "OTLPSECRETpass1" not in done.stderr + done.stdout
