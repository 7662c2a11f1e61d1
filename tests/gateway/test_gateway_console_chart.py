"""The console's chart values: on by default with its slow threshold, off with one value, and the trace link
template passed only when set (the schema refuses one that is not an http(s) URL with {trace_id})."""

from __future__ import annotations

from typing import Any

from servlane_gateway.flags import parse_settings
from tests.helm import conftest as helm_fixtures
from tests.support.helmtool import CHART, Helm, one

helm = helm_fixtures.helm  # skipped locally without a helm binary, a failure in CI
GATEWAY = "mp-servlane-gateway"


def gateway_env(objects: list[dict[str, Any]]) -> dict[str, str]:
    container = one(objects, "Deployment", GATEWAY)["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_console_is_on_by_default_without_trace_links(helm: Helm) -> None:
    env = gateway_env(helm.template())
    settings = parse_settings(["--watch"], env)
    assert settings.console_enabled
    assert settings.console_slow_seconds == 10
    assert "SERVLANE_GATEWAY_TRACE_URL_TEMPLATE" not in env


def test_console_values_reach_the_gateway(helm: Helm) -> None:
    template = "http://jaeger.observability:16686/trace/{trace_id}"
    values = (
        "gateway.console.enabled=false",
        "gateway.console.slowSeconds=2.5",
        f"tracing.traceUrlTemplate={template}",
    )
    settings = parse_settings(["--watch"], gateway_env(helm.template(set_values=values)))
    assert (settings.console_enabled, settings.console_slow_seconds) == (False, 2.5)
    assert settings.trace_url_template == template


def test_schema_refuses_a_trace_template_that_is_not_a_link_with_the_trace_id(helm: Helm) -> None:
    for bad in ("javascript:alert(1){trace_id}", "http://jaeger/trace/"):
        result = helm.run("template", "mp", str(CHART), "--set", f"tracing.traceUrlTemplate={bad}", check=False)
        assert result.returncode != 0
        assert "traceUrlTemplate" in result.stderr
