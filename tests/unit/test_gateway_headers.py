"""The gateway's header lookup on its hot path answers what Starlette's `request.headers.get` answers."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from servlane_gateway.http.request import header


def request_with(headers: list[tuple[bytes, bytes]]) -> Request:
    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    return Request(scope)


def test_header_answers_like_starlette_headers_get() -> None:
    raw = [(b"x-request-id", b"first"), (b"accept", b"text/event-stream"), (b"x-request-id", b"second"),
           (b"authorization", b"Bearer caf\xe9")]  # fmt: skip
    names = ["x-request-id", "accept", "authorization", "x-priority", "content-length"]
    ours = [header(request_with(raw), name.encode()) for name in names]
    assert ours == [request_with(raw).headers.get(name) for name in names]
    assert ours[0] == "first"  # the first of repeated headers
    assert ours[3] is None  # missing
