"""The gateway's server protocol (servlane_web.http_server): one write per whole response, heads of streams
and of bodiless answers still sent, over real sockets; and the transport wrapper's rules on their own."""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import socket
import threading
import time
from typing import Any

import httpx
import pytest

from servlane_web.http_server import MAX_HEAD_BYTES, HeadHoldingTransport
from tests.support.gateway_harness import Gateway, StartGateway, Upstream, aifeature, aimodel
from tests.support.polling import wait_until

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-type: text/plain\r\n\r\n"


class Recorder:
    """What reaches the socket's transport, write by write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else None


def holding() -> tuple[HeadHoldingTransport, Recorder]:
    recorder = Recorder()
    return HeadHoldingTransport(recorder), recorder  # type: ignore[arg-type]


def test_a_head_with_a_content_length_goes_out_with_the_body_in_one_write() -> None:
    transport, socket_side = holding()
    transport.write(HEAD)
    assert socket_side.writes == []
    transport.write(b"hello")
    assert socket_side.writes == [HEAD + b"hello"]


def test_a_held_head_goes_out_at_the_end_of_a_bodiless_answer_or_on_close() -> None:
    transport, socket_side = holding()
    transport.write(HEAD)
    transport.flush()  # the protocol flushes when the response completes (HEAD: uvicorn writes no body)
    assert socket_side.writes == [HEAD]
    transport.write(HEAD)
    transport.close()
    assert socket_side.writes == [HEAD, HEAD]
    assert socket_side.closed


def test_stream_heads_interim_answers_and_whole_writes_are_not_held() -> None:
    transport, socket_side = holding()
    chunked = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    continue_ = b"HTTP/1.1 100 Continue\r\n\r\n"
    whole = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 3\r\n\r\nbad"  # uvicorn's own error answers
    for data in (chunked, continue_, whole):
        transport.write(data)
    assert socket_side.writes == [chunked, continue_, whole]
    assert transport.get_extra_info("peername") == ("127.0.0.1", 1)  # everything else passes through


def exchange(url: str, request: bytes) -> bytes:
    """Send a raw request, read until the server closes (the request says Connection: close)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(request)
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
    return received


def served(upstreams: dict[str, Upstream], start_gateway: StartGateway) -> Gateway:
    return start_gateway([aimodel("chat-v1", upstreams["v1"].url), aifeature("chat", [("chat-v1", 100)])])


def test_a_head_request_gets_its_head_and_no_body(upstreams: dict[str, Upstream], start_gateway: StartGateway) -> None:
    # uvicorn writes no body for HEAD, so the held head must go out when the response completes.
    gateway = served(upstreams, start_gateway)
    for path in (b"/health", b"/ready", b"/v1/models", b"/console"):
        answer = exchange(gateway.url, b"HEAD %b HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n" % path)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), (path, head)  # a GET endpoint answers HEAD (RFC 9110 9.1)
        got = exchange(gateway.url, b"GET %b HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n" % path)
        got_body = got.partition(b"\r\n\r\n")[2]
        assert b"\r\ncontent-length: %d\r\n" % len(got_body) in head.lower() + b"\r\n", (path, head)  # GET's length
        assert body == b""
    # A HEAD is a GET without the body, not a way around methods: the proxied endpoints take POST only.
    answer = exchange(gateway.url, b"HEAD /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 405 "), answer


