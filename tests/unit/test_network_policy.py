"""The AIModel's NetworkPolicy: only the gateway pods reach the serving port, and a configured metrics scraper
the metrics port only."""

from __future__ import annotations

import json
from typing import Any

import pytest

from servlane_api.runtime_config import ENV_VAR
from servlane_operator.builders import build_network_policy, plan_children
from servlane_operator.labels import GATEWAY_SELECTOR
from servlane_operator.main import main as operator_main
from servlane_operator.settings import OperatorSettings
from tests.support.aimodels import make_model

SPEC: dict[str, Any] = {"source": {"uri": "/models/tiny"}, "engine": "transformers", "resources": {"cpu": "2"}}
GATEWAY_PODS = {"matchLabels": {"app.kubernetes.io/component": "gateway", "app.kubernetes.io/part-of": "servlane"}}


def policy(settings: OperatorSettings) -> dict[str, Any]:
    built = build_network_policy(make_model(SPEC, name="llama", namespace="team-a"), settings)
    assert built is not None
    return built


def test_only_the_gateway_in_its_namespace_reaches_the_serving_port() -> None:
    built = policy(OperatorSettings(gateway_namespace="servlane-system"))
    assert built["metadata"]["name"] == "model-llama"
    assert built["metadata"]["namespace"] == "team-a"
    (owner,) = built["metadata"]["ownerReferences"]  # owned by the AIModel: garbage-collected with it
    assert (owner["kind"], owner["name"], owner["controller"]) == ("AIModel", "llama", True)
    spec = built["spec"]
    assert spec["podSelector"] == {"matchLabels": {"servlane.dev/model": "llama"}}
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["ingress"] == [
        {
            "from": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "servlane-system"}},
                    "podSelector": GATEWAY_PODS,
                }
            ],
            "ports": [{"port": "http", "protocol": "TCP"}],
        }
    ]


def test_the_gateway_labels_are_the_ones_the_operator_finds_gateway_pods_by() -> None:
    (peer,) = policy(OperatorSettings(gateway_namespace="gw"))["spec"]["ingress"][0]["from"]
    labels = peer["podSelector"]["matchLabels"]
    assert ",".join(f"{k}={v}" for k, v in labels.items()) == GATEWAY_SELECTOR


def test_without_a_gateway_namespace_no_policy_trusts_the_gateway_labels_of_any_namespace() -> None:
    # A tenant can put the gateway's labels on its own pods: only the gateway's namespace makes them mean it.
    for settings in (OperatorSettings(), OperatorSettings(metrics_scraper_namespace="monitoring")):
        with pytest.raises(ValueError, match="SERVLANE_GATEWAY_NAMESPACE"):
            policy(settings)
        with pytest.raises(ValueError, match="SERVLANE_GATEWAY_NAMESPACE"):
            plan_children(make_model(SPEC), settings)


@pytest.mark.parametrize(
    ("settings", "refused"),
    [
        (OperatorSettings(), True),  # policies and the canary's pod scrape would both trust labels
        (OperatorSettings(model_network_policy=False), True),  # the canary scrape finds gateway pods by label
        (OperatorSettings(model_network_policy=False, prometheus_url="http://prometheus:9090"), False),
        (OperatorSettings(model_network_policy=False, gateway_metrics_urls=["http://gw:8080/metrics"]), False),
        (OperatorSettings(prometheus_url="http://prometheus:9090"), True),
        (OperatorSettings(gateway_namespace="servlane-system"), False),
    ],
)
def test_settings_that_trust_the_gateway_labels_everywhere_are_named(settings: OperatorSettings, refused: bool) -> None:
    problem = settings.unscoped_gateway_trust()
    assert (problem is not None) is refused
    if problem is not None:
        assert "SERVLANE_GATEWAY_NAMESPACE" in problem


