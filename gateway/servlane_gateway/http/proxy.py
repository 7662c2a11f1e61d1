"""Talking to a backend: open the upstream call with per-phase timeouts, and relay a stream unbuffered.

Phases: connect (the pool's connect timeout), first byte (response headers, and for streams also the first
chunk, which waits for prompt processing), idle (the most time between two chunks). A stream is
relayed chunk by chunk as it arrives; a client that goes away cancels the relay and closes the
upstream response, which closes its connection, so the backend stops generating.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from servlane_gateway.http.upstream import (
    UpstreamBroken,
    UpstreamConnectTimeout,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
)
from servlane_web.client_watch import ClientGone, unless_client_leaves
from servlane_web.http_server import BODY_WRITER_EXTENSION, BodyWriter

# How a relayed stream ended; the metrics and token charging read it.
COMPLETED = "completed"
CLIENT_GONE = "client_disconnected"
UPSTREAM_TIMEOUT = "upstream_timeout"
STREAM_ABORTED = "stream_aborted"
STREAM_ERROR = "stream_error"  # the backend sent an error event inside its 200 stream


@dataclass(frozen=True)
class Timeouts:
    connect: float = 5.0
    first_byte: float = 300.0
    idle: float = 60.0


class UpstreamTimeout(Exception):
    pass


async def open_upstream(
    pool: UpstreamPool, url: str, body: bytes, headers: dict[str, str], first_byte: float
) -> UpstreamResponse:
    """Send the request and wait for the response headers. UpstreamConnectError (refused, unreachable)
    propagates so the caller can retry elsewhere; a slow backend raises UpstreamTimeout. The wait is bounded by
    the connection's own timer, not an asyncio.timeout per request (servlane_gateway.http.upstream)."""
    try:
        return await pool.post(url, body, headers, first_byte)
    except UpstreamConnectTimeout as exc:
        raise UpstreamTimeout("the backend did not accept the connection in time") from exc
    except TimeoutError as exc:
        raise UpstreamTimeout("the backend did not answer in time") from exc


async def read_body(response: UpstreamResponse, timeouts: Timeouts, limit: int = 64 << 20) -> bytes:
    """A non-streamed body, idle timeout between chunks; the response is closed either way."""
    parts: list[bytes] = []
    size = 0
    try:
        whole = response.whole_body()  # the common case: no waiting, so no timer either
        if whole is not None and len(whole) <= limit:
            return whole
        while True:
            try:
                chunk = await response.next_chunk(timeouts.idle)
            except TimeoutError as exc:
                raise UpstreamTimeout("the backend stopped sending its answer") from exc
            if chunk is None:
                break
            size += len(chunk)
            if size > limit:
                raise UpstreamBroken("the backend's answer is too large")
            parts.append(chunk)
    finally:
        await response.aclose()
    return b"".join(parts)


