"""The gateway's upstream HTTP/1.1 client against raw asyncio servers: keep-alive reuse, stale pooled
connections, refused connections, answers cut short, chunked streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from servlane_gateway.http.upstream import UpstreamBroken, UpstreamConnectError, UpstreamPool
from tests.support.gateway_harness import refused_url

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
BODY = b'{"ok": true}'
OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(BODY), BODY)


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return head + await reader.readexactly(length)


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A server on loopback; yields its URL and a list with one entry per accepted connection."""
    connections: list[int] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}", connections


async def answer_forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        try:
            await read_request(reader)
        except asyncio.IncompleteReadError:
            return
        writer.write(OK)
        await writer.drain()


async def answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers one request as keep-alive, then closes the connection (like an idle timeout)."""
    await read_request(reader)
    writer.write(OK)
    await writer.drain()


async def body_of(pool: UpstreamPool, url: str, payload: bytes = b"{}") -> bytes:
    response = await pool.post(url + "/v1/chat/completions", payload, {"content-type": "application/json"})
    parts = []
    while (chunk := await response.next_chunk()) is not None:
        parts.append(chunk)
    await response.aclose()
    return b"".join(parts)


async def test_keep_alive_connections_are_reused() -> None:
    async with serving(answer_forever) as (url, connections):
        pool = UpstreamPool(connect_timeout=2)
        for _ in range(3):
            assert await body_of(pool, url) == BODY
        assert len(connections) == 1
        await pool.aclose()


async def test_a_pooled_connection_the_backend_closed_is_not_used() -> None:
    async with serving(answer_once) as (url, connections):
        pool = UpstreamPool(connect_timeout=2)
        assert await body_of(pool, url) == BODY
        # Whether the close has been seen yet (skipped in the pool) or not (resent once on a fresh
        # connection), the second request succeeds, on a second connection.
        assert await body_of(pool, url) == BODY
        assert len(connections) == 2
        await pool.aclose()


async def test_refused_connection_is_a_connect_error() -> None:
    with pytest.raises(UpstreamConnectError):
        await UpstreamPool(connect_timeout=2).post(refused_url() + "/v1/x", b"{}", {})


async def test_an_answer_cut_short_is_broken() -> None:
    async def half(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")
        await writer.drain()

    async def nothing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with serving(half) as (url, _):
        with pytest.raises(UpstreamBroken):
            await body_of(UpstreamPool(connect_timeout=2), url)
    async with serving(nothing) as (url, _):
        with pytest.raises(UpstreamBroken):
            await body_of(UpstreamPool(connect_timeout=2), url)


async def test_chunked_stream_arrives_piece_by_piece() -> None:
    release = asyncio.Event()
    events = 200

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_request(reader)
        assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        first = b"data: first\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(first), first))
        await writer.drain()
        await release.wait()
        for i in range(events):
            event = b"data: %d\n\n" % i
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async with serving(stream) as (url, _):
        pool = UpstreamPool(connect_timeout=2)
        response = await pool.post(url + "/v1/chat/completions", b"{}", {})
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        assert await response.next_chunk() == b"data: first\n\n"  # before the backend sent the rest
        release.set()
        received = []
        while (chunk := await response.next_chunk()) is not None:
            received.append(chunk)
        assert b"".join(received) == b"".join(b"data: %d\n\n" % i for i in range(events))
        await response.aclose()
        await pool.aclose()


def _stream_events(gaps: list[float]) -> Handler:
    """A chunked stream: its head at once, then an event after each of `gaps` seconds, then a stall until the
    client goes."""

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        for i, gap in enumerate(gaps):
            await asyncio.sleep(gap)
            event = b"data: %d\n\n" % i
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
        await reader.read()  # stalls: nothing more is sent until the client closes

    return stream


async def test_a_stall_after_the_first_chunk_times_out_at_the_idle_limit_not_the_first_byte_one() -> None:
    """The first wait is bounded by the long first-byte limit, the next ones by the short idle limit: the
    shorter limit must take over the timer the first wait armed."""
    async with serving(_stream_events([0.2])) as (url, _):  # the first event comes while the first wait waits
        pool = UpstreamPool(connect_timeout=2)
        response = await pool.post(url + "/v1/chat/completions", b"{}", {})
        assert await response.next_chunk(300.0) == b"data: 0\n\n"
        started = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(response.next_chunk(0.3), 30)  # 30 s: the first-byte timer's time, still far off
        assert asyncio.get_running_loop().time() - started < 10
        await response.aclose()
        await pool.aclose()


async def test_chunks_that_keep_coming_within_the_idle_limit_never_time_out() -> None:
    """Seven gaps of 0.15 s: the whole answer takes longer than the 0.5 s limit, no gap does."""
    gaps = [0.15] * 7
    async with serving(_stream_events(gaps)) as (url, _):
        pool = UpstreamPool(connect_timeout=2)
        response = await pool.post(url + "/v1/chat/completions", b"{}", {})
        received = [await response.next_chunk(0.5) for _ in gaps]
        assert b"".join(c or b"" for c in received) == b"".join(b"data: %d\n\n" % i for i in range(len(gaps)))
        with pytest.raises(TimeoutError):  # and the stall after them is caught
            await asyncio.wait_for(response.next_chunk(0.5), 30)
        await response.aclose()
        await pool.aclose()


def _answer_then_stall(answers: int) -> Handler:
    """Answers `answers` requests on the connection as keep-alive, then reads the next one and never answers."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(answers):
            await read_request(reader)
            writer.write(OK)
            await writer.drain()
        await read_request(reader)
        await reader.read()  # stalls until the client closes

    return handler


