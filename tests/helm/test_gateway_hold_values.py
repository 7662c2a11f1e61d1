"""`gateway.hold` of the chart: the bounds of requests held for a model with no ready pod reach the gateway's
settings, the schema refuses nonsense, and the pod knows its own name (the demand Leases' holder)."""

from __future__ import annotations

import pytest

from tests.support.chart import containers, env_of
from tests.support.helmtool import CHART, Helm, one

GATEWAY = "mp-servlane-gateway"


def test_the_hold_settings_reach_the_gateway_with_their_defaults_and_as_set(helm: Helm) -> None:
    from servlane_gateway.flags import parse_settings

    defaults = parse_settings(["--watch"], env_of(one(helm.template(), "Deployment", GATEWAY)))
    assert (defaults.hold_max_per_model, defaults.hold_max_per_namespace) == (100, 200)
    assert (defaults.hold_max_wait_seconds, defaults.hold_keep_alive_seconds) == (300, 10)
    values = (
        "gateway.hold.maxPerModel=7",
        "gateway.hold.maxPerNamespace=9",
        "gateway.hold.maxWaitSeconds=42",
        "gateway.hold.keepAliveSeconds=3",
    )
    settings = parse_settings(["--watch"], env_of(one(helm.template(set_values=values), "Deployment", GATEWAY)))
    assert (settings.hold_max_per_model, settings.hold_max_per_namespace) == (7, 9)
    assert (settings.hold_max_wait_seconds, settings.hold_keep_alive_seconds) == (42, 3)


def test_the_gateway_pod_gets_its_own_name_for_the_demand_leases(helm: Helm) -> None:
    container = containers(one(helm.template(), "Deployment", GATEWAY))[0]
    pod_name = next(e for e in container["env"] if e["name"] == "POD_NAME")
    assert pod_name["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


@pytest.mark.parametrize(
    ("setting", "where"),
    [
        ("gateway.hold.maxPerModel=-1", "/gateway/hold/maxPerModel"),
        ("gateway.hold.maxPerNamespace=1.5", "/gateway/hold/maxPerNamespace"),
        ("gateway.hold.maxWaitSeconds=0", "/gateway/hold/maxWaitSeconds"),
        ("gateway.hold.keepAliveSeconds=301", "/gateway/hold/keepAliveSeconds"),
        ("gateway.hold.maxQueue=5", "/gateway/hold"),
    ],
)
def test_the_schema_refuses_bad_hold_settings(helm: Helm, setting: str, where: str) -> None:
    result = helm.run("template", "mp", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0
    assert f"at '{where}'" in result.stderr
