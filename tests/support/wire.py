"""HTTP on a raw socket, for what a client library hides: whether the answer to a request whose body was sent
whole before anything was read arrives whole, and how the server treats the connection after it."""

from __future__ import annotations

import socket
from dataclasses import dataclass


@dataclass
class WireAnswer:
    status: int  # 0: no whole answer came back
    body: bytes
    # "reused" (kept alive: a second request on it was answered), "closed" (an orderly end), "reset" (RST,
    # possibly while still sending), or "dropped" (kept alive, but the second request got no answer)
    after: str


def _read_answer(sock: socket.socket, buffered: bytes = b"") -> tuple[int, bytes, bytes]:
    """(status, body, what came after it) of one answer with a Content-Length; status 0 if it ended early."""
    data = buffered
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return 0, b"", b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
    length = int(next(v for k, v in fields.items() if k.strip().lower() == b"content-length"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return 0, rest, b""
        rest += chunk
    return int(head.split(b" ")[1]), rest[:length], rest[length:]


def post_all_then_read(url: str, path: str, body: bytes, headers: dict[str, str], close: bool) -> WireAnswer:
    """POSTs `body` with its Content-Length, all of it sent before anything is read (as a client that uploads
    first does), then reads the answer; with `close` the request says `Connection: close` and the connection
    is read to its end, else a GET /health follows on the same connection."""
    host, _, port = url.removeprefix("http://").partition(":")
    head = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    head += [f"{name}: {value}" for name, value in headers.items()] + (["Connection: close"] if close else [])
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        try:
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            status, answer, extra = _read_answer(sock)
            if close:
                while sock.recv(65536):
                    pass
                return WireAnswer(status, answer, "closed")
            sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            second, _, _ = _read_answer(sock, extra)
            return WireAnswer(status, answer, "reused" if second == 200 else "dropped")
        except (BrokenPipeError, ConnectionResetError):
            return WireAnswer(0, b"", "reset")
