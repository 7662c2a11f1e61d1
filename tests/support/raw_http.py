"""Raw HTTP on a socket, for tests that must see when a server answers before it has read a whole body."""

from __future__ import annotations

import socket


def read_response_head(sock: socket.socket) -> bytes:
    """What the server sent up to the end of its response head (or until it closed the connection)."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        received = sock.recv(65536)
        if not received:
            break
        answer += received
    return answer