class UsageScanner:
    """Finds the last `usage` object, and any error event, in an SSE stream without holding the stream.

    The gateway asks every backend for the usage chunk (`stream_options.include_usage`) so that streams are
    charged; with `strip_usage` (the client did not ask for it), that chunk (`choices: []` with a `usage`
    object, OpenAI's shape) is cut out of what is relayed, so the client gets what it asked for. Only
    complete lines are relayed: an incomplete line waits for its end (it could be the usage chunk), which
    holds back nothing a client could read, since an SSE event is read only whole; and a stream the backend
    cuts mid-line ends with the gateway's error event, not with half a line the error would be glued to (the
    client's JSON parser failed on it). Only the current incomplete line is kept."""

    MAX_LINE = 1 << 20

    def __init__(self, strip_usage: bool = False) -> None:
        self.strip_usage = strip_usage
        self._tail = b""
        self._in_long_line = False  # relaying a line longer than MAX_LINE: not inspected, never a usage chunk
        self._drop_blank = False  # the usage chunk was cut: so is the blank line that ends its event
        self.usage: dict[str, Any] | None = None
        self.saw_error = False
        self.saw_done = False  # the stream's `data: [DONE]`
        self.event_open = False  # what was relayed ends inside an event (no blank line after its last line)

    def feed(self, chunk: bytes) -> bytes:
        """Scan `chunk`; returns what to relay now."""
        if not self._tail and not self._in_long_line and not self._drop_blank and _nothing_to_see(chunk):
            # Whole lines, none of them the usage, an error or the end: each token's chunk, mostly.
            self.event_open = not chunk.endswith(EVENT_ENDS)
            return chunk
        data = self._tail + chunk
        cut = data.rfind(b"\n") + 1
        complete, self._tail = data[:cut], data[cut:]
        out: list[bytes] = []
        if self._in_long_line and complete:
            end = complete.index(b"\n") + 1
            out.append(complete[:end])
            complete = complete[end:]
            self._in_long_line = False
        for line in complete.splitlines(keepends=True):
            if self._keep(line):
                out.append(line)
        if len(self._tail) > self.MAX_LINE:
            self._in_long_line = True
            out.append(self._tail)
            self._tail = b""
        relayed = b"".join(out)
        if relayed:
            self.event_open = self._in_long_line or not relayed.endswith(EVENT_ENDS)
        return relayed

    def finish(self) -> bytes:
        """The stream ended: an unfinished last line is relayed as it is (it cannot be parsed anyway)."""
        rest, self._tail = self._tail, b""
        return rest

    def cut_short(self) -> bytes:
        """The backend cut the stream (or stalled): what ends the event it left open, so that the gateway's
        error event after it parses. An unfinished line is dropped: half a JSON object cannot be read."""
        self._tail = b""
        return b"\n\n" if self._in_long_line else b"\n" if self.event_open else b""

    def _keep(self, line: bytes) -> bool:
        if self._drop_blank:
            self._drop_blank = False
            if not line.strip():
                return False
        if b"[DONE]" in line and line.startswith(b"data:") and line[5:].strip() == b"[DONE]":
            self.saw_done = True
            return True
        # Parsed only when it may carry something: the runtime writes `"usage":null` into every chunk.
        has_usage = b'"usage"' in line and b'"usage":null' not in line and b'"usage": null' not in line
        if not line.startswith(b"data:") or not (has_usage or b'"error"' in line):
            return True
        try:
            data = json.loads(line[5:])
        except ValueError:
            return True
        if not isinstance(data, dict):
            return True
        if data.get("error") is not None:
            self.saw_error = True
        if isinstance(data.get("usage"), dict):
            self.usage = data["usage"]
            if self.strip_usage and data.get("choices") == []:
                self._drop_blank = True
                return False
        return True


# How an SSE event ends: a blank line after its last line (LF or CRLF, as the backend writes them).
EVENT_ENDS = (b"\n\n", b"\r\n\r\n")


def _nothing_to_see(chunk: bytes) -> bool:
    """Whole lines (it ends with one) in which no line could be a usage chunk, an error or `[DONE]`: each
    `"usage"` is a null one (the runtime writes `"usage":null` into every chunk). Counted over the chunk, so
    one pass per search in C instead of a split and a look at every line in Python."""
    if not chunk.endswith(b"\n") or b"[DONE]" in chunk or b'"error"' in chunk:
        return False
    usages = chunk.count(b'"usage"')
    return usages == 0 or usages == chunk.count(b'"usage":null') + chunk.count(b'"usage": null')


