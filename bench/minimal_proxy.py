"""The least a proxy in front of the stub can do, on two servers: read the body, POST it upstream with the
gateway's own upstream client (servlane_gateway.http.upstream), answer with the upstream's body. No keys, no
routing, no limits, no metrics: what is left is the server layer and the sockets, so bench/server_layer_bench.py
can tell how much of the gateway's CPU per request its server (uvicorn with the gateway's protocol) costs, and
what another server (Granian's RSGI, its Rust HTTP layer) would save.

Run by the bench, never imported by the project: `MINIMAL_PROXY_UPSTREAM` is the stub's URL.
- uvicorn: `python bench/minimal_proxy.py uvicorn PORT` (uvloop, the gateway's GatewayHttpProtocol);
- Granian: `granian --interface rsgi --workers 1 --runtime-threads 1 --loop uvloop minimal_proxy:rsgi_app`.
"""

from __future__ import annotations

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

if __name__ == "__main__":
    import uvicorn

    from servlane_gateway.http.server import GatewayHttpProtocol

    port = int(sys.argv[2])
    uvicorn.run(asgi_app, host="127.0.0.1", port=port, loop="uvloop", http=GatewayHttpProtocol, log_level="warning")
