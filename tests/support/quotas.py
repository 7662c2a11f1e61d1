"""Requests held open through the gateway: SSE events read from raw bytes, a held stream, an upstream released
at the end."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from tests.support.gateway_harness import Upstream

CHAT = "/v1/chat/completions"


def events(raw: bytes) -> list[Any]:
    """The SSE stream as the client got it: each event must be one whole `data:` line."""
    assert raw.endswith(b"\n\n"), raw
    found: list[Any] = []
    for event in raw[:-2].split(b"\n\n"):
        assert event.startswith(b"data: "), raw
        assert b"\n" not in event, raw
        data = event[len(b"data: ") :]
        found.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return found


@contextmanager
def released_at_end(upstream: Upstream) -> Iterator[None]:
    """`hold` streams wait until the end of the block (also when it fails, so no backend waits on)."""
    upstream.state.released.clear()
    try:
        yield
    finally:
        upstream.state.released.set()


@dataclass
class Held:
    """A request sent with its response open: a 200 stream read up to its first chunk (its backend holds it
    in flight); the iterator is kept, since dropping it would close the stream."""

    response: httpx.Response
    first: bytes
    rest: Iterator[bytes]

    @property
    def status_code(self) -> int:
        return self.response.status_code

    def finish(self) -> bytes:
        try:
            return self.first + b"".join(self.rest)
        finally:
            self.response.close()


def open_held(client: httpx.Client, body: dict[str, Any], api_key: str | None = None) -> Held:
    headers = {"content-type": "application/json"} | ({"authorization": f"Bearer {api_key}"} if api_key else {})
    raw = json.dumps(body).encode()  # as the reservation test counts its bytes
    response = client.send(client.build_request("POST", CHAT, content=raw, headers=headers), stream=True)
    if response.status_code != 200:
        return Held(response, response.read(), iter(()))
    chunks = response.iter_raw()
    first = next(chunks)
    assert first.startswith(b"data: ")
    return Held(response, first, chunks)
