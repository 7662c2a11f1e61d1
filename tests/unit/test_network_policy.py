"""The AIModel's NetworkPolicy: only the gateway pods, and a configured metrics scraper, reach the serving port."""

from __future__ import annotations

from typing import Any

import pytest

from servlane_operator.builders import build_network_policy, plan_children
from servlane_operator.labels import GATEWAY_SELECTOR
from servlane_operator.settings import OperatorSettings
from tests.unit.conftest import make_model

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
    labels = policy(OperatorSettings())["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert ",".join(f"{k}={v}" for k, v in labels.items()) == GATEWAY_SELECTOR


def test_without_a_gateway_namespace_gateway_pods_of_any_namespace_are_admitted() -> None:
    (peer,) = policy(OperatorSettings())["spec"]["ingress"][0]["from"]
    assert peer == {"namespaceSelector": {}, "podSelector": GATEWAY_PODS}


def test_the_metrics_scraper_is_admitted_only_from_its_configured_namespace() -> None:
    settings = OperatorSettings(
        gateway_namespace="gw",
        metrics_scraper_namespace="monitoring",
        metrics_scraper_labels={"app.kubernetes.io/name": "prometheus"},
    )
    peers = policy(settings)["spec"]["ingress"][0]["from"]
    assert peers[1] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
    any_pod = policy(settings.model_copy(update={"metrics_scraper_labels": {}}))["spec"]["ingress"][0]["from"][1]
    assert any_pod["podSelector"] == {}
    assert any_pod["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}


def test_no_peer_ever_admits_the_whole_cluster() -> None:
    for settings in (
        OperatorSettings(),
        OperatorSettings(metrics_scraper_namespace="monitoring"),
        OperatorSettings(gateway_namespace="gw", metrics_scraper_namespace="monitoring"),
    ):
        for rule in policy(settings)["spec"]["ingress"]:
            assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
            for peer in rule["from"]:
                assert peer.get("podSelector") or peer.get("namespaceSelector"), peer


def test_switched_off_the_policy_is_not_built_and_an_old_one_is_deleted() -> None:
    settings = OperatorSettings(model_network_policy=False)
    model = make_model(SPEC)
    assert build_network_policy(model, settings) is None
    plan = plan_children(model, settings)
    assert "NetworkPolicy" not in [o["kind"] for o in plan.apply]
    assert ("networking.k8s.io/v1", "NetworkPolicy") in plan.delete
    assert ("networking.k8s.io/v1", "NetworkPolicy") not in plan_children(model, OperatorSettings()).delete


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


def test_a_fixed_budget_override_suspends_the_hpa_and_releasing_it_restores_it() -> None:
    model = make_model({**SPEC, "autoscaling": {"minReplicas": 2, "maxReplicas": 6}})
    settings = OperatorSettings()
    pinned = plan_children(model, settings, replicas_override=1)
    assert "HorizontalPodAutoscaler" not in [o["kind"] for o in pinned.apply]
    assert ("autoscaling/v2", "HorizontalPodAutoscaler") in pinned.delete
    assert pinned.apply[0]["spec"]["replicas"] == 1
    released = plan_children(model, settings, replicas_override=None)
    assert "HorizontalPodAutoscaler" in [o["kind"] for o in released.apply]
    assert "replicas" not in released.apply[0]["spec"]
