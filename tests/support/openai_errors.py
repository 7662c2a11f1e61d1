"""The OpenAI error shape of every error answer: one `error` object with message, type, param and code."""

from __future__ import annotations

import httpx


def error_of(response: httpx.Response) -> dict[str, object]:
    body = response.json()
    assert set(body) == {"error"}, body
    assert {"message", "type", "param", "code"} <= set(body["error"]), body
    return dict(body["error"])
