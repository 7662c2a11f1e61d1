"""The runtime's /metrics on a port of its own (RuntimeConfig.metrics_port), never on the API port.

The model's OpenAI API answers without a key (the gateway enforces keys): with /metrics on the API port,
a scraper admitted to scrape it could call the model too, and no NetworkPolicy could tell the two apart.
On its own port, the operator's NetworkPolicy admits the scraper there and the gateway to the API only.

Both ports are listening sockets of the one uvicorn server; requests are told apart by the local port they
arrived on (the ASGI scope's `server`): the metrics port answers GET /metrics and GET /startup (the start's
phases as JSON, servlane_runtime.startup) and nothing else (404), and the API port has neither (the app has
no such routes).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Receive, Scope, Send

from servlane_api.cold_start import STARTUP_PATH
from servlane_api.runtime_config import METRICS_PATH
from servlane_runtime.runtime_metrics import RuntimeMetrics
from servlane_runtime.startup import StartupClock


def arrived_on(scope: Scope, port: int) -> bool:
    """Whether the request came in on the listener of local port `port`."""
    server: Sequence[object] | None = scope.get("server")
    return server is not None and len(server) == 2 and server[1] == port


class MetricsPort:
    """Outermost ASGI layer: requests that arrived on the metrics port get /metrics or /startup (or 404),
    never the API; all others go to the app."""

    def __init__(self, app: ASGIApp, port: int, metrics: RuntimeMetrics, startup: StartupClock) -> None:
        self.app = app
        self.port = port
        self.metrics = metrics
        self.startup = startup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not arrived_on(scope, self.port):
            await self.app(scope, receive, send)
            return
        reading = scope["method"] in ("GET", "HEAD")
        if scope["path"] == METRICS_PATH and reading:
            status, body, content_type = 200, self.metrics.render(), CONTENT_TYPE_LATEST
        elif scope["path"] == STARTUP_PATH and reading:
            status, body, content_type = 200, self.startup.snapshot().model_dump_json().encode(), "application/json"
        else:
            status, content_type = 404, "application/json"
            error = {
                "message": f"the metrics port serves {METRICS_PATH} and {STARTUP_PATH} only; the API is on the "
                "runtime's port",
                "type": "invalid_request_error",
                "code": "not_found",
            }
            body = json.dumps({"error": error}).encode()
        headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})


def bind_listeners(app: ASGIApp, host: str, port: int, metrics_port: int) -> list[socket.socket]:
    """The API socket and the metrics socket, bound as uvicorn binds its own (it exits on a port in use)."""
    return [uvicorn.Config(app, host=host, port=p).bind_socket() for p in (port, metrics_port)]
