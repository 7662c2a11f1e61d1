"""The gateway's server protocol (servlane_gateway.http.server): one write per whole response, heads of streams
and of bodiless answers still sent, over real sockets; and the transport wrapper's rules on their own."""

from __future__ import annotations

import socket
from typing import Any

from servlane_gateway.http.server import HeadHoldingTransport
from tests.support.gateway_harness import Gateway, StartGateway, Upstream, aifeature, aimodel

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
    answer = exchange(gateway.url, b"HEAD /health HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 405 ")  # /health is GET only; the answer's head still says its length
    assert b"\r\ncontent-length: " in head
    assert body == b""


def test_keep_alive_answers_arrive_whole_one_after_another(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    gateway = served(upstreams, start_gateway)
    get = b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n"
    answer = exchange(gateway.url, get + get + b"GET /health HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 3
    assert answer.count(b'{"status":"ok"}') == 3
