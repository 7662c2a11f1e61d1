"""Free loopback ports for the runtimes and the gateway."""

from __future__ import annotations

import argparse
import socket


def free_port() -> int:
    """A port the kernel just handed out on 127.0.0.1. Another process could take it before the child
    binds it; the child then exits and is restarted on the next pass, which is rare and recovers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_free(host: str, port: int) -> bool:
    """Whether `host:port` can be bound now (checked before the gateway starts, for a clear error); an IPv6 host
    is bound as one (an IPv4 socket refused `::1` as if its port were taken)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except (OSError, UnicodeError):
        return False
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def local_url(host: str, port: int) -> str:
    """How this machine reaches a server listening on `host:port`: a wildcard address through loopback, any
    other address as it is (the gateway bound to one address does not answer on 127.0.0.1)."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def port_number(text: str) -> int:
    """argparse's type for a port: 0 (any free one) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (0 to 65535)")
    return port
