"""The least a proxy in front of the stub can do, on two servers: read the body, POST it upstream with the
gateway's own upstream client (servlane_gateway.http.upstream), answer with the upstream's body. No keys, no
routing, no limits, no metrics: what is left is the server layer and the sockets, so bench/server_layer_bench.py
can tell how much of the gateway's CPU per request its server (uvicorn with the gateway's protocol) costs, and
what another server (Granian's RSGI, its Rust HTTP layer) would save.

Run by the bench, never imported by the project: `MINIMAL_PROXY_UPSTREAM` is the stub's URL.
- uvicorn: `python bench/minimal_proxy.py uvicorn PORT` (uvloop, the gateway's own server settings:
  ServlaneHttpProtocol, no proxy-headers middleware, no access log);
- raw: `python bench/minimal_proxy.py raw PORT` (uvloop, an asyncio protocol of its own, no ASGI);
- Granian: `granian --interface rsgi --workers 1 --runtime-threads 1 --loop uvloop minimal_proxy:rsgi_app`.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from servlane_gateway.http.upstream import UpstreamPool

UPSTREAM = os.environ.get("MINIMAL_PROXY_UPSTREAM", "http://127.0.0.1:9") + "/v1/chat/completions"
HEADERS = {"content-type": "application/json"}
_pool: UpstreamPool | None = None


async def forward(body: bytes) -> tuple[int, bytes]:
    global _pool
    if _pool is None:
        _pool = UpstreamPool(5.0)
    response = await _pool.post(UPSTREAM, body, HEADERS)
    whole = response.whole_body()
    if whole is None:
        parts = []
        while (chunk := await response.next_chunk()) is not None:
            parts.append(chunk)
        whole = b"".join(parts)
    await response.aclose()
    return response.status_code, whole


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    status, whole = await forward(b"".join(parts))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(whole)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": whole})


class RsgiApp:
    async def __rsgi__(self, scope: Any, protocol: Any) -> None:
        status, whole = await forward(await protocol())
        protocol.response_bytes(status, [("content-type", "application/json")], whole)


rsgi_app = RsgiApp()


class RawProxyProtocol(asyncio.Protocol):
    """No ASGI at all: httptools parses the request, a task forwards it, the answer goes out in one write.
    Keep-alive only, no pipelining, no chunked request bodies: the least a server layer can do for this load."""

    def __init__(self) -> None:
        import httptools

        self._parser = httptools.HttpRequestParser(self)
        self._parts: list[bytes] = []
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self._parts.append(body)

    def on_message_complete(self) -> None:
        body, self._parts = b"".join(self._parts), []
        asyncio.get_running_loop().create_task(self._answer(body))

    async def _answer(self, body: bytes) -> None:
        status, whole = await forward(body)
        head = b"HTTP/1.1 %d OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % (status, len(whole))
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(head + whole)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None


async def serve_raw(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(RawProxyProtocol, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__" and sys.argv[1] == "raw":
    import uvloop

    uvloop.run(serve_raw(int(sys.argv[2])))
elif __name__ == "__main__":
    import uvicorn

    from servlane_gateway.workers import server_options

    port = int(sys.argv[2])
    uvicorn.run(asgi_app, host="127.0.0.1", port=port, loop="uvloop", log_level="warning", **server_options())
