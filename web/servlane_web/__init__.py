"""Servlane's shared web layer: what the runtime and the gateway serve HTTP with, alike.

- `tracing`: OpenTelemetry set-up (the SDK and the OTLP/HTTP exporter, imported only when tracing is on),
  a request's spans and the ASGI middleware that opens them.
- `errors`: the FastAPI adapter of the one error shape (`servlane_core.protocol.errors`).
- `client_watch`: cancel a request's work the moment its client disconnects (event-driven, no polling).

It sits between `servlane_core` (pure: no web framework, no OpenTelemetry) and the processes that serve
HTTP (`servlane_runtime`, `servlane_gateway`); the operator does not use it.
"""
