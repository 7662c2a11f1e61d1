"""Servlane's HTTP/1.1 server protocol, the gateway's and the runtime's: uvicorn's httptools one, with less work
per proxied request, deadlines for slow clients and OpenAI-shaped refusals. Each server passes it as uvicorn's
`http` (servlane_gateway.workers.server_options, servlane_runtime.__main__); the app served may say its own
deadlines as a `client_timeouts` attribute (the gateway's come from its settings, the runtime uses the
defaults).

Profiles of the gateway under load put a good part of its CPU per request in uvicorn's protocol. Three
changes, invisible to the ASGI app except through the two extensions below, and a fourth for safety:
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
- deadlines for the client's side of a request (`ClientTimeouts`): uvicorn waits as long as a client likes for a
  request's head, and for the rest of its body, so a client (a tenant's app, a scanner) that opens connections
  and trickles bytes holds each open for good, and enough of them exhaust the gateway for every tenant. A head
  must arrive whole within `head` seconds of its first byte, and a body may pause at most `body_idle` seconds
  between two reads; otherwise the client gets a 408 in the OpenAI error shape and the connection closes. A new
  connection that sends nothing for `head` seconds is closed. One timer per server checks every connection
  (`_Sweeper`), not a timer per request: the per-request cost is a clock read per socket read.
- a deadline for the client's reading (`ClientTimeouts.read_stall`): a client that stops reading its answer
  fills the socket's buffers, and then uvicorn waits for good (to drain before the next write, or to flush
  before it closes), holding the connection and, through the relay's back-pressure, the upstream connection
  and the request at the runtime. When writing has been paused (the buffers full) for `read_stall` seconds
  without resuming, the connection is reset: what was unsent is dropped, and the relay's disconnect callback
  closes the upstream connection, which ends the request at the runtime. A slow reader is not cut: writing
  resumes, and the clock starts over, each time it takes a few tens of kB (the transport's low water mark).
- a bound on a request head's size (`MAX_HEAD_BYTES` beyond the read that began it): httptools keeps an
  unfinished header line in memory however long it grows, so one client could fill the gateway's memory
  before any key is checked (a 200 MB header took 200 MB). A longer head gets a 431 and the connection closes.
- HTTP/1.0 clients get streams they can read (`CloseDelimitedCycle`): not chunked, ended by the close.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from servlane_core.protocol.errors import OpenAIError
from servlane_web.client_watch import DISCONNECT_EXTENSION

log = logging.getLogger(__name__)

BODY_WRITER_EXTENSION = "servlane.body_writer"
_SWEEPER = "servlane_sweeper"  # the server's _Sweeper, kept on uvicorn's per-server state


@dataclass(frozen=True)
class ClientTimeouts:
    """How long a client may take to send its request (see the module's docstring). The app served says its own
    as a `client_timeouts` attribute (servlane_gateway.app sets the gateway's from its settings; the runtime
    keeps these defaults)."""

    head: float = 30.0
    body_idle: float = 60.0
    read_stall: float = 60.0


def _client_timeouts(app: Any) -> ClientTimeouts:
    """The served app's timeouts, looked for through the wrappers uvicorn may put around it."""
    for _ in range(8):
        found = getattr(app, "client_timeouts", None)
        if isinstance(found, ClientTimeouts):
            return found
        app = getattr(app, "app", None)
        if app is None:
            break
    return ClientTimeouts()


# Of a request's head, beyond the read its first byte came in. httptools holds an unfinished header line whole in
# memory, however long: without a bound, a client (before any key check) grows the gateway by what it sends.
MAX_HEAD_BYTES = 64 * 1024


def _refusal(status: bytes, message: str, code: str) -> bytes:
    """A whole answer in the OpenAI error shape, for a request the app never saw: it closes the connection."""
    body = json.dumps(OpenAIError(int(status[:3]), message, code=code).body()).encode()
    head = b"HTTP/1.1 %b\r\ncontent-type: application/json\r\nconnection: close\r\n" % status
    return head + b"content-length: %d\r\n\r\n%b" % (len(body), body)


class _Sweeper:
    """Every `interval` seconds, while the server has connections, closes those whose client is overdue with
    its request (ServlaneHttpProtocol.close_if_overdue): one timer per server, started by its connections."""

    def __init__(self, loop: asyncio.AbstractEventLoop, connections: set[Any], timeouts: ClientTimeouts) -> None:
        self.loop = loop
        self.connections = connections  # uvicorn's set of the server's open connections (protocols)
        self.timeouts = timeouts
        # A deadline is kept to within a quarter of itself (and a second).
        self.interval = max(0.01, min(1.0, timeouts.head / 4, timeouts.body_idle / 4, timeouts.read_stall / 4))
        self._timer: asyncio.TimerHandle | None = None

    def ensure_running(self) -> None:
        if self._timer is None:
            self._timer = self.loop.call_later(self.interval, self._sweep)

    def _sweep(self) -> None:
        self._timer = None
        now = self.loop.time()
        try:
            for connection in list(self.connections):
                if isinstance(connection, ServlaneHttpProtocol):
                    connection.close_if_overdue(now, self.timeouts)
        except Exception:  # a bug here must not end the sweeps: the next one tries again
            log.exception("checking the connections' deadlines failed")
        if self.connections:
            self.ensure_running()


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


class CloseDelimitedCycle(RequestResponseCycle):
    """A request's cycle for an HTTP/1.0 client: an answer of unknown length (a stream) is sent as it comes and
    ended by closing the connection. uvicorn frames it with Transfer-Encoding: chunked whatever the request's
    version, which an HTTP/1.0 client does not know (RFC 9112 6.1: a server MUST NOT send it to one): it would
    read the chunks' sizes as part of the answer. HTTP/1.0 connections are not kept alive, so the close ends the
    answer unambiguously."""

    _close_delimited = False

    async def send(self, message: Any) -> None:
        if message["type"] == "http.response.start" and not self.response_started:
            names = {name.lower() for name, _ in message.get("headers", ())}
            if b"content-length" not in names and b"transfer-encoding" not in names and self.scope["method"] != "HEAD":
                self._close_delimited = True
                self.chunked_encoding = False  # uvicorn adds no Transfer-Encoding for a False
        elif message["type"] == "http.response.body" and self._close_delimited:
            # uvicorn counts a body without chunks down from its Content-Length: the length is this part's.
            self.expected_content_length = len(message.get("body", b""))
        await super().send(message)


class ServlaneHttpProtocol(HttpToolsProtocol):
    """Pass as uvicorn's `http` (servlane_gateway.workers.server_options(), servlane_runtime.__main__.serve)."""

    _on_lost: Callable[[], None] | None = None
    _lost = False
    _heard_at = 0.0  # loop time of the connection's last read
    _head_began = 0.0  # loop time the current request's head began: the read with its first byte
    _head_bytes = 0  # bytes of the current head read after the read that began it
    _write_paused_at = 0.0  # loop time writing paused (the client not taking what is sent); 0.0: not paused

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(HeadHoldingTransport(transport))  # type: ignore[arg-type]
        self._head_began = self._heard_at = self.loop.time()  # the first request's head is waited for from now
        sweeper = getattr(self.server_state, _SWEEPER, None)
        if sweeper is None:
            sweeper = _Sweeper(self.loop, self.connections, _client_timeouts(self.app))
            setattr(self.server_state, _SWEEPER, sweeper)
        sweeper.ensure_running()

    def data_received(self, data: bytes) -> None:
        self._heard_at = self.loop.time()
        scope = self.scope
        # A head begun by an earlier read and still not whole: this read is all head if it leaves it unfinished.
        continued = scope is not None and (self.cycle is None or self.cycle.scope is not scope)
        super().data_received(data)
        if continued and self.scope is scope and (self.cycle is None or self.cycle.scope is not scope):
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                self._refuse(
                    b"431 Request Header Fields Too Large", "The request's headers are too large.", "headers_too_large"
                )

    def pause_writing(self) -> None:
        super().pause_writing()
        self._write_paused_at = self.loop.time()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._write_paused_at = 0.0

    def close_if_overdue(self, now: float, timeouts: ClientTimeouts) -> None:
        """Answers 408 and closes when the client is late with the current request: its head not whole within
        `timeouts.head` of its first byte, or its body silent for `timeouts.body_idle` while the app waits for
        it. Never while the client waits for us: a response under way (the next head, pipelined, waits for its
        end), a 100 Continue not sent yet, reading paused because the app has not taken what came. Resets the
        connection when writing has stayed paused for `timeouts.read_stall` (the client took too little to bring
        the buffer below its low water mark), whatever the response's state, closing included. The common
        cases (answering, idle between requests) return after a few attribute reads: a sweep visits every
        connection of the process once a second, streams included."""
        paused_at = self._write_paused_at
        if paused_at and now - paused_at >= timeouts.read_stall:
            self._write_paused_at = 0.0
            log.debug("resetting a connection whose client read nothing for %.0f s", timeouts.read_stall)
            self._reset_connection()
            return
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:  # the current request's head is whole
            if (
                not cycle.more_body
                or cycle.response_started
                or cycle.waiting_for_100_continue
                or self.flow.read_paused
                or now - self._heard_at < timeouts.body_idle
            ):
                return
            message = "The request's body stopped arriving."
        else:
            if (cycle is not None and not cycle.response_complete) or now - self._head_began < timeouts.head:
                return
            message = "The request's headers did not arrive in time."
        if self.transport.is_closing():
            return
        if self.scope is None:  # not a byte since the connection opened: nothing to answer
            log.debug("closing a connection that sent no request in %.0f s", timeouts.head)
            self.transport.close()
            return
        self._refuse(b"408 Request Timeout", message, "request_timeout")

    def _reset_connection(self) -> None:
        """Ends the connection at once with a reset: what is unsent is dropped, in our buffer and in the kernel's
        (a plain close would leave the kernel trying to deliver its buffer to a client that takes nothing)."""
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def send_400_response(self, msg: str) -> None:
        """A request httptools cannot parse (a control character in a header, a malformed Content-Length, both
        it and Transfer-Encoding, a request line over its limit): uvicorn answers in text/plain, and the
        gateway's callers read OpenAI's error shape everywhere. The connection closes, as uvicorn's does: what
        follows an unparsable request cannot be told apart."""
        self._refuse(b"400 Bad Request", "The request is not valid HTTP/1.1.", "invalid_http_request")

    def _refuse(self, status: bytes, message: str, code: str) -> None:
        log.debug("closing a connection: %s", message)
        self.transport.write(_refusal(status, message, code))
        self.transport.close()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        # The cycle's task has not run yet (it starts on the loop's next turn), so its send is looked up after this.
        if cycle is not None and cycle.scope is self.scope and self.scope.get("http_version") == "1.0":
            cycle.__class__ = CloseDelimitedCycle

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_began = self._heard_at  # called from data_received: this read brought the head's first byte
        self._head_bytes = 0
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
        if self.scope is not self.cycle.scope:  # a pipelined head began meanwhile: its deadline counts from now
            self._head_began = self.loop.time()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        super().connection_lost(exc)
        callback, self._on_lost = self._on_lost, None
        if callback is not None:
            callback()