def test_the_operator_refuses_to_start_without_a_gateway_namespace(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("SERVLANE_GATEWAY_NAMESPACE", "SERVLANE_PROMETHEUS_URL", "SERVLANE_GATEWAY_METRICS_URLS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SERVLANE_MODEL_NETWORK_POLICY", "true")
    assert operator_main([]) == 2
    assert "SERVLANE_GATEWAY_NAMESPACE (the gateway's namespace) is required" in capsys.readouterr().err


def test_the_metrics_scraper_is_admitted_only_from_its_configured_namespace_and_only_to_the_metrics_port() -> None:
    settings = OperatorSettings(
        gateway_namespace="gw",
        metrics_scraper_namespace="monitoring",
        metrics_scraper_labels={"app.kubernetes.io/name": "prometheus"},
    )
    api, metrics = policy(settings)["spec"]["ingress"]
    # The gateway calls the API and reads no metrics; the scraper reads /metrics and cannot call the model.
    assert api == {
        "from": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gw"}}, "podSelector": GATEWAY_PODS}
        ],
        "ports": [{"port": "http", "protocol": "TCP"}],
    }
    assert metrics == {
        "from": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
            }
        ],
        "ports": [{"port": "metrics", "protocol": "TCP"}],
    }
    any_pod = policy(settings.model_copy(update={"metrics_scraper_labels": {}}))["spec"]["ingress"][1]["from"][0]
    assert any_pod["podSelector"] == {}
    assert any_pod["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}


def test_the_operator_reads_the_metrics_port_from_its_own_namespace_only() -> None:
    """Its autoscaler reads the engine's signals there; it is never admitted to the API port."""
    settings = OperatorSettings(gateway_namespace="gw", operator_namespace="servlane-system")
    api, metrics = policy(settings)["spec"]["ingress"]
    assert [peer["podSelector"] for peer in api["from"]] == [GATEWAY_PODS]
    assert metrics == {
        "from": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "servlane-system"}},
                "podSelector": {
                    "matchLabels": {"app.kubernetes.io/component": "operator", "app.kubernetes.io/part-of": "servlane"}
                },
            }
        ],
        "ports": [{"port": "metrics", "protocol": "TCP"}],
    }
    both = policy(settings.model_copy(update={"metrics_scraper_namespace": "monitoring"}))["spec"]["ingress"][1]
    assert len(both["from"]) == 2
    assert OperatorSettings.from_env({"SERVLANE_OPERATOR_NAMESPACE": "ops"}).operator_namespace == "ops"


def test_the_policy_ports_are_the_runtime_containers_named_ports() -> None:
    settings = OperatorSettings(gateway_namespace="gw", metrics_scraper_namespace="monitoring")
    model = make_model(SPEC, name="llama", namespace="team-a")
    (deployment,) = [o for o in plan_children(model, settings).apply if o["kind"] == "Deployment"]
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "runtime"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    config = json.loads(next(e["value"] for e in container["env"] if e["name"] == ENV_VAR))
    assert named == {"http": config["port"], "metrics": config["metrics_port"]}
    assert named["http"] != named["metrics"]
    ports = [port["port"] for rule in policy(settings)["spec"]["ingress"] for port in rule["ports"]]
    assert ports == ["http", "metrics"]


def test_no_peer_ever_admits_the_whole_cluster() -> None:
    for settings in (
        OperatorSettings(gateway_namespace="gw"),
        OperatorSettings(gateway_namespace="gw", metrics_scraper_namespace="monitoring"),
    ):
        for rule in policy(settings)["spec"]["ingress"]:
            (port,) = rule["ports"]  # one port per rule, never all of them
            assert port in ({"port": "http", "protocol": "TCP"}, {"port": "metrics", "protocol": "TCP"})
            assert rule["from"]  # an empty `from` would admit every source
            for peer in rule["from"]:
                # Every peer is pinned to one named namespace: labels alone can be worn by anyone's pod.
                assert list(peer["namespaceSelector"]["matchLabels"]) == ["kubernetes.io/metadata.name"], peer


def test_switched_off_the_policy_is_not_built_and_an_old_one_is_deleted() -> None:
    settings = OperatorSettings(model_network_policy=False)
    model = make_model(SPEC)
    assert build_network_policy(model, settings) is None
    plan = plan_children(model, settings)
    assert "NetworkPolicy" not in [o["kind"] for o in plan.apply]
    assert ("networking.k8s.io/v1", "NetworkPolicy") in plan.delete
    kept = plan_children(model, OperatorSettings(gateway_namespace="gw"))
    assert ("networking.k8s.io/v1", "NetworkPolicy") not in kept.delete


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, (True, None, {})),
        ({"SERVLANE_MODEL_NETWORK_POLICY": "false"}, (False, None, {})),
        (
            {"SERVLANE_METRICS_SCRAPER_NAMESPACE": "monitoring", "SERVLANE_METRICS_SCRAPER_LABELS": "a=b, c=d"},
            (True, "monitoring", {"a": "b", "c": "d"}),
        ),
    ],
)
def test_settings_from_the_environment(env: dict[str, str], expected: tuple[bool, str | None, dict[str, str]]) -> None:
    s = OperatorSettings.from_env(env)
    assert (s.model_network_policy, s.metrics_scraper_namespace, s.metrics_scraper_labels) == expected


@pytest.mark.parametrize("labels", ["a", "a!=b", "=b", "a=b=c", "a in (b)"])
def test_a_scraper_selector_that_is_not_plain_equalities_is_refused(labels: str) -> None:
    with pytest.raises(ValueError, match="key=value"):
        OperatorSettings.from_env({"SERVLANE_METRICS_SCRAPER_LABELS": labels})


def test_a_fixed_budget_override_wins_over_the_autoscaler_and_releasing_it_restores_its_count() -> None:
    model = make_model({**SPEC, "autoscaling": {"minReplicas": 2, "maxReplicas": 6}})
    settings = OperatorSettings(gateway_namespace="gw")
    pinned = plan_children(model, settings, replicas_override=1)
    assert pinned.apply[0]["spec"]["replicas"] == 1
    released = plan_children(model, settings, replicas_override=None)
    assert released.apply[0]["spec"]["replicas"] == 2
