"""Tracing's configuration, read alike by the gateway and the runtime (pure: no OpenTelemetry here).

Configured with OpenTelemetry's own environment variables, as every OTel SDK reads them:
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (or `OTEL_EXPORTER_OTLP_ENDPOINT`) turns it on, exported over
OTLP/HTTP (protobuf); `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` sample (default: parent-based,
always on; the chart sets `parentbased_traceidratio` and the ratio); `OTEL_SERVICE_NAME` names the service.
The SDK, the exporter and the middleware that opens a request's spans are in `servlane_web.tracing`.
"""

from __future__ import annotations

import os

TRACE_ID_HEADER = "x-trace-id"
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def tracing_endpoint(environ: dict[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    return next((env[name] for name in ENDPOINT_VARIABLES if env.get(name)), None)


def traces_url(environ: dict[str, str] | None = None) -> str | None:
    """The full OTLP/HTTP traces URL (what vLLM's own exporter is given)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return f"{base.rstrip('/')}/v1/traces" if base else None
