"""A lean HTTP/1.1 client for the backends: keep-alive pools per host, one write per request, httptools parsing.

Why not httpx here: profiling the gateway showed httpx/httpcore taking most of its CPU per request
(anyio stream layers, two writes per request, and a pool that polls every pooled socket on every
request). The gateway only ever sends one kind of request (POST with a JSON body to a backend it
trusts) and relays the answer, so this small client over asyncio protocols does just that, with the
same parser uvicorn uses (httptools). The waits for an answer's head and for its chunks are bounded by one
timer per connection (below); connecting, by asyncio.timeout.

Errors: UpstreamConnectError when the backend cannot be reached (nothing was sent: safe to try another
backend); UpstreamBroken when the connection failed after the request went out or the answer is malformed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

import httptools

log = logging.getLogger(__name__)

PAUSE_AT = 32  # buffered body chunks before reading from the backend pauses (back-pressure)
MAX_IDLE_PER_HOST = 1024
# Below uvicorn's keep-alive (5 s, the runtime's server): a connection idle longer may be closing at the
# backend's end just as a request goes out on it.
DEFAULT_MAX_IDLE_SECONDS = 4.0
# A pooled connection is not reused after this: through a Service URL (kube-proxy picks the pod once per
# connection), a long-lived connection would otherwise pin its share of the traffic to one pod forever.
DEFAULT_MAX_LIFETIME_SECONDS = 60.0


class UpstreamError(Exception):
    pass


class UpstreamConnectError(UpstreamError):
    """The backend refused or could not be reached; nothing was sent."""


class UpstreamConnectTimeout(UpstreamError):
    """The backend did not accept the connection in time."""


class UpstreamBroken(UpstreamError):
    """The connection failed after the request was sent, or the answer was not valid HTTP."""


@functools.lru_cache(maxsize=4096)
def _target(url: str) -> tuple[str, int, bytes, bytes]:
    """(host, port, request path, Host header) of an http:// URL; cached: backends repeat."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise UpstreamConnectError(f"only http:// backends are supported, not {url!r}")
    port = parts.port or 80
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.hostname, port, path.encode(), parts.netloc.encode()


