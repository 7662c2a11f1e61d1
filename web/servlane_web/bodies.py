"""Refusing a request before its body is read (a 413, a bad key) without losing the refusal.

A server that closes a connection while the client's body is still arriving closes a socket with unread data:
the kernel sends a reset instead of an orderly end and drops what it had not sent yet, so the client may get
the answer's head and lose its body (a CI run: "peer closed connection without sending complete message body"
on a 413) or lose it all. On a kept-alive connection uvicorn reads and drops the rest of the body itself after
the answer, so the answer goes first and nothing is reset: such answers must never ask for the connection to
close. When it closes anyway (the client sent `Connection: close`, or spoke HTTP/1.0), the rest of the body is
read and dropped before the answer (nginx's "lingering close" does the same), within bounds, so a client that
sends for ever is still cut off; one that asked `Expect: 100-continue` has sent nothing and is answered at once.
"""

from __future__ import annotations

import asyncio

from starlette.types import Receive, Scope

DRAIN_MAX_BYTES = 64 << 20  # past this much more, the connection is closed on the client (as before)
DRAIN_MAX_SECONDS = 5.0  # a client that sends slowly is not waited for longer than this
# Set in an ASGI scope once its request body was read to its end (or dropped): nothing left to drain.
BODY_DONE = "servlane.body_done"


async def drain_body(
    receive: Receive, max_bytes: int = DRAIN_MAX_BYTES, max_seconds: float = DRAIN_MAX_SECONDS
) -> bool:
    """Reads and drops the rest of the request body. True when it ended (or the client left) within the bounds;
    False when the bounds cut it short."""
    dropped = 0
    try:
        async with asyncio.timeout(max_seconds):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return True
                dropped += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return True
                if dropped > max_bytes:
                    return False
    except TimeoutError:
        return False


def closes_after_answer(scope: Scope, headers: dict[bytes, bytes]) -> bool:
    """Whether the server closes this connection once it has answered: the client asked (`Connection: close`)
    or spoke HTTP/1.0 without asking to keep it alive."""
    tokens = {t.strip() for t in headers.get(b"connection", b"").lower().split(b",")}
    if scope.get("http_version") == "1.0":
        return b"keep-alive" not in tokens
    return b"close" in tokens


async def drain_unread_body(scope: Scope, receive: Receive) -> None:
    """Before answering a request whose body was not read to its end (not marked BODY_DONE): drops the rest
    (drain_body) when the connection closes after the answer and a body is on its way."""
    if scope.get(BODY_DONE):
        return
    scope[BODY_DONE] = True
    headers = dict(scope["headers"])
    if headers.get(b"content-length", b"0") in (b"0", b"") and b"transfer-encoding" not in headers:
        return  # no body
    if not closes_after_answer(scope, headers):
        return  # kept alive: uvicorn drops the rest after the answer
    if headers.get(b"expect", b"").strip().lower() != b"100-continue":
        await drain_body(receive)
