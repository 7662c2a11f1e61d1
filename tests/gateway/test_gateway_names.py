"""Plain model names resolve only in the serving namespaces, in their order; `namespace/name` always works."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from servlane_gateway.kube_watch import own_namespace
from servlane_gateway.settings import parse_settings, plain_name_namespaces
from tests.gateway.gateway_harness import StartGateway, Upstream, aifeature, aimodel


def in_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    return obj | {"metadata": {**obj["metadata"], "namespace": namespace}}


def answer(url: str, model: str) -> tuple[int, str]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
    if response.status_code != 200:
        return response.status_code, response.json()["error"]["code"]
    return 200, str(response.json()["choices"][0]["message"]["content"])


def objects(upstreams: dict[str, Upstream]) -> list[dict[str, Any]]:
    return [
        in_namespace(aimodel("m", upstreams["v1"].url), "prod"),
        in_namespace(aimodel("m", upstreams["v2"].url), "aaa-other"),
        aifeature("chat", [("m", 100)], namespace="prod"),
        aifeature("chat", [("m", 100)], namespace="aaa-other"),  # alphabetically first: must not matter
        aifeature("only-other", [("m", 100)], namespace="aaa-other"),
        in_namespace(aimodel("impostor", upstreams["v2"].url, status_served="prod/chat"), "aaa-other"),
    ]


def test_plain_names_resolve_in_the_serving_namespaces_and_namespace_slash_name_everywhere(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="servlane_gateway.app"):
        gw = start_gateway(objects(upstreams), serving_namespaces=["prod"])
    assert answer(gw.url, "chat") == (200, "v1")
    assert answer(gw.url, "only-other") == (404, "model_not_found")  # held, but outside the serving namespaces
    assert answer(gw.url, "aaa-other/only-other") == (200, "v2")
    assert answer(gw.url, "aaa-other/chat") == (200, "v2")
    assert answer(gw.url, "prod/chat") == (200, "v1")  # the impostor's served name cannot shadow it
    assert answer(gw.url, "aaa-other/prod/chat") == (404, "model_not_found")
    listed = [entry["id"] for entry in httpx.get(gw.url + "/v1/models", timeout=10).json()["data"]]
    assert listed == ["chat", "m", "aaa-other/chat", "aaa-other/m", "aaa-other/only-other"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("resolve in namespace(s) prod" in line for line in messages)
    assert any("'aaa-other/impostor'" in line and "contains '/'" in line for line in messages)


def test_the_serving_namespaces_are_a_search_path(upstreams: dict[str, Upstream], start_gateway: StartGateway) -> None:
    gw = start_gateway(objects(upstreams), serving_namespaces=["aaa-other", "prod"])
    assert answer(gw.url, "chat") == (200, "v2")
    assert answer(gw.url, "only-other") == (200, "v2")


def test_a_routes_file_serves_the_default_namespace(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    gw = start_gateway([aimodel("m", upstreams["v1"].url), aifeature("chat", [("m", 100)]), *objects(upstreams)])
    assert answer(gw.url, "chat") == (200, "v1")  # default/chat, not prod's or aaa-other's
    assert answer(gw.url, "only-other") == (404, "model_not_found")


def test_default_serving_namespaces(tmp_path: Path) -> None:
    def serving(argv: list[str], env: dict[str, str] | None = None) -> list[str]:
        return plain_name_namespaces(parse_settings(argv, env or {}), lambda: "servlane-system")

    routes = ["--routes-file", str(tmp_path / "r.yaml")]
    assert serving(routes) == ["default"]
    assert serving(["--watch"]) == ["servlane-system"]  # the whole cluster: only the gateway's own namespace
    assert serving(["--watch", "--namespaces", "b,a"]) == ["b", "a"]
    assert serving(["--watch", "--serving-namespaces", "x, y"]) == ["x", "y"]
    assert serving([*routes], {"SERVLANE_GATEWAY_SERVING_NAMESPACES": "team"}) == ["team"]
    with pytest.raises(ValueError, match="not namespace names"):
        serving(["--watch", "--serving-namespaces", "Bad_NS"])


def test_own_namespace_prefers_the_pod_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "gw-ns")
    assert own_namespace() == "gw-ns"
