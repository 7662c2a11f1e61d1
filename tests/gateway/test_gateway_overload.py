"""Overload end to end through the real gateway over loopback: the client's X-Priority reaches the runtime's
admission queue, a backend's Retry-After reaches the client unchanged, and the gateway's own 429/503 say
when to come back in the header and in the error object."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.gateway_harness import Gateway, StartGateway, Upstream, aifeature, aimodel, refused_url


def post(gateway: Gateway, text: str, model: str = "chat", priority: str | None = None) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    headers = {"X-Priority": priority} if priority is not None else {}
    return httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=10)


@pytest.fixture
def gateway(upstreams: dict[str, Upstream], start_gateway: StartGateway) -> Gateway:
    objects = [
        aimodel("chat-v1", upstreams["v1"].url),
        aimodel("down", refused_url()),
        aimodel("loading", upstreams["v2"].url, ready=False),
        aifeature("chat", [("chat-v1", 100)]),
        aifeature("refusing", [("down", 100)]),
        aifeature("not-ready", [("loading", 100)]),
    ]
    return start_gateway(objects, unavailable_retry_after=7, feature_requests_per_minute=2)


def last_headers(upstream: Upstream) -> dict[str, str]:
    return upstream.state.headers[-1]


@pytest.mark.parametrize(("sent", "forwarded"), [("high", "high"), ("LOW", "low"), ("normal", "normal")])
def test_client_priority_is_forwarded_to_the_runtime(
    gateway: Gateway, upstreams: dict[str, Upstream], sent: str, forwarded: str
) -> None:
    assert post(gateway, "hi", priority=sent).status_code == 200
    assert last_headers(upstreams["v1"])["x-priority"] == forwarded


def test_no_priority_header_forwards_none(gateway: Gateway, upstreams: dict[str, Upstream]) -> None:
    assert post(gateway, "hi").status_code == 200
    assert "x-priority" not in last_headers(upstreams["v1"])  # the runtime's default (normal) applies


def test_the_backend_is_asked_not_to_compress(gateway: Gateway, upstreams: dict[str, Upstream]) -> None:
    """The answer is relayed as it comes, without its Content-Encoding: a compressed one reached the client as
    bytes its JSON parser could not read (no Accept-Encoding allows any coding)."""
    assert post(gateway, "hi").status_code == 200
    assert last_headers(upstreams["v1"])["accept-encoding"] == "identity"


def test_a_bad_priority_is_400_at_the_gateway_and_never_reaches_a_backend(
    gateway: Gateway, upstreams: dict[str, Upstream]
) -> None:
    before = len(upstreams["v1"].state.bodies)
    response = post(gateway, "hi", priority="urgent")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "X-Priority"
    assert len(upstreams["v1"].state.bodies) == before


@pytest.mark.parametrize(("status", "retry_after"), [(429, "3"), (503, "120")])
def test_the_runtimes_retry_after_reaches_the_client_unchanged(gateway: Gateway, status: int, retry_after: str) -> None:
    response = post(gateway, f"status={status} retry_after={retry_after}", priority="low")
    assert response.status_code == status
    assert response.headers["retry-after"] == retry_after
    assert response.json()["error"]["message"] == "v1 failed on purpose"  # the backend's body, as it was


def test_a_backend_answer_without_retry_after_gets_none_added(gateway: Gateway) -> None:
    response = post(gateway, "status=500")
    assert response.status_code == 500
    assert "retry-after" not in response.headers


def own_error(response: httpx.Response) -> dict[str, Any]:
    error = dict(response.json()["error"])
    assert error["retry_after"] == int(response.headers["retry-after"])
    assert isinstance(error["retry_after"], int)
    return error


def test_no_ready_backend_is_503_with_retry_after_in_header_and_body(gateway: Gateway) -> None:
    response = post(gateway, "hi", model="not-ready")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "7"
    assert own_error(response)["retry_after"] == 7


def test_every_backend_refusing_is_503_with_retry_after(gateway: Gateway) -> None:
    response = post(gateway, "hi", model="refusing")
    assert response.status_code == 503
    assert own_error(response)["retry_after"] == 7


def test_the_gateways_rate_limit_is_429_with_retry_after_in_header_and_body(gateway: Gateway) -> None:
    assert [post(gateway, "hi").status_code for _ in range(2)] == [200, 200]
    response = post(gateway, "hi")
    assert response.status_code == 429
    error = own_error(response)
    assert error["code"] == "rate_limit_exceeded"
    assert 1 <= error["retry_after"] <= 30  # 2 per minute: the next one within half a minute


def test_errors_without_a_retry_after_carry_no_retry_after(gateway: Gateway) -> None:
    response = post(gateway, "hi", model="nope")
    assert response.status_code == 404
    assert "retry_after" not in response.json()["error"]
    assert "retry-after" not in response.headers
