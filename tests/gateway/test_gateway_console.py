"""The console's HTTP side against a running gateway: the page and its vendored library are served (no key
needed: they hold no data), the state behind the keys exactly as /v1/models, scoped keys see only their
scopes, and failed or slow requests that went through the gateway show up with their trace ids."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from servlane_gateway.flags import parse_settings
from servlane_gateway.settings import GatewaySettings
from tests.support.console import console_objects
from tests.support.gateway_harness import StartGateway, Upstream

ADMIN_KEY = "admin-key-0123456789abcdef0123456789"
TEAM_KEY = "team-key-0123456789abcdef0123456789"
KEYS = f"admin: {ADMIN_KEY}\nteam: {TEAM_KEY} default/summary\n"
HI: Any = [{"role": "user", "content": "hi"}]


def state(url: str, key: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{url}/console/api/state", headers=headers, timeout=10)


def test_page_and_vendored_chart_library_are_served_with_a_strict_policy(
    start_gateway: StartGateway, upstreams: dict[str, Upstream]
) -> None:
    gw = start_gateway(console_objects(upstreams["v1"].url, upstreams["v2"].url), keys=KEYS)
    page = httpx.get(f"{gw.url}/console", timeout=10)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert "/console/static/vendor/uPlot.iife.min.js" in page.text
    library = httpx.get(f"{gw.url}/console/static/vendor/uPlot.iife.min.js", timeout=10)
    assert library.status_code == 200
    assert "uPlot" in library.text
    assert httpx.get(f"{gw.url}/console/static/console.js", timeout=10).status_code == 200


def test_state_needs_a_key_and_shows_each_key_its_scope_only(
    start_gateway: StartGateway, upstreams: dict[str, Upstream]
) -> None:
    gw = start_gateway(console_objects(upstreams["v1"].url, upstreams["v2"].url), keys=KEYS)
    assert state(gw.url).status_code == 401
    assert state(gw.url, "wrong").status_code == 401
    admin = state(gw.url, ADMIN_KEY).json()
    assert {f["name"] for f in admin["features"]} == {"chat", "summary"}
    assert {(m["namespace"], m["name"]) for m in admin["models"]} == {
        ("default", "chat-v1"), ("default", "chat-v2"), ("other", "secret-model")
    }  # fmt: skip
    team = state(gw.url, TEAM_KEY)
    assert team.headers["cache-control"] == "no-store"
    body = team.json()
    assert [f["name"] for f in body["features"]] == ["summary"]
    assert [m["name"] for m in body["models"]] == ["chat-v1"]  # the one behind `summary`
    assert "secret-model" not in team.text
    assert '"chat"' not in team.text


def test_failed_requests_are_listed_with_their_feature_and_model(
    start_gateway: StartGateway, upstreams: dict[str, Upstream]
) -> None:
    gw = start_gateway(console_objects(upstreams["v1"].url, upstreams["v2"].url), console_slow_seconds=30)
    client = gw.client()
    client.chat.completions.create(model="summary", messages=HI)  # fine and fast: not listed
    failing = httpx.post(
        f"{gw.url}/v1/chat/completions",
        json={"model": "summary", "messages": [{"role": "user", "content": "status=500"}]},
        timeout=10,
    )
    assert failing.status_code == 500
    body = state(gw.url).json()  # no keys configured: open, like /v1/models
    assert [(r["feature"], r["model"], r["status"], r["failed"]) for r in body["recent"]] == [
        ("summary", "chat-v1", 500, True)
    ]
    v1 = next(m for m in body["models"] if m["name"] == "chat-v1")
    assert v1["requests"] == 2
    assert v1["errorRate"] == 0.5
    assert v1["ttftP95Seconds"] is not None
    assert v1["timeToReadySeconds"] == 120.0
    assert v1["coldStart"]["last"]["total"] == 14.0
    assert v1["coldStart"]["last"]["engineLoaded"] == 6.5
    assert v1["coldStart"]["median"] == {"total": 12.0}
    assert v1["coldStart"]["samples"] == 2
    assert next(m for m in body["models"] if m["name"] == "chat-v2")["coldStart"] is None


def test_the_console_can_be_turned_off(start_gateway: StartGateway, upstreams: dict[str, Upstream]) -> None:
    gw = start_gateway(console_objects(upstreams["v1"].url, upstreams["v2"].url), console_enabled=False)
    assert httpx.get(f"{gw.url}/console", timeout=10).status_code == 404
    assert state(gw.url).status_code == 404
    assert gw.state.recent is None


def test_console_settings_come_from_flags_and_the_trace_template_must_be_a_link() -> None:
    settings = parse_settings(
        ["--watch", "--console-enabled", "false", "--console-slow-seconds", "2.5"],
        {"SERVLANE_GATEWAY_TRACE_URL_TEMPLATE": "http://jaeger:16686/trace/{trace_id}"},
    )
    assert (settings.console_enabled, settings.console_slow_seconds) == (False, 2.5)
    assert settings.trace_url_template == "http://jaeger:16686/trace/{trace_id}"
    assert GatewaySettings(watch=True).console_enabled
    for bad in ("javascript:alert(1)//{trace_id}", "http://jaeger/trace/"):
        with pytest.raises(ValueError, match="trace URL template"):
            GatewaySettings(watch=True, trace_url_template=bad)
