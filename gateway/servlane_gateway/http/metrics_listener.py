"""The gateway's /metrics on a port of its own (--metrics-port), never on the API port.

/metrics lists every namespace's features, models, traffic and trace ids (exemplars), and answers without
an API key: on the API port, whoever may call the API could read it, and no NetworkPolicy could tell the
two apart. On its own port, a NetworkPolicy admits the scraper there and the clients to the API only.

Both ports are listening sockets of the one uvicorn server (every worker process accepts on both, as on the
API port before), so a scrape still reports the pod's sums whichever worker answers it. The app tells
them apart by the local port a connection arrived on: the metrics port answers GET /metrics and nothing
else (404), and the API port has no /metrics.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
from collections.abc import Sequence

import uvicorn
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.types import Receive, Scope, Send

METRICS_PATH = "/metrics"
_ASKED = (b"accept", b"accept-encoding")
APP_FACTORY = "servlane_gateway.workers:worker_app"  # named only: binding a socket loads no app


def arrived_on(scope: Scope, port: int) -> bool:
    """Whether the request came in on the listener of local port `port` (the ASGI scope's `server`)."""
    server: Sequence[object] | None = scope.get("server")
    return server is not None and len(server) == 2 and server[1] == port


class MetricsEndpoint:
    """What the metrics listener answers: the registry at GET /metrics (OpenMetrics with exemplars when the
    scraper asks for it, as Prometheus does), 404 elsewhere: it serves no API, so admitting a scraper to
    this port never admits it to the models."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def render(self, accept: str, accept_encoding: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """The exposition as prometheus_client's own ASGI app makes it (format by Accept, gzip when asked)."""
        encoder, content_type = choose_encoder(accept)
        output = encoder(self._registry)
        headers = [(b"content-type", content_type.encode())]
        if "gzip" in accept_encoding:
            output = gzip.compress(output)
            headers.append((b"content-encoding", b"gzip"))
        return output, headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] == METRICS_PATH and scope["method"] in ("GET", "HEAD"):
            asked = {name: value.decode("latin-1") for name, value in scope["headers"] if name in _ASKED}
            # On a thread, never on the event loop: with 1,000 routes the exposition is ~45,000 lines and takes
            # over a second to render (summing the workers' files included), a second in which every request
            # of this worker would wait (bench/route_rebuild_bench.py). On a thread the loop keeps its turns.
            output, headers = await asyncio.to_thread(
                self.render, asked.get(b"accept", ""), asked.get(b"accept-encoding", "")
            )
            headers.append((b"content-length", str(len(output)).encode()))
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": output})
            return
        body = json.dumps(
            {
                "error": {
                    "message": f"the metrics port serves {METRICS_PATH} only; the API is on the gateway's port",
                    "type": "invalid_request_error",
                    "code": "not_found",
                }
            }
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 404, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def bind_listeners(host: str, port: int, metrics_port: int) -> list[socket.socket]:
    """The API socket and the metrics socket, bound as uvicorn binds its own (it exits on a port in use)."""
    return [uvicorn.Config(APP_FACTORY, host=host, port=p).bind_socket() for p in (port, metrics_port)]
