"""What the gateway reads of an OpenAI request (headers, the capped body, the sticky id, the priority, whether
to ask for a stream's usage) and the error response it answers with."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from servlane_core.protocol.errors import OpenAIError
from servlane_core.protocol.limits import RequestLimits, body_too_large, check_content_encoding, parse_json_object
from servlane_web.bodies import BODY_DONE

# The runtime's admission queue serves waiters by `X-Priority` (servlane_runtime.admission reads exactly
# these values and answers others with a 400); checked here too so a bad value never reaches a backend.
PRIORITIES = ("high", "normal", "low")
STREAMING_ENDPOINTS = ("chat/completions", "completions")

_HEADERS_BY_NAME = "servlane.headers_by_name"


def header(request: Request, name: bytes) -> str | None:
    """The request's first header of a lower-case `name` (uvicorn lower-cases them). What
    `request.headers.get` answers, without its scan of every header and its KeyError when one is missing,
    for each of the several headers a proxied request reads: one dict per request, kept in its scope."""
    scope = request.scope
    by_name: dict[bytes, bytes] | None = scope.get(_HEADERS_BY_NAME)
    if by_name is None:
        by_name = scope[_HEADERS_BY_NAME] = {}
        for key, value in reversed(scope["headers"]):  # the first of repeated ones wins, as in Headers.get
            by_name[key.lower()] = value
    value = by_name.get(name)
    return None if value is None else value.decode("latin-1")


async def read_capped(request: Request, cap: int) -> bytes:
    """The body, or a 413 once it is over `cap`. A body read to its end is marked in the scope (BODY_DONE): what
    is left of another is dropped (servlane_web.bodies.drain_unread_body), so the refusal reaches the client."""
    check_content_encoding(header(request, b"content-encoding"))
    too_large = body_too_large(cap)
    length = header(request, b"content-length") or ""
    if length.isdigit() and int(length) > cap:
        raise too_large
    parts: list[bytes] = []
    size = 0
    receive = request.receive  # read as Request.stream() does, without its async generator per request
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            request.scope[BODY_DONE] = True
            raise ClientDisconnect
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            request.scope[BODY_DONE] = not message.get("more_body", False)
            raise too_large
        parts.append(chunk)
        if not message.get("more_body", False):
            request.scope[BODY_DONE] = True
            return b"".join(parts)


def parse_body(raw: bytes, limits: RequestLimits) -> dict[str, Any]:
    """A JSON object within the limits (depth, list lengths: see servlane_core.protocol.limits) naming a model."""
    body = parse_json_object(raw, limits)
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise OpenAIError(400, "You must provide a model parameter.", param="model", code="missing_model")
    return body


def sticky_id(request: Request, body: dict[str, Any]) -> str | None:
    user = body.get("user")
    return header(request, b"x-request-id") or (user if isinstance(user, str) and user else None)


def priority_of(request: Request) -> str | None:
    """The client's `X-Priority`, normalised, or None when it sent none (the runtime then uses normal)."""
    raw = header(request, b"x-priority")
    if raw is None:
        return None
    value = raw.strip().lower()
    if value not in PRIORITIES:
        raise OpenAIError(
            400, "X-Priority must be one of high, normal, low.", param="X-Priority", code="invalid_priority"
        )
    return value


def ask_for_usage(body: dict[str, Any], endpoint: str) -> bool:
    """Asks the backend for a stream's usage chunk, so the stream can be charged whatever the client sent;
    True when the client did not ask for it itself (the relay then cuts it out). A `stream_options` or
    `include_usage` of the wrong type is left alone, for the backend to refuse with its 400."""
    if endpoint not in STREAMING_ENDPOINTS or body.get("stream") is not True:
        return False
    options = body.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        return False
    if options.get("include_usage") is True:
        return False
    body["stream_options"] = {**options, "include_usage": True}
    return True


def error_response(error: OpenAIError) -> JSONResponse:
    """The error as OpenAI-style JSON. With a Retry-After (the gateway's own 429 and 503), the error object
    also carries `retry_after`, the same whole seconds, for clients that do not read headers."""
    body = error.body()
    headers = error.headers()
    if "Retry-After" in headers:
        body["error"]["retry_after"] = int(headers["Retry-After"])
    return JSONResponse(body, status_code=error.status, headers=headers)