async def test_a_backend_that_never_answers_times_out_at_the_first_byte_limit() -> None:
    async with serving(_answer_then_stall(0)) as (url, _):
        pool = UpstreamPool(connect_timeout=2)
        started = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(pool.post(url + "/v1/chat/completions", b"{}", {}, first_byte=0.3), 30)
        assert 0.3 <= asyncio.get_running_loop().time() - started < 10
        await pool.aclose()


async def test_a_kept_alive_connection_bounds_its_next_head_by_that_request_s_limit() -> None:
    """The connection's timer is left armed between requests, here for a stream's long idle limit: the next
    request on the connection must still time out at its own, shorter, first-byte limit."""
    async with serving(_answer_then_stall(1)) as (url, connections):
        pool = UpstreamPool(connect_timeout=2)
        first = await pool.post(url + "/v1/chat/completions", b"{}", {}, first_byte=300.0)
        assert first.whole_body() == BODY
        await first.aclose()
        started = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(pool.post(url + "/v1/chat/completions", b"{}", {}, first_byte=0.3), 30)
        assert asyncio.get_running_loop().time() - started < 10
        assert len(connections) == 1  # the second request went out on the kept-alive connection
        await pool.aclose()


async def test_answers_on_a_kept_alive_connection_outlast_an_earlier_request_s_limit() -> None:
    """A timer armed by an earlier request fires while a later one waits within its own limit: the later
    wait goes on (re-armed for its time left) and gets its answer."""

    async def slow_second(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()
        await read_request(reader)
        await asyncio.sleep(0.6)  # past the first request's limit (armed at its start), within the second's
        writer.write(OK)
        await writer.drain()
        await reader.read()

    async with serving(slow_second) as (url, _):
        pool = UpstreamPool(connect_timeout=2)
        first = await pool.post(url + "/v1/chat/completions", b"{}", {}, first_byte=0.4)
        await first.aclose()
        second = await asyncio.wait_for(pool.post(url + "/v1/chat/completions", b"{}", {}, first_byte=5.0), 30)
        assert second.whole_body() == BODY
        await second.aclose()
        await pool.aclose()


async def test_a_head_trickled_byte_by_byte_still_times_out_at_the_first_byte_limit() -> None:
    """The first-byte limit bounds the whole head: bytes that keep coming do not extend it (as they do for
    the idle limit between a body's chunks)."""

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for byte in OK:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.05)

    async with serving(trickle) as (url, _):
        pool = UpstreamPool(connect_timeout=2)
        started = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(pool.post(url + "/v1/chat/completions", b"{}", {}, first_byte=0.5), 30)
        assert asyncio.get_running_loop().time() - started < 3  # the whole head would take ~4 s
        await pool.aclose()


async def test_a_sink_takes_chunks_in_order_and_one_that_fails_cuts_the_stream_saying_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Chunks go to the relay's sink as they come while it takes them, else to next_chunk, never out of order;
    a sink that raises (a bug) ends the stream as broken, and the log says the relay failed."""
    async with serving(_stream_events([0.05] * 6)) as (url, _):
        pool = UpstreamPool(connect_timeout=2)
        response = await pool.post(url + "/v1/chat/completions", b"{}", {})
        taken: list[bytes] = []

        def take_two(chunk: bytes) -> bool:
            if len(taken) == 2:
                return False
            taken.append(chunk)
            return True

        response.relay_to(take_two)
        queued = [await response.next_chunk(5), await response.next_chunk(5)]
        assert taken == [b"data: 0\n\n", b"data: 1\n\n"]
        assert queued == [b"data: 2\n\n", b"data: 3\n\n"]

        def broken(chunk: bytes) -> bool:
            raise RuntimeError("bug")

        response.relay_to(broken)
        with pytest.raises(UpstreamBroken):
            await response.next_chunk(5)
        assert "relaying a chunk failed" in caplog.text
        await response.aclose()
        await pool.aclose()
