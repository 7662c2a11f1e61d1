"""Every POST body passes the request limits before FastAPI and pydantic see it.

Too large is a 413 (refused on Content-Length before reading, or as soon as a chunked body passes the cap;
the connection stays open, so the server drops the rest of the body after the answer instead of resetting
the connection under it: servlane_web.bodies); not a JSON object, nested too deep or with too long a list is
a 400; all in the one error shape. A body that passes is handed on unchanged, and the client's later messages
(its disconnect) still reach the app, which watches for them to stop generating."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from servlane_core.protocol.errors import OpenAIError
from servlane_core.protocol.limits import RequestLimits, body_too_large, check_content_encoding, parse_json_object
from servlane_web.bodies import BODY_DONE, drain_unread_body


class RequestGuard:
    def __init__(self, app: ASGIApp, limits: RequestLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            raw = await self._read(scope, receive)
            parse_json_object(raw, self.limits)
        except OpenAIError as error:
            await drain_unread_body(scope, receive)
            await _send_error(send, error)
            return
        # A JSON object whatever its Content-Type said (text/plain, curl -d's form type, none): FastAPI reads a
        # body as JSON only under application/json, and refused the rest with a message about dictionaries,
        # where the gateway (which re-sends as JSON) served it. One behaviour: the body is what counts.
        scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
        scope["headers"].append((b"content-type", b"application/json"))
        await self.app(scope, _replaying(raw, receive), send)

    async def _read(self, scope: Scope, receive: Receive) -> bytes:
        cap = self.limits.max_body_bytes
        headers = dict(scope["headers"])
        check_content_encoding(headers.get(b"content-encoding"))
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > cap:
            raise body_too_large(cap)
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                scope[BODY_DONE] = True
                raise OpenAIError(499, "client closed the request", code="client_closed_request")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > cap:
                scope[BODY_DONE] = not message.get("more_body", False)
                raise body_too_large(cap)
            parts.append(chunk)
            if not message.get("more_body", False):
                scope[BODY_DONE] = True
                return b"".join(parts)


def _replaying(raw: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()

    return replay


async def _send_error(send: Send, error: OpenAIError) -> None:
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers().items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