def test_an_http_1_0_client_gets_its_stream_unchunked_ended_by_the_close(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    """Transfer-Encoding is HTTP/1.1's (RFC 9112 6.1: never sent to an HTTP/1.0 client, which would read the
    chunk sizes as part of the stream): a stream of unknown length goes out as it comes, the close its end."""
    backend = FastStreamingBackend(50)
    gateway = start_gateway([aimodel("chat-v1", backend.url), aifeature("chat", [("chat-v1", 100)])])
    request = STREAM_POST.replace(b" HTTP/1.1\r\n", b" HTTP/1.0\r\n", 1).replace(b"Connection: close\r\n", b"")
    head, _, body = exchange(gateway.url, request).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert b"transfer-encoding" not in head.lower(), head
    assert b"\r\nconnection: close" in head.lower(), head
    assert body == b"".join(backend.events)
    # The same client's whole answers keep their Content-Length.
    answer = exchange(gateway.url, b"GET /health HTTP/1.0\r\n\r\n")
    assert b"\r\ncontent-length: 15\r\n" in answer.lower(), answer
    assert answer.endswith(b'{"status":"ok"}'), answer


def test_keep_alive_answers_arrive_whole_one_after_another(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    gateway = served(upstreams, start_gateway)
    get = b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n"
    answer = exchange(gateway.url, get + get + b"GET /health HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 3
    assert answer.count(b'{"status":"ok"}') == 3
    # Each answer dated, none naming the server software (uvicorn's default header, turned off).
    assert answer.lower().count(b"\r\ndate: ") == 3
    assert b"\r\nserver:" not in answer.lower()


class FastStreamingBackend:
    """A backend that answers any request with `events` SSE events of ~1 kB as fast as its socket takes them
    (blocking writes: when the gateway stops reading, it waits); `sent` counts the events its socket took, and
    `cut` says the gateway closed the connection before the answer's end."""

    def __init__(self, events: int) -> None:
        pad = "x" * 1000
        self.events = [f'data: {{"i": {i}, "pad": "{pad}"}}\n\n'.encode() for i in range(events)]
        self.events.append(b"data: [DONE]\n\n")
        self.sent = 0
        self.cut = False
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with self.listener:
            while True:  # one connection after another
                conn, _ = self.listener.accept()
                with conn:
                    self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            request += conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        try:
            for event in self.events:
                conn.sendall(b"%x\r\n%b\r\n" % (len(event), event))
                self.sent += 1
            conn.sendall(b"0\r\n\r\n")
        except OSError:
            self.cut = True
            return
        with contextlib.suppress(OSError):
            conn.recv(1)  # until the gateway closes or reuses it


def dechunk(data: bytes) -> bytes:
    """A chunked body's content (read by offsets: a 40 MB body in 40,000 chunks)."""
    parts: list[bytes] = []
    at = 0
    while True:
        line_end = data.index(b"\r\n", at)
        size = int(data[at:line_end], 16)
        if size == 0:
            return b"".join(parts)
        parts.append(data[line_end + 2 : line_end + 2 + size])
        at = line_end + 2 + size + 2


STREAM_POST_BODY = b'{"model": "chat", "stream": true, "messages": [{"role": "user", "content": "hi"}]}'
STREAM_POST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%b" % (len(STREAM_POST_BODY), STREAM_POST_BODY)
)


@pytest.mark.parametrize("server", ["start_gateway", "start_gateway_on_plain_uvicorn"])
def test_a_stream_faster_than_its_client_reads_arrives_whole_and_in_order(
    server: str, request: pytest.FixtureRequest
) -> None:
    """The gateway's protocol writes a stream's chunks from the upstream connection's callback while the client
    keeps up, and through ASGI (which waits for the client) once it does not. A client that reads nothing for a
    second while a 40 MB stream comes holds the backend back (the gateway stops reading it: it does not buffer
    the stream for a slow client; the kernel's socket buffers hold a few MB), then gets every byte in the
    backend's order, under both servers."""
    backend = FastStreamingBackend(40_000)
    start: StartGateway = request.getfixturevalue(server)
    gateway = start([aimodel("chat-v1", backend.url), aifeature("chat", [("chat-v1", 100)])])
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.socket() as conn:
        conn.settimeout(30)
        conn.connect((host, int(port)))
        conn.sendall(STREAM_POST)
        time.sleep(1.0)  # the client reads nothing: the gateway's writes back up (the point of the test)
        assert backend.sent < len(backend.events) // 2, backend.sent
        pieces: list[bytes] = []
        while chunk := conn.recv(1 << 20):
            pieces.append(chunk)
    head, _, chunked = b"".join(pieces).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert dechunk(chunked) == b"".join(backend.events)


def stream_client(gateway: Gateway) -> socket.socket:
    """A connection whose receive buffer is small (a client may choose it), that has asked for a stream."""
    host, port = gateway.url.removeprefix("http://").split(":")
    conn = socket.socket()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn.settimeout(10)
    conn.connect((host, int(port)))
    conn.sendall(STREAM_POST)
    return conn


def read_into(conn: socket.socket, received: list[bytes]) -> None:
    while chunk := conn.recv(1 << 20):
        received.append(chunk)


def test_a_client_that_stops_reading_is_cut_off_and_the_backend_freed(start_gateway: StartGateway) -> None:
    """A client that reads nothing of its stream: the buffers fill, the gateway stops reading the backend (the
    test above), and without a deadline all three waited for good. After the read-stall deadline the gateway
    aborts the client's connection and closes the backend's, which ends the request there."""
    backend = FastStreamingBackend(40_000)
    gateway = start_gateway(
        [aimodel("chat-v1", backend.url), aifeature("chat", [("chat-v1", 100)])], client_read_stall_timeout=0.5
    )
    with stream_client(gateway) as conn:
        began = time.monotonic()
        wait_until("the gateway to close the backend's connection", lambda: backend.cut, 10)
        assert 0.4 < time.monotonic() - began < 10
        assert backend.sent < len(backend.events) // 2, backend.sent
        received: list[bytes] = []
        with pytest.raises(ConnectionResetError):  # reset: what the gateway had not sent is not coming
            read_into(conn, received)
        assert sum(map(len, received)) < sum(len(event) for event in backend.events) // 2
    # The gateway serves on: the next stream arrives whole.
    with stream_client(gateway) as conn:
        conn.settimeout(30)
        pieces = []
        while chunk := conn.recv(1 << 20):
            pieces.append(chunk)
    head, _, chunked = b"".join(pieces).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert dechunk(chunked) == b"".join(backend.events)


class BigAnswerBackend:
    """A backend whose answer to any request is one JSON body of `size` bytes with a Content-Length."""

    def __init__(self, size: int) -> None:
        self.body = b'{"pad": "' + b"x" * (size - 11) + b'"}'
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with self.listener:
            while True:
                conn, _ = self.listener.accept()
                with conn, contextlib.suppress(OSError):
                    request = b""
                    while b"\r\n\r\n" not in request:
                        request += conn.recv(65536)
                    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                    conn.sendall(head % len(self.body) + self.body)
                    conn.recv(1)


def test_a_whole_answer_its_client_never_reads_is_dropped_once_the_client_stalls(start_gateway: StartGateway) -> None:
    """An 8 MB answer, whole from the backend, to a client that reads none of it: the response ends in the app
    and uvicorn would close the connection after its flush, which never comes. The deadline resets it."""
    backend = BigAnswerBackend(8_000_000)
    gateway = start_gateway(
        [aimodel("chat-v1", backend.url), aifeature("chat", [("chat-v1", 100)])], client_read_stall_timeout=0.5
    )
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.socket() as conn:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.connect((host, int(port)))
        conn.sendall(chat_post(CHAT_BODY, b"Connection: close\r\n") + CHAT_BODY)
        began = time.monotonic()
        wait_until(
            "the gateway to reset the connection",
            lambda: conn.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNRESET,
            10,
        )
        assert time.monotonic() - began > 0.4


def test_a_client_that_reads_slowly_but_steadily_gets_its_whole_stream(start_gateway: StartGateway) -> None:
    """The deadline counts while the client takes nothing at all: one that reads 64 kB every 0.1 s, far slower
    than the backend sends, is held back many times over 0.5 s, and its stream arrives whole."""
    backend = FastStreamingBackend(2_000)
    gateway = start_gateway(
        [aimodel("chat-v1", backend.url), aifeature("chat", [("chat-v1", 100)])], client_read_stall_timeout=0.5
    )
    with stream_client(gateway) as conn:
        began = time.monotonic()
        pieces: list[bytes] = []
        while chunk := conn.recv(64 * 1024):
            pieces.append(chunk)
            time.sleep(0.1)
        assert time.monotonic() - began > 1.0  # slow indeed: past the deadline several times over
    head, _, chunked = b"".join(pieces).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert dechunk(chunked) == b"".join(backend.events)
    assert not backend.cut


# Deadlines for the client's side of a request (ClientTimeouts), short here: 0.5 s for a head, 0.5 s of silence
# in a body. uvicorn alone waits for good, so a client that trickles bytes holds a connection as long as it likes.


def timed_gateway(upstreams: dict[str, Upstream], start_gateway: StartGateway) -> Gateway:
    model, feature = aimodel("chat-v1", upstreams["v1"].url), aifeature("chat", [("chat-v1", 100)])
    return start_gateway([model, feature], client_head_timeout=0.5, client_body_timeout=0.5)


def connect(gateway: Gateway) -> socket.socket:
    host, port = gateway.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def read_until_closed(conn: socket.socket) -> bytes:
    received = b""
    while chunk := conn.recv(65536):
        received += chunk
    return received


def chat_post(body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%b\r\n" % (len(body), extra)
    )


CHAT_BODY = b'{"model": "chat", "messages": [{"role": "user", "content": "hi"}]}'


def assert_timed_out(answer: bytes, what: bytes) -> None:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), answer
    assert b"\r\nconnection: close" in head
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout", error
    assert what in error["message"].encode(), error


def test_a_connection_that_sends_nothing_is_closed_after_the_head_timeout(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    gateway = timed_gateway(upstreams, start_gateway)
    with connect(gateway) as conn:
        opened = time.monotonic()
        assert read_until_closed(conn) == b""  # closed without an answer: there was no request to answer
        assert 0.4 < time.monotonic() - opened < 5


def test_a_head_trickled_byte_by_byte_gets_a_408_once_its_time_is_up(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    # Slowloris: every byte comes well within any per-read timeout; the head as a whole does not.
    gateway = timed_gateway(upstreams, start_gateway)
    head = chat_post(CHAT_BODY)
    with connect(gateway) as conn:
        began = time.monotonic()
        sent = 0
        while time.monotonic() - began < 5 and sent < len(head) - 1:
            try:
                conn.sendall(head[sent : sent + 1])
            except OSError:  # the gateway closed: reading tells why
                break
            sent += 1
            time.sleep(0.05)
        answer = read_until_closed(conn)
    assert_timed_out(answer, b"headers")
    assert time.monotonic() - began < 5
    assert sent < len(head) - 1  # cut off before the head was whole


def test_a_body_that_stops_coming_gets_a_408_and_the_gateway_serves_on(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    gateway = timed_gateway(upstreams, start_gateway)
    with connect(gateway) as conn:
        conn.sendall(chat_post(CHAT_BODY) + CHAT_BODY[:10])  # the head, and a tenth of the body
        began = time.monotonic()
        answer = read_until_closed(conn)
        assert 0.4 < time.monotonic() - began < 5
    assert_timed_out(answer, b"body")
    with connect(gateway) as conn:  # the next client is served as ever
        conn.sendall(chat_post(CHAT_BODY, b"Connection: close\r\n") + CHAT_BODY)
        assert read_until_closed(conn).startswith(b"HTTP/1.1 200 ")


def test_slow_requests_within_their_deadlines_and_slow_answers_are_served(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    gateway = timed_gateway(upstreams, start_gateway)
    # A body in pieces 0.2 s apart: a second in all, twice the body timeout, but never silent for as long.
    with connect(gateway) as conn:
        conn.sendall(chat_post(CHAT_BODY, b"Connection: close\r\n"))
        for at in range(0, len(CHAT_BODY), 14):
            time.sleep(0.2)
            conn.sendall(CHAT_BODY[at : at + 14])
        assert read_until_closed(conn).startswith(b"HTTP/1.1 200 ")
    # The backend taking 1.5 s to answer, and to stream, is no client's delay: neither is cut.
    for body in (
        b'{"model": "chat", "messages": [{"role": "user", "content": "delay=1.5"}]}',
        b'{"model": "chat", "stream": true, "messages": [{"role": "user", "content": "chunks=3 gap=0.5"}]}',
    ):
        with connect(gateway) as conn:
            conn.sendall(chat_post(body, b"Connection: close\r\n") + body)
            answer = read_until_closed(conn)
        assert answer.startswith(b"HTTP/1.1 200 "), answer
        assert b"v1" in answer
    # Keep-alive: a second request 0.3 s after the first answer, a third after another 0.3 s (0.6 s in all since
    # the connection's first request: a head's deadline counts from its own first byte, not the connection's).
    with connect(gateway) as conn:
        for last in (False, False, True):
            time.sleep(0.3)
            conn.sendall(chat_post(CHAT_BODY, b"Connection: close\r\n" if last else b"") + CHAT_BODY)
            answer = conn.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200 "), answer


def test_a_head_too_large_gets_a_431_and_a_large_one_within_the_bound_is_served(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    """httptools keeps an unfinished header line whole in memory: without a bound a client grows the gateway by
    whatever it sends, before any key is checked. Past MAX_HEAD_BYTES the head is refused."""
    gateway = served(upstreams, start_gateway)
    with connect(gateway) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nX-Padding: ")
        time.sleep(0.3)  # the head's first read, on its own: the bound counts what comes after it
        conn.sendall(b"a" * (MAX_HEAD_BYTES + 32 * 1024))  # read whole before the refusal: nothing left unread
        answer = read_until_closed(conn)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 "), answer
    assert json.loads(body)["error"]["code"] == "headers_too_large"
    # Headers of 40 kB (well within the bound), sent in pieces: an ordinary answer.
    padding = b"X-Padding: " + b"b" * 40_000 + b"\r\n"
    post = chat_post(CHAT_BODY, padding + b"Connection: close\r\n") + CHAT_BODY
    with connect(gateway) as conn:
        for at in range(0, len(post), 8_000):
            conn.sendall(post[at : at + 8_000])
            time.sleep(0.02)
        assert read_until_closed(conn).startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nX-Bad: a\x01b\r\nContent-Length: 2\r\n\r\n{}",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: -1\r\n\r\n{}",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        b"GET /v1/models HTTP/9.x\r\n\r\n",
    ],
    ids=["control-character", "negative-length", "length-and-chunked", "bad-chunk-size", "bad-version"],
)
def test_a_request_that_is_not_http_gets_a_400_in_the_openai_shape(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, request_bytes: bytes
) -> None:
    gateway = served(upstreams, start_gateway)
    answer = exchange(gateway.url, request_bytes)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer
    assert b"\r\ncontent-type: application/json" in head
    assert b"\r\nconnection: close" in head
    assert json.loads(body)["error"]["code"] == "invalid_http_request"
    served_after = exchange(gateway.url, chat_post(CHAT_BODY, b"Connection: close\r\n") + CHAT_BODY)
    assert served_after.startswith(b"HTTP/1.1 200 ")


def test_an_encoded_body_is_a_415_and_any_content_type_of_a_json_body_is_served(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    """The runtime answers the same (tests/runtime/test_runtime_errors.py): the body counts, not its label."""
    gateway = served(upstreams, start_gateway)
    body = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}).encode()
    url = gateway.url + "/v1/chat/completions"
    for encoding, content in (("gzip", gzip.compress(body)), ("br", body)):
        headers = {"content-type": "application/json", "content-encoding": encoding}
        refused = httpx.post(url, content=content, headers=headers, timeout=10)
        assert refused.status_code == 415, refused.text
        assert refused.json()["error"]["code"] == "unsupported_content_encoding"
    assert httpx.post(url, content=body, headers={"content-type": "text/plain"}, timeout=10).status_code == 200
