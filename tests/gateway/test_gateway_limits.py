"""The gateway's request limits: what breaks them is a 4xx in the one error shape, and never reaches a backend."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.gateway_harness import Gateway, StartGateway, Upstream, aifeature, aimodel


@pytest.fixture
def gateway(upstreams: dict[str, Upstream], start_gateway: StartGateway) -> Gateway:
    objects = [aimodel("chat-v1", upstreams["v1"].url), aifeature("chat", [("chat-v1", 100)])]
    return start_gateway(objects, max_json_depth=16, max_list_items=10)


def post(gateway: Gateway, raw: bytes, path: str = "/v1/chat/completions") -> httpx.Response:
    return httpx.post(gateway.url + path, content=raw, headers={"content-type": "application/json"}, timeout=10)


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    assert {"message", "type", "param", "code"} <= set(body["error"]), body
    return dict(body["error"])


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 5000 + b"]" * 5000,  # was a 500: RecursionError in json.loads
        b'{"model": "chat", "messages": [], "x": ' + b'{"a":' * 5000 + b"1" + b"}" * 5001,
        b'{"model": "chat", "messages": [], "x": ' + b"[" * 16 + b"]" * 16 + b"}",  # 17 levels with the body
    ],
)
def test_deep_nesting_is_400(gateway: Gateway, upstreams: dict[str, Upstream], raw: bytes) -> None:
    before = len(upstreams["v1"].state.bodies)
    response = post(gateway, raw)
    assert response.status_code == 400, response.text
    assert error_of(response)["code"] == "too_deeply_nested"
    assert len(upstreams["v1"].state.bodies) == before


def test_nesting_within_the_cap_is_forwarded(gateway: Gateway, upstreams: dict[str, Upstream]) -> None:
    raw = b'{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "x": ' + b"[" * 14 + b"]" * 14 + b"}"
    response = post(gateway, raw)
    assert response.status_code == 200, response.text
    assert upstreams["v1"].state.bodies[-1]["x"] == json.loads(b"[" * 14 + b"]" * 14)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}] * 11}, "messages"),
        ("/v1/completions", {"prompt": ["a"] * 11}, "prompt"),
        ("/v1/embeddings", {"input": ["a"] * 11}, "input"),
    ],
)
def test_lists_over_the_cap_are_400(
    gateway: Gateway, upstreams: dict[str, Upstream], path: str, body: dict[str, Any], param: str
) -> None:
    before = len(upstreams["v1"].state.bodies)
    response = post(gateway, json.dumps({"model": "chat", **body}).encode(), path)
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert (error["code"], error["param"]) == ("too_many_items", param)
    assert len(upstreams["v1"].state.bodies) == before


@pytest.mark.parametrize("raw", [b'{"model": "chat", "temperature": NaN}', b'{"model": "chat", "user": "\\udfff"}'])
def test_what_is_not_json_is_400(gateway: Gateway, raw: bytes) -> None:
    response = post(gateway, raw)
    assert response.status_code == 400, response.text
    assert error_of(response)["code"] == "invalid_json"


def test_the_openapi_schema_describes_the_proxied_requests(gateway: Gateway) -> None:
    schema = httpx.get(gateway.url + "/openapi.json", timeout=10).json()
    for path, model in [
        ("/v1/chat/completions", "ChatCompletionRequest"),
        ("/v1/completions", "CompletionRequest"),
        ("/v1/embeddings", "EmbeddingRequest"),
    ]:
        content = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert content["schema"]["$ref"].endswith("/" + model)
    assert httpx.get(gateway.url + "/v1/completions", timeout=10).status_code == 405