class _Connection(asyncio.Protocol):
    """One keep-alive connection; carries one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.opened_at = time.monotonic()
        self.idle_since = self.opened_at
        self._loop = asyncio.get_running_loop()
        # The waits for an answer (its head, then each chunk) are bounded by one timer per connection, armed when
        # a wait needs it sooner than it is due and otherwise left armed, across chunks and across the requests
        # of a kept-alive connection (data_received only notes the time): a timer per chunk (asyncio.timeout
        # around each wait) was a third of a relayed token's CPU, and one per request's head ~4% of a plain
        # request's. It fires at most once per `limit`, and then either ends the wait (TimeoutError) or re-arms
        # for the time still left.
        self.heard_at = self._loop.time()
        self._limit: float | None = None
        self._since: float | None = None  # a wait's fixed start (the head's); None: from the last bytes heard
        self._idle_timer: asyncio.TimerHandle | None = None
        self._timer_due = 0.0
        # One parser for the connection's answers, one after another (it starts over after each complete
        # message); a connection whose answer did not end cleanly is closed, never reused.
        self.parser = httptools.HttpResponseParser(self)
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.head: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.chunks: deque[bytes] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.complete = False
        self.error: UpstreamError | None = None
        self.got_bytes = False
        self.paused = False
        self.framed = False
        self.keep_alive = False
        # Takes body chunks as they arrive, from data_received, while nothing is queued before them; False: the
        # chunk is queued for next_chunk instead (servlane_gateway.http.proxy's relay, when it can write at once).
        self.sink: Callable[[bytes], bool] | None = None

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        self.heard_at = self._loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamBroken(f"the backend's answer is not valid HTTP: {exc}"))
            self.close()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.head.done() and not self.framed and not self.complete:
            self.complete = True  # an answer delimited by closing the connection
            self._wake()
        elif not self.complete:
            self._fail(UpstreamBroken("the backend closed the connection before finishing its answer"))

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        names = {name for name, _ in self.raw_headers}
        self.framed = b"content-length" in names or b"transfer-encoding" in names
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        sink = self.sink
        if sink is not None and not self.chunks:
            try:
                if sink(body):
                    return
            except Exception:  # a bug in the relay: said as such (inside the parser it would pass for bad HTTP)
                log.exception("relaying a chunk failed; the stream is cut")
                self.sink = None
                self._fail(UpstreamBroken("the gateway failed to relay the stream"))
                self.close()
                return
        self.chunks.append(body)
        if len(self.chunks) >= PAUSE_AT and self.transport is not None and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()  # only valid here: the parser resets afterwards
        self.complete = True
        self._wake()

    # -- helpers
    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if self.error is None:
            self.error = error
        if not self.head.done():
            self.head.set_exception(error)
            self.head.exception()  # retrieved: nobody may be waiting any more
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._disarm()
        if self.transport is not None:
            self.transport.close()

    def _disarm(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _idle_check(self) -> None:
        self._idle_timer = None
        waiter, limit = self.waiter, self._limit
        if waiter is None or waiter.done() or limit is None:
            return  # nobody waits for the backend now: the next wait arms the timer again
        due = (self.heard_at if self._since is None else self._since) + limit
        if self._loop.time() >= due:
            waiter.set_exception(TimeoutError())
        else:
            self._arm(due)

    def _arm(self, due: float) -> None:
        self._disarm()
        self._timer_due = due
        self._idle_timer = self._loop.call_at(due, self._idle_check)

    def _bound(self, waiter: asyncio.Future[None], limit: float | None, since: float | None = None) -> None:
        """`waiter` is what a caller awaits next; it fails with TimeoutError `limit` seconds after `since`, or
        when None once the backend has sent nothing for `limit` seconds (a `limit` of None: no bound)."""
        self.waiter = waiter
        self._limit = limit
        self._since = since
        due = (self.heard_at if since is None else since) + (limit or 0.0)
        if limit is not None and (self._idle_timer is None or due < self._timer_due):
            self._arm(due)  # none armed, or for later than this wait allows

    def tighten(self, limit: float) -> None:
        """The wait in progress (next_chunk's, the sink having taken its chunks) is bounded by `limit` from now
        on, counted from the last bytes heard."""
        if self.waiter is not None and not self.waiter.done():
            self._bound(self.waiter, limit)

    async def answer_head(self, limit: float | None) -> None:
        """Waits for the whole head of the answer to the request just sent; TimeoutError `limit` seconds from
        now, however the backend trickles its head."""
        self._bound(self.head, limit, self._loop.time())
        try:
            await self.head
        finally:
            self.waiter = None

    async def next_chunk(self, limit: float | None = None) -> bytes | None:
        """The next body chunk as it arrives, None at the end of the answer; TimeoutError when the backend has
        sent nothing for `limit` seconds (from the last bytes it sent, or the request's answer head)."""
        while True:
            if self.chunks:
                chunk = self.chunks.popleft()
                if self.paused and len(self.chunks) < PAUSE_AT // 2 and self.transport is not None:
                    self.paused = False
                    self.transport.resume_reading()
                return chunk
            if self.complete:
                return None
            if self.error is not None:
                raise self.error
            waiter = self._loop.create_future()
            self._bound(waiter, limit)
            try:
                await waiter
            finally:
                self.waiter = None


class UpstreamResponse:
    """Status and headers of a backend's answer; the body is read with next_chunk(), then aclose()."""

    def __init__(self, pool: UpstreamPool, key: tuple[str, int], connection: _Connection) -> None:
        self._pool = pool
        self._key = key
        self._connection = connection
        self.status_code = connection.status
        self.headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in connection.raw_headers}
        self._released = False

    async def next_chunk(self, limit: float | None = None) -> bytes | None:
        """The next chunk of the body, None at its end; TimeoutError after `limit` seconds without a byte."""
        return await self._connection.next_chunk(limit)

    def relay_to(self, sink: Callable[[bytes], bool] | None) -> None:
        """Hands body chunks to `sink` as they arrive, while none is queued before them and it takes them
        (returns True); the others wait for next_chunk, in order. None: all wait for next_chunk."""
        self._connection.sink = sink

    def tighten(self, limit: float) -> None:
        """The next_chunk in progress times out after `limit` seconds without a byte from now on."""
        self._connection.tighten(limit)

    def whole_body(self) -> bytes | None:
        """The body when all of it has arrived already (a small answer comes with its headers), else None."""
        conn = self._connection
        if not conn.complete:
            return None
        body = b"".join(conn.chunks)
        conn.chunks.clear()
        return body

    async def aclose(self) -> None:
        """Back to the pool when the answer was read whole and the backend keeps the connection; else closed
        (which is how a backend learns that nobody reads the rest of a stream)."""
        if self._released:
            return
        self._released = True
        conn = self._connection
        if conn.complete and not conn.closed and conn.error is None and conn.keep_alive:
            self._pool.release(self._key, conn)
        else:
            conn.close()


class UpstreamPool:
    """Idle keep-alive connections per (host, port): per pod when the gateway picks pods, per Service
    otherwise. Connections are opened on demand (no upper limit: a backend's own admission control answers
    overload with 429/503). An idle connection is reused most recent first, and only while it has been
    idle at most `max_idle` seconds and open at most `max_lifetime`; older ones are closed."""

    def __init__(
        self,
        connect_timeout: float,
        max_idle: float = DEFAULT_MAX_IDLE_SECONDS,
        max_lifetime: float = DEFAULT_MAX_LIFETIME_SECONDS,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        self.max_lifetime = max_lifetime
        self._idle: dict[tuple[str, int], list[_Connection]] = {}

    def _expired(self, connection: _Connection, now: float) -> bool:
        return now - connection.idle_since > self.max_idle or now - connection.opened_at > self.max_lifetime

    def release(self, key: tuple[str, int], connection: _Connection) -> None:
        now = time.monotonic()
        connection.idle_since = now
        idle = self._idle.setdefault(key, [])
        # The least recently used sit at the bottom and are never reached while traffic keeps the top
        # busy: closed here once too old, so they do not hold sockets (and pods) forever.
        while idle and (idle[0].closed or self._expired(idle[0], now)):
            idle.pop(0).close()
        if len(idle) < MAX_IDLE_PER_HOST and not self._expired(connection, now):
            idle.append(connection)
        else:
            connection.close()

    def _take_idle(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if connection.closed:
                continue
            if self._expired(connection, now):
                connection.close()
                continue
            return connection
        return None

    async def _connect(self, host: str, port: int) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, protocol = await loop.create_connection(_Connection, host, port)
        except TimeoutError as exc:
            raise UpstreamConnectTimeout("the backend did not accept the connection in time") from exc
        except OSError as exc:
            raise UpstreamConnectError(f"cannot connect to the backend: {exc}") from exc
        return protocol

    async def post(
        self, url: str, body: bytes, headers: dict[str, str], first_byte: float | None = None
    ) -> UpstreamResponse:
        """Send a POST and wait for the answer's status and headers: TimeoutError when they have not all come
        `first_byte` seconds after the request went out (None: no bound)."""
        host, port, path, host_header = _target(url)
        key = (host, port)
        head = [b"POST ", path, b" HTTP/1.1\r\nhost: ", host_header, b"\r\ncontent-length: ", str(len(body)).encode()]
        for name, value in headers.items():
            head += [b"\r\n", name.encode("latin-1"), b": ", value.encode("latin-1")]
        message = b"".join([*head, b"\r\n\r\n", body])
        connection = self._take_idle(key)
        for attempt in range(2):
            fresh = connection is None
            if connection is None:
                connection = await self._connect(host, port)
            connection._reset()
            try:
                assert connection.transport is not None
                connection.transport.write(message)  # one write: head and body together
                await connection.answer_head(first_byte)
                return UpstreamResponse(self, key, connection)
            except UpstreamBroken:
                connection.close()
                # A pooled connection the backend closed while idle: nothing was answered, so resend once
                # on a new connection (as browsers and httpx do). A fresh connection failing is an error.
                if fresh or connection.got_bytes or attempt == 1:
                    raise
                connection = None
            except BaseException:  # cancelled (client gone, timeout): the connection is mid-request
                connection.close()
                raise
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
