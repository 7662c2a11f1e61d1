"""Talking to a backend: open the upstream call with per-phase timeouts, and relay a stream unbuffered.

Phases: connect (the pool's connect timeout), first byte (response headers, and for streams also the first
chunk, which waits for prompt processing), idle (the most time between two chunks). A stream is
relayed chunk by chunk as it arrives; a client that goes away cancels the relay and closes the
upstream response, which closes its connection, so the backend stops generating.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from servlane_gateway.upstream import (
    UpstreamBroken,
    UpstreamConnectTimeout,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
)

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
    propagates so the caller can retry elsewhere; a slow backend raises UpstreamTimeout."""
    try:
        async with asyncio.timeout(first_byte):
            return await pool.post(url, body, headers)
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
                async with asyncio.timeout(timeouts.idle):
                    chunk = await response.next_chunk()
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
    """Finds the last `usage` object, and any error event, in an SSE stream without holding the stream:
    only the current incomplete line is kept."""

    MAX_LINE = 1 << 20

    def __init__(self) -> None:
        self._tail = b""
        self.usage: dict[str, Any] | None = None
        self.saw_error = False

    def feed(self, chunk: bytes) -> None:
        lines = (self._tail + chunk).split(b"\n")
        self._tail = lines.pop()
        if len(self._tail) > self.MAX_LINE:
            self._tail = b""
        for line in lines:
            if line.startswith(b"data:") and (b'"usage"' in line or b'"error"' in line):
                try:
                    data = json.loads(line[5:])
                except ValueError:
                    continue
                if isinstance(data, dict) and isinstance(data.get("usage"), dict):
                    self.usage = data["usage"]
                if isinstance(data, dict) and data.get("error") is not None:
                    self.saw_error = True


def sse_error(message: str, code: str) -> bytes:
    """An error event in OpenAI's stream shape: the openai client raises APIError on it."""
    payload = {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


@dataclass
class StreamResult:
    outcome: str = COMPLETED
    first_chunk_at: float | None = None  # perf_counter
    usage: dict[str, Any] | None = None


class RelayResponse(Response):
    """Relays an upstream stream to the client as it arrives; `on_done` gets the result once."""

    def __init__(
        self,
        upstream: UpstreamResponse,
        timeouts: Timeouts,
        headers: dict[str, str],
        on_done: Callable[[StreamResult], None],
    ) -> None:
        super().__init__(status_code=upstream.status_code)
        # Set directly: Response would add `content-length: 0` for its empty body.
        self.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self.upstream = upstream
        self.timeouts = timeouts
        self.on_done = on_done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        result = StreamResult()
        relay = asyncio.ensure_future(self._relay(send, result))
        watcher = asyncio.ensure_future(self._wait_disconnect(receive))
        try:
            done, _ = await asyncio.wait({relay, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if relay not in done:
                result.outcome = CLIENT_GONE
            else:
                relay.result()  # re-raise a failure to send (the client went away mid-send)
        except OSError:
            result.outcome = CLIENT_GONE
        finally:
            for task in (relay, watcher):
                task.cancel()
            await asyncio.gather(relay, watcher, return_exceptions=True)
            await self.upstream.aclose()  # closes the upstream connection, so the backend sees the disconnect
            self.on_done(result)

    async def _wait_disconnect(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    async def _relay(self, send: Send, result: StreamResult) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        scanner = UsageScanner()
        while True:
            wait = self.timeouts.first_byte if result.first_chunk_at is None else self.timeouts.idle
            try:
                async with asyncio.timeout(wait):
                    chunk = await self.upstream.next_chunk()
            except TimeoutError:
                result.outcome = UPSTREAM_TIMEOUT
                await send(_body(sse_error("The backend stopped streaming (timeout).", "upstream_timeout")))
                break
            except UpstreamError:
                result.outcome = STREAM_ABORTED
                await send(_body(sse_error("The backend cut the stream short.", "stream_aborted")))
                break
            if chunk is None:
                break
            if result.first_chunk_at is None:
                result.first_chunk_at = time.perf_counter()
            scanner.feed(chunk)
            await send(_body(chunk))
        result.usage = scanner.usage
        if scanner.saw_error and result.outcome == COMPLETED:
            result.outcome = STREAM_ERROR  # a failure the client sees, though the status was 200
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _body(chunk: bytes) -> dict[str, Any]:
    return {"type": "http.response.body", "body": chunk, "more_body": True}