def sse_error(message: str, code: str) -> bytes:
    """An error event in OpenAI's stream shape: the openai client raises APIError on it."""
    payload = {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


@dataclass
class StreamResult:
    outcome: str = COMPLETED
    first_chunk_at: float | None = None  # perf_counter
    usage: dict[str, Any] | None = None
    done_relayed: bool = False  # the client was sent the stream's `data: [DONE]`


class RelayResponse(Response):
    """Relays an upstream stream to the client as it arrives; `on_done` gets the result once."""

    def __init__(
        self,
        upstream: UpstreamResponse,
        timeouts: Timeouts,
        headers: dict[str, str],
        on_done: Callable[[StreamResult], None],
        strip_usage: bool = False,
        tap: Callable[[bytes], None] | None = None,
    ) -> None:
        super().__init__(status_code=upstream.status_code)
        # Set directly: Response would add `content-length: 0` for its empty body.
        self.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self.upstream = upstream
        self.timeouts = timeouts
        self.on_done = on_done
        self.strip_usage = strip_usage  # the client did not ask for the usage chunk: see UsageScanner
        self.tap = tap  # gets every chunk as the backend sent it (the response cache records the stream)
        self._sending = False  # the loop holds a chunk it is sending through ASGI: later ones queue behind it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.relay(scope, receive, send)

    async def relay(self, scope: Scope, receive: Receive, send: Send, headers_sent: bool = False) -> None:
        """The relay; `headers_sent`: the client already has its response head (a held stream's, sent
        before its backend was up: servlane_gateway.http.held_stream), so only the body follows."""
        result = StreamResult()
        scanner = UsageScanner(self.strip_usage)
        writer_for: Callable[[Send], BodyWriter | None] | None = scope.get("extensions", {}).get(BODY_WRITER_EXTENSION)
        writer = writer_for(send) if writer_for is not None else None
        try:
            relaying = self._relay(send, result, scanner, headers_sent, writer)
            await unless_client_leaves(scope, receive, relaying)
        except (ClientGone, OSError):  # OSError: a send failed, the client went away mid-send
            result.outcome = CLIENT_GONE
        finally:
            await self.upstream.aclose()  # closes the upstream connection, so the backend sees the disconnect
            # Read here, not at the relay's end: a usage chunk already read is charged even when the relay was
            # cancelled, e.g. by a client (the openai one does) closing as soon as it has `[DONE]`, before the
            # backend's end of body arrived. Such a client got the whole stream: not a client that left.
            result.usage = scanner.usage
            if result.outcome == CLIENT_GONE and result.done_relayed:
                result.outcome = COMPLETED
            if scanner.saw_error and result.outcome == COMPLETED:
                result.outcome = STREAM_ERROR  # a failure the client sees, though the status was 200
            self.on_done(result)

    async def _relay(
        self, send: Send, result: StreamResult, scanner: UsageScanner, headers_sent: bool, writer: BodyWriter | None
    ) -> None:
        if not headers_sent:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        if writer is not None:
            self.upstream.relay_to(partial(self._pass_on, writer, result, scanner))
        try:
            await self._relay_queued(send, result, scanner)
        finally:
            self.upstream.relay_to(None)

    def _pass_on(self, writer: BodyWriter, result: StreamResult, scanner: UsageScanner, chunk: bytes) -> bool:
        """A chunk relayed straight from the upstream connection's callback (the common case: per token, no task
        switch, no ASGI message), when nothing waits to be sent before it and the client takes more at once;
        False leaves it to _relay_queued, which sends through ASGI and so waits for a slow client."""
        if self._sending or not writer.ready():
            return False
        if result.first_chunk_at is None:
            self.upstream.tighten(self.timeouts.idle)  # _relay_queued's wait: from now on, between chunks
        relayed = self._scan(chunk, result, scanner)
        if relayed:
            writer.write(relayed)
            result.done_relayed = scanner.saw_done
        return True

    def _scan(self, chunk: bytes, result: StreamResult, scanner: UsageScanner) -> bytes:
        """A chunk from the backend, on either path: timed if first, recorded, scanned; what to relay of it."""
        if result.first_chunk_at is None:
            result.first_chunk_at = time.perf_counter()
        if self.tap is not None:
            self.tap(chunk)
        return scanner.feed(chunk)

    async def _relay_queued(self, send: Send, result: StreamResult, scanner: UsageScanner) -> None:
        """The chunks _pass_on did not take, the stream's end, and its timeouts."""
        ending = b""
        while True:
            wait = self.timeouts.first_byte if result.first_chunk_at is None else self.timeouts.idle
            try:
                chunk = await self.upstream.next_chunk(wait)
            except TimeoutError:
                result.outcome = UPSTREAM_TIMEOUT
                ending = sse_error("The backend stopped streaming (timeout).", "upstream_timeout")
                break
            except UpstreamError:
                result.outcome = STREAM_ABORTED
                ending = sse_error("The backend cut the stream short.", "stream_aborted")
                break
            if chunk is None:
                break
            relayed = self._scan(chunk, result, scanner)
            if relayed:
                self._sending = True
                try:
                    await send(_body(relayed))
                finally:
                    self._sending = False
                result.done_relayed = scanner.saw_done
        self.upstream.relay_to(None)  # the end follows through ASGI: nothing may be written after it
        # A held incomplete line goes first at a normal end; a cut one is dropped and the open event ended.
        if rest := (scanner.cut_short() + ending if ending else scanner.finish()):
            await send(_body(rest))
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _body(chunk: bytes) -> dict[str, Any]:
    return {"type": "http.response.body", "body": chunk, "more_body": True}
