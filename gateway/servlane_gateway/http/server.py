"""The gateway's HTTP/1.1 server protocol: uvicorn's httptools one, with less work per proxied request.

Profiles of the gateway under load put a good part of its CPU per request in uvicorn's protocol. Three
changes, invisible to the ASGI app except through the two extensions below:
- one write per whole response: uvicorn writes a response's head as soon as the app starts the response, and
  its body in a second write; a head that announces its Content-Length now waits for the body (or the
  response's end) and goes out with it. Streamed (chunked) responses write their head at once, as before:
  a client sees a stream's status before its first token.
- a disconnect callback (`DISCONNECT_EXTENSION` in the scope's extensions): the proxy registers a callback
  that the connection's loss calls, where it would otherwise run a watcher task per request that waits for
  `http.disconnect` (servlane_web.client_watch falls back to that under any other server).
- a body writer (`BODY_WRITER_EXTENSION`, called with the app's `send`): a relayed stream's chunks are written
  from the upstream connection's callback straight to the client, where ASGI's send costs a task switch, a
  message and uvicorn's checks per token (servlane_gateway.http.proxy falls back to send under any other server,
  and whenever the writer is not ready).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from servlane_web.client_watch import DISCONNECT_EXTENSION

BODY_WRITER_EXTENSION = "servlane.body_writer"


class HeadHoldingTransport:
    """Holds a response head that carries a Content-Length until the next write, and writes both at once."""

    __slots__ = ("_held", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif data.startswith(b"HTTP/1.1 ") and data.endswith(b"\r\n\r\n") and b"\r\ncontent-length: " in data:
            self._held = data  # uvicorn writes a head whole, header names lowercased
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """A held head goes out now: the response ended without a body write (HEAD, an empty body)."""
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    # The calls uvicorn makes per request, delegated without __getattr__'s lookup.
    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class BodyWriter:
    """Writes chunks of one response's chunked body to its connection, outside ASGI's send: for a caller that
    is not a coroutine (a protocol callback), and only while `ready()`, i.e. the response is in the middle of a
    chunked body (its head sent, its end not), the client is there and its transport takes more (not paused
    for back-pressure); otherwise the caller sends through ASGI, which waits for the client to drain. Bound to
    one request's cycle: with pipelined requests the protocol's current cycle may be another's."""

    __slots__ = ("_cycle", "_flow", "_transport")

    def __init__(self, cycle: Any, flow: Any, transport: Any) -> None:
        self._cycle = cycle
        self._flow = flow
        self._transport = transport

    def ready(self) -> bool:
        cycle = self._cycle
        return (
            cycle.response_started
            and not cycle.response_complete
            and not cycle.disconnected
            and cycle.chunked_encoding is True
            and not self._flow.write_paused
        )

    def write(self, body: bytes) -> None:
        """One chunk; the caller has just checked ready() (and an empty body is no chunk: it would end the body)."""
        if body:
            self._transport.write(b"%x\r\n%b\r\n" % (len(body), body))


class GatewayHttpProtocol(HttpToolsProtocol):
    """Pass as uvicorn's `http` (servlane_gateway.workers.server_options())."""

    _on_lost: Callable[[], None] | None = None
    _lost = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(HeadHoldingTransport(transport))  # type: ignore[arg-type]

    def on_message_begin(self) -> None:
        super().on_message_begin()
        extensions: dict[str, Any] = self.scope.setdefault("extensions", {})
        extensions[DISCONNECT_EXTENSION] = self._on_disconnect
        extensions[BODY_WRITER_EXTENSION] = self._body_writer

    def _body_writer(self, send: Any) -> BodyWriter | None:
        """The writer of the response that `send` (the ASGI send the app was given) belongs to, made only for a
        relayed stream. Found through `send` itself, uvicorn's bound RequestResponseCycle.send, not the protocol's
        current cycle: with pipelined requests that may be another's. None when `send` is not that (a middleware
        wrapped it): the relay then sends through ASGI."""
        cycle = getattr(send, "__self__", None)
        if not isinstance(cycle, RequestResponseCycle) or cycle.flow is not self.flow:
            return None
        return BodyWriter(cycle, self.flow, cycle.transport)

    def _on_disconnect(self, callback: Callable[[], None] | None) -> None:
        if callback is not None and self._lost:
            callback()
            return
        self._on_lost = callback

    def on_response_complete(self) -> None:
        self.transport.flush()  # type: ignore[attr-defined]
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        super().connection_lost(exc)
        callback, self._on_lost = self._on_lost, None
        if callback is not None:
            callback()
