"""The gateway is recognised by where it runs, never by its pod labels alone: any tenant can label its own pods.

The operator learns the gateway's namespace and, with Prometheus, the scrape job of the gateway; the chart's
NetworkPolicies refuse peers whose labels would count in every namespace."""

from __future__ import annotations

import pytest

from tests.support.chart import env_of
from tests.support.helmtool import CHART, MONITORING_API, Helm, find, one


def test_the_operator_gets_the_gateway_namespace_and_starts_with_it(helm: Helm) -> None:
    from servlane_operator.settings import OperatorSettings

    for set_values in ((), ("operator.modelNetworkPolicy.enabled=false",), ("operator.prometheusUrl=http://p:9090",)):
        env = env_of(one(helm.template(set_values=set_values, namespace="gw-ns"), "Deployment", "mp-servlane-operator"))
        settings = OperatorSettings.from_env(env)
        assert settings.gateway_namespace == "gw-ns"
        assert settings.unscoped_gateway_trust() is None  # the operator starts with what the chart gives it


def test_the_canary_queries_select_the_servicemonitors_job(helm: Helm) -> None:
    from servlane_operator.settings import OperatorSettings

    objects = helm.template(
        set_values=("monitoring.serviceMonitor.enabled=true", "operator.prometheusUrl=http://p:9090"),
        api_versions=(MONITORING_API,),
    )
    env = env_of(one(objects, "Deployment", "mp-servlane-operator"))
    # The Prometheus operator names a ServiceMonitor's job after the Service it selects (no jobLabel set):
    # the gateway's metrics Service, the only Service it selects.
    monitor = one(objects, "ServiceMonitor", "mp-servlane-gateway")
    assert "jobLabel" not in monitor["spec"]
    selected = [
        s
        for s in find(objects, "Service")
        if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert [s["metadata"]["name"] for s in selected] == ["mp-servlane-gateway-metrics"]
    assert OperatorSettings.from_env(env).prometheus_gateway_job == "mp-servlane-gateway-metrics"


def test_the_gateway_job_can_be_named_for_another_scrape_config(helm: Helm) -> None:
    from servlane_operator.settings import OperatorSettings

    objects = helm.template(set_values=("operator.prometheusGatewayJob=kubernetes-pods/servlane",))
    env = env_of(one(objects, "Deployment", "mp-servlane-operator"))
    assert OperatorSettings.from_env(env).prometheus_gateway_job == "kubernetes-pods/servlane"


@pytest.mark.parametrize("peers", ["gatewayFrom", "metricsFrom"])
def test_a_peer_whose_labels_count_in_every_namespace_fails_the_render(helm: Helm, peers: str) -> None:
    # namespaceSelector {} is every namespace: any tenant may put app=prometheus on a pod of its own.
    everywhere = '{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "prometheus"}}}'
    result = helm.run(
        "template", "mp", str(CHART), "--set", "networkPolicy.enabled=true",
        "--set-json", f"networkPolicy.{peers}=[{everywhere}]",
        check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert f"networkPolicy.{peers}: a peer with an empty namespaceSelector" in result.stderr


@pytest.mark.parametrize("peers", ["gatewayFrom", "metricsFrom"])
def test_peers_in_named_namespaces_or_the_release_namespace_render(helm: Helm, peers: str) -> None:
    named = '{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}'
    same_namespace = '{"podSelector": {"matchLabels": {"app": "prometheus"}}}'
    result = helm.run(
        "template", "mp", str(CHART), "--set", "networkPolicy.enabled=true",
        "--set-json", f"networkPolicy.{peers}=[{named}, {same_namespace}]",
    )  # fmt: skip
    assert "kind: NetworkPolicy" in result.stdout


def test_metrics_are_on_their_own_port_service_and_network_policy_rule(helm: Helm) -> None:
    """/metrics lists every namespace's traffic: its port is apart from the API's everywhere the chart
    names one, so the API's Service (maybe a LoadBalancer) never carries it and a NetworkPolicy admits the
    scrapers (and the operator) to it without admitting them to the API."""
    from servlane_operator.settings import OperatorSettings

    objects = helm.template(
        CHART / "ci" / "secured-values.yaml",
        set_values=("gateway.service.type=LoadBalancer", "gateway.metrics.port=9191"),
        api_versions=(MONITORING_API,),
    )
    gateway = one(objects, "Deployment", "mp-servlane-gateway")
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 8080, "metrics": 9191}
    assert env_of(gateway)["SERVLANE_GATEWAY_METRICS_PORT"] == "9191"
    api = one(objects, "Service", "mp-servlane-gateway")
    assert [p["targetPort"] for p in api["spec"]["ports"]] == ["http"]
    metrics = one(objects, "Service", "mp-servlane-gateway-metrics")
    assert metrics["spec"]["type"] == "ClusterIP"
    assert metrics["spec"]["ports"] == [{"name": "metrics", "port": 9191, "targetPort": "metrics", "protocol": "TCP"}]
    assert metrics["spec"]["selector"] == gateway["spec"]["selector"]["matchLabels"]
    operator_env = env_of(one(objects, "Deployment", "mp-servlane-operator"))
    assert OperatorSettings.from_env(operator_env).gateway_metrics_port == 9191  # the pods it scrapes
    api_rule, metrics_rule = one(objects, "NetworkPolicy", "mp-servlane-gateway")["spec"]["ingress"]
    assert api_rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert api_rule["from"] == [{"namespaceSelector": {"matchLabels": {"servlane.dev/clients": "true"}}}]
    assert metrics_rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    operator_pods = {
        "podSelector": {
            "matchLabels": one(objects, "Deployment", "mp-servlane-operator")["spec"]["selector"]["matchLabels"]
        }
    }
    assert metrics_rule["from"] == [
        operator_pods,
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
    ]


def test_the_metrics_port_cannot_be_the_api_port(helm: Helm) -> None:
    result = helm.run("template", "mp", str(CHART), "--set", "gateway.metrics.port=8080", check=False)
    assert result.returncode != 0
    assert "gateway.metrics.port must differ from gateway.port" in result.stderr
