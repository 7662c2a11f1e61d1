"""One batch request through the gateway's own pipeline, in process: the very handler the HTTP routes call
(forwarding.handle), so the owning key's scope, its quotas and the feature's routing, defaults, canaries
and cache apply unchanged, with `X-Priority: low` so the backends serve interactive requests first.

The worker holds no API key (only their hashes are kept): the request is made as the key that owns the
batch, looked up by name in the current key ring, so a key revoked since stops its batches' requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.types import Message

from servlane_core.protocol.errors import OpenAIError
from servlane_gateway.access import ApiKey, KeyRing
from servlane_gateway.forwarding import handle
from servlane_gateway.http.request import error_response
from servlane_gateway.state import GatewayState

LOW_PRIORITY = "low"


@dataclass(frozen=True)
class Answer:
    status: int
    body: object  # the JSON answer, or its text when it is not JSON
    request_id: str


class ActingAs(KeyRing):
    """A key ring that authenticates every request as one key: the batch's owner."""

    def __init__(self, key: ApiKey) -> None:
        super().__init__([key])
        self.key = key

    def authenticate(self, authorization: str | None) -> ApiKey | None:
        return self.key


def state_for(state: GatewayState, owner: str) -> GatewayState:
    """The gateway's state as seen by `owner`'s requests (same limiter, pool, table, metrics, cache)."""
    if not state.keys.enabled:
        return state
    key = next((k for k in state.keys.keys if k.name == owner), None)
    if key is None:
        raise OpenAIError(401, f"The API key '{owner}' that created this batch is no longer configured.",
                          code="invalid_api_key")  # fmt: skip
    return dataclasses.replace(state, keys=ActingAs(key))


async def send(state: GatewayState, owner: str, endpoint: str, body: dict[str, Any], request_id: str) -> Answer:
    """The answer the gateway gives `body` on `endpoint` (e.g. "chat/completions") for `owner`."""
    try:
        acting = state_for(state, owner)
    except OpenAIError as exc:
        refused = error_response(exc)
        return Answer(refused.status_code, json.loads(bytes(refused.body)), request_id)
    payload = json.dumps(body).encode()
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": f"/v1/{endpoint}",
        "raw_path": f"/v1/{endpoint}".encode(),
        "query_string": b"",
        "root_path": "",
        "client": ("batch", 0),
        "server": ("batch", 0),
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"x-priority", LOW_PRIORITY.encode()),
            (b"x-request-id", request_id.encode()),
        ],
    }
    sent = False
    never = asyncio.Event()  # the in-process "client" never disconnects

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await never.wait()
        return {"type": "http.disconnect"}

    status = 500
    parts: list[bytes] = []

    async def collect(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    response = await handle(acting, Request(scope, receive), endpoint)
    await response(scope, receive, collect)
    raw = b"".join(parts)
    try:
        parsed: object = json.loads(raw)
    except ValueError:
        parsed = raw.decode("utf-8", "replace")
    return Answer(status, parsed, request_id)
