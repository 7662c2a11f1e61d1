"""Endpoint overrides: cluster-DNS backend URLs rewritten to reachable ones (port-forwards, local runtimes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servlane_api import AIFeature, AIModel
from servlane_core.routing.overrides import apply_overrides, parse_override_env, parse_override_items, rewrite_url
from servlane_core.routing.routes import build_route_table
from servlane_gateway.flags import parse_settings
from tests.support.gateway_harness import StartGateway, Upstream, aifeature, aimodel, route_in

CLUSTER = "http://chat-v1.prod.svc.cluster.local:8000"


def test_longest_whole_prefix_wins_and_others_are_left_alone() -> None:
    overrides = parse_override_items(
        ["http://a.svc:8000=http://127.0.0.1:1", "http://a.svc:8000/deep=http://127.0.0.1:2/x/"]
    )
    assert overrides == {"http://a.svc:8000": "http://127.0.0.1:1", "http://a.svc:8000/deep": "http://127.0.0.1:2/x"}
    assert rewrite_url("http://a.svc:8000", overrides) == "http://127.0.0.1:1"
    assert rewrite_url("http://a.svc:8000/other", overrides) == "http://127.0.0.1:1/other"
    assert rewrite_url("http://a.svc:8000/deep", overrides) == "http://127.0.0.1:2/x"
    assert rewrite_url("http://a.svc:80001", overrides) == "http://a.svc:80001"  # not a whole part
    assert rewrite_url("http://b.svc:8000", overrides) == "http://b.svc:8000"


@pytest.mark.parametrize("bad", ["no-equals-sign", "http://a=not-a-url", "=http://b"])
def test_malformed_overrides_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="URL=URL"):
        parse_override_items([bad])


def test_environment_takes_a_comma_list_or_json_and_flags_repeat(tmp_path: Path) -> None:
    want = {CLUSTER: "http://127.0.0.1:39001", "http://b:8000": "http://127.0.0.1:39002"}
    as_list = f"{CLUSTER}/v1=http://127.0.0.1:39001/v1, http://b:8000=http://127.0.0.1:39002"
    as_json = json.dumps({CLUSTER: "http://127.0.0.1:39001", "http://b:8000/": "http://127.0.0.1:39002"})
    assert parse_override_env(as_list) == want
    assert parse_override_env(as_json) == want
    routes = ["--routes-file", str(tmp_path / "r.json")]
    env = {"SERVLANE_GATEWAY_ENDPOINT_OVERRIDES": as_json}
    assert parse_settings(routes, env).endpoint_overrides == want
    flags = [
        *routes,
        "--endpoint-override",
        f"{CLUSTER}=http://127.0.0.1:5",
        "--endpoint-override",
        "http://c=http://d",
    ]
    assert parse_settings(flags, env).endpoint_overrides == {CLUSTER: "http://127.0.0.1:5", "http://c": "http://d"}
    with pytest.raises(ValueError, match="URL=URL"):
        parse_settings([*routes, "--endpoint-override", "junk"], {})


def test_table_backends_are_rewritten_and_aliases_stay_one_route() -> None:
    model = AIModel.model_validate(aimodel("chat-v1", f"{CLUSTER}/v1"))
    other = AIModel.model_validate(aimodel("chat-v2", "http://elsewhere:8000/v1"))
    feature = AIFeature.model_validate(aifeature("chat", [("chat-v1", 50), ("chat-v2", 50)]))
    table = build_route_table([feature], [model, other], ["default"])
    table = apply_overrides(table, {CLUSTER: "http://127.0.0.1:39001"})
    urls = {b.model: b.base_url for b in route_in(table, "chat").backends}
    assert urls == {"chat-v1": "http://127.0.0.1:39001", "chat-v2": "http://elsewhere:8000"}
    assert table.lookup("chat") is table.lookup("default/chat")
    assert route_in(table, "chat-v1").backends[0].base_url == "http://127.0.0.1:39001"


def test_gateway_reaches_a_cluster_dns_backend_through_its_override(
    upstreams: dict[str, Upstream], start_gateway: StartGateway
) -> None:
    objects = [aimodel("chat-v1", f"{CLUSTER}/v1"), aifeature("chat", [("chat-v1", 100)])]
    gw = start_gateway(objects, endpoint_overrides={CLUSTER: upstreams["v1"].url})
    answer = gw.client().chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "v1"
