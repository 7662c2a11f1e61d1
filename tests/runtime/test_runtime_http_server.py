"""The runtime on the gateway's server protocol (servlane_web.http_server, through
servlane_runtime.server_options): a client that stops sending its body gets a 408 and frees its connection, what
is not HTTP gets a 400 in the OpenAI error shape; the runtime serves on after either."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from servlane_web.http_server import ClientTimeouts
from tests.support.servers import InProcessServer, tiny_config

MODEL = "tiny-llama"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
BODY = json.dumps(CHAT).encode()


@pytest.fixture(scope="module")
def impatient_server(tiny_llama_dir: Path) -> Iterator[InProcessServer]:
    server = InProcessServer(tiny_config(tiny_llama_dir))
    # What the protocol reads off the app served; 60 s of body silence by default, half a second here.
    server.app.client_timeouts = ClientTimeouts(head=0.5, body_idle=0.5)  # type: ignore[attr-defined]
    with server:
        server.wait_ready()
        yield server


def exchange(server: InProcessServer, request: bytes) -> bytes:
    """Sends `request` and reads until the runtime closes the connection."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
        conn.sendall(request)
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
    return received


def post_head(length: int) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: rt\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % length
    )


def error_of(answer: bytes, status: bytes) -> dict[str, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 " + status), answer
    assert b"\r\ncontent-type: application/json" in head
    error: dict[str, str] = json.loads(body)["error"]
    return error


def test_a_body_that_stops_arriving_gets_a_408_and_the_runtime_serves_on(impatient_server: InProcessServer) -> None:
    """Without a deadline the runtime waited for the missing bytes for good: the connection stayed open, and on
    SIGTERM the drain waited for the request (until the client gave up)."""
    answer = exchange(impatient_server, post_head(len(BODY)) + BODY[:-10])  # 10 bytes short, then silence
    assert error_of(answer, b"408 ")["code"] == "request_timeout"
    served = httpx.post(impatient_server.v1 + "/chat/completions", json=CHAT, timeout=60)
    assert served.status_code == 200, served.text


def test_what_is_not_http_gets_a_400_in_the_openai_shape(impatient_server: InProcessServer) -> None:
    answer = exchange(impatient_server, b"POST /v1/chat/completions HTTP/1.1\r\nHost: rt\r\nContent-Length: -1\r\n\r\n")
    assert error_of(answer, b"400 ")["code"] == "invalid_http_request"
    assert impatient_server.get("/health").status_code == 200


def test_an_http_1_0_client_gets_a_stream_it_can_read_and_head_answers_on_get_endpoints(
    impatient_server: InProcessServer,
) -> None:
    """A stream to an HTTP/1.0 client is not chunked (it would read the chunk sizes as text), the close ends it;
    HEAD on the probes and the model list answers as GET does, without the body (load balancers probe so)."""
    stream = json.dumps({**CHAT, "stream": True, "max_tokens": 4}).encode()
    request = post_head(len(stream)).replace(b" HTTP/1.1\r\n", b" HTTP/1.0\r\n", 1) + stream
    head, _, body = exchange(impatient_server, request).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert b"transfer-encoding" not in head.lower(), head
    events = [line for line in body.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"data: [DONE]", body
    assert all(json.loads(e[6:])["object"] == "chat.completion.chunk" for e in events[:-1]), body
    for path in (b"/health", b"/ready", b"/v1/models"):
        got = exchange(impatient_server, b"HEAD %b HTTP/1.1\r\nHost: rt\r\nConnection: close\r\n\r\n" % path)
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), (path, got)
        assert body == b"", (path, got)
