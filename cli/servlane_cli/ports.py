"""Free loopback ports for the runtimes and the gateway."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port the kernel just handed out on 127.0.0.1. Another process could take it before the child
    binds it; the child then exits and is restarted on the next pass, which is rare and recovers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_free(host: str, port: int) -> bool:
    """Whether `host:port` can be bound now (checked before the gateway starts, for a clear error)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
