"""Plain model names resolve in the caller's own namespaces (its key's), else in the serving namespaces; a
name several of those hold is refused as ambiguous, never given to one of them; `namespace/name` always works."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from servlane_gateway.flags import parse_settings
from servlane_gateway.routing.kube_watch import own_namespace
from servlane_gateway.settings import plain_name_namespaces
from tests.support.gateway_harness import StartGateway, Upstream, aifeature, aimodel


def in_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    return obj | {"metadata": {**obj["metadata"], "namespace": namespace}}


def answer(url: str, model: str, key: str | None = None) -> tuple[int, str]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"authorization": f"Bearer {key}"} if key else {}
    response = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=10)
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


def listed(url: str, key: str | None = None) -> list[str]:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return [entry["id"] for entry in httpx.get(url + "/v1/models", headers=headers, timeout=10).json()["data"]]


def test_a_name_two_serving_namespaces_hold_is_ambiguous_not_the_first_ones(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    """Once a search path: the first serving namespace answered, so a new `chat` there took the other's traffic."""
    gw = start_gateway(objects(upstreams), serving_namespaces=["aaa-other", "prod"])
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    refused = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=10)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "ambiguous_model", "model")
    assert "'aaa-other/chat', 'prod/chat'" in error["message"]
    assert answer(gw.url, "only-other") == (200, "v2")  # held by one serving namespace only
    assert answer(gw.url, "prod/chat") == (200, "v1")
    assert listed(gw.url) == ["only-other", "aaa-other/chat", "aaa-other/m", "prod/chat", "prod/m"]


TEAM_A_KEY, TEAM_B_KEY = "sk-team-a-0123456789abcdef0123456789", "sk-team-b-0123456789abcdef0123456789"
ADMIN_KEY = "sk-admin-0123456789abcdef0123456789"


def two_teams(upstreams: dict[str, Upstream]) -> list[dict[str, Any]]:
    """team-a (answered by v1) and team-b (v2) each have a `chat`; team-b's was there first."""
    return [
        in_namespace(aimodel("m", upstreams["v1"].url), "team-a"),
        in_namespace(aimodel("m", upstreams["v2"].url), "team-b"),
        aifeature("chat", [("m", 100)], namespace="team-b"),
        aifeature("chat", [("m", 100)], namespace="team-a"),
    ]


def test_another_teams_new_feature_never_takes_a_keys_plain_name(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    """The issue: team-a (the first serving namespace) creates `chat`; team-b's `model: chat` requests, prompts
    included, went to team-a's model, and team-b's key scoped to `chat` still passed."""
    keys = f"team-a: {TEAM_A_KEY} team-a/*\nteam-b: {TEAM_B_KEY} team-b/*\nadmin: {ADMIN_KEY}\n"
    gw = start_gateway(two_teams(upstreams), keys=keys, serving_namespaces=["team-a", "team-b"])
    before = len(upstreams["v1"].state.bodies)
    assert answer(gw.url, "chat", TEAM_B_KEY) == (200, "v2")  # its own
    assert answer(gw.url, "chat", TEAM_A_KEY) == (200, "v1")
    assert answer(gw.url, "team-a/chat", TEAM_B_KEY) == (404, "model_not_found")
    assert len(upstreams["v1"].state.bodies) == before + 1  # team-a's model saw team-a's request only
    assert answer(gw.url, "chat", ADMIN_KEY) == (400, "ambiguous_model")  # no namespace of its own
    assert answer(gw.url, "team-b/chat", ADMIN_KEY) == (200, "v2")
    assert listed(gw.url, TEAM_B_KEY) == ["chat", "m"]
    assert listed(gw.url, ADMIN_KEY) == ["team-a/chat", "team-a/m", "team-b/chat", "team-b/m"]


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


def created_at(obj: dict[str, Any], stamp: str) -> dict[str, Any]:
    return obj | {"metadata": {**obj["metadata"], "creationTimestamp": stamp}}


def test_a_listed_model_was_created_when_its_object_was(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    """OpenAI's `created` of a model: the AIFeature's or the AIModel's creationTimestamp, not a constant."""
    gw = start_gateway(
        [
            created_at(aimodel("m", upstreams["v1"].url), "2026-03-01T10:00:00Z"),
            created_at(aifeature("chat", [("m", 100)]), "2026-11-30T08:15:30Z"),
            aifeature("old", [("m", 100)]),  # no timestamp (a file's manifest): 0, as before
        ]
    )
    listed = {entry["id"]: entry["created"] for entry in httpx.get(gw.url + "/v1/models", timeout=10).json()["data"]}
    assert listed == {"chat": 1796026530, "m": 1772359200, "old": 0}
    one = httpx.get(gw.url + "/v1/models/chat", timeout=10).json()
    assert (one["id"], one["object"], one["created"]) == ("chat", "model", 1796026530)
