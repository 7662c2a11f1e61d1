"""The gateway builds each AIModel's upstream from its name, namespace and cluster domain: the chart hands it the
same cluster domain as the operator, which names the Services (a cluster with another domain must not break it)."""

from __future__ import annotations

import pytest

from servlane_gateway.flags import parse_settings
from tests.support.helmtool import Helm, one

GATEWAY = "mp-servlane-gateway"


@pytest.mark.parametrize(
    ("set_values", "domain"), [((), "cluster.local"), (("operator.clusterDomain=corp.example",), "corp.example")]
)
def test_the_gateway_gets_the_operators_cluster_domain(helm: Helm, set_values: tuple[str, ...], domain: str) -> None:
    deployment = one(helm.template(set_values=set_values), "Deployment", GATEWAY)
    env = {e["name"]: e.get("value", "") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SERVLANE_GATEWAY_CLUSTER_DOMAIN"] == domain
    assert parse_settings(["--watch"], {"SERVLANE_GATEWAY_CLUSTER_DOMAIN": domain}).cluster_domain == domain
