"""The model pods' PodMonitor: only when asked and only where the Prometheus operator's API is served; it
selects the operator's model pods on their metrics port, in the namespaces the operator serves."""

from __future__ import annotations

from typing import Any

from tests.support.helmtool import MONITORING_API, Helm, find, one

ON = ("monitoring.modelPodMonitor.enabled=true",)


def model_monitors(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return find(objects, "PodMonitor", "mp-servlane-operator-models")


def test_rendered_only_when_asked_and_the_prometheus_operator_api_exists(helm: Helm) -> None:
    assert not model_monitors(helm.template(api_versions=(MONITORING_API,)))
    assert not model_monitors(helm.template(set_values=ON))
    assert len(model_monitors(helm.template(set_values=ON, api_versions=(MONITORING_API,)))) == 1


def test_it_selects_the_model_pods_metrics_port_and_keeps_their_namespace(helm: Helm) -> None:
    objects = helm.template(set_values=ON, api_versions=(MONITORING_API,))
    monitor = one(objects, "PodMonitor", "mp-servlane-operator-models")
    spec = monitor["spec"]
    # The labels every model pod carries (servlane_operator.labels.model_labels).
    assert spec["selector"]["matchLabels"] == {
        "app.kubernetes.io/component": "model-server",
        "app.kubernetes.io/part-of": "servlane",
        "app.kubernetes.io/managed-by": "servlane-operator",
    }
    (endpoint,) = spec["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["honorLabels"]) == ("metrics", "/metrics", False)
    assert spec["namespaceSelector"] == {"any": True}
    scoped = helm.template(set_values=(*ON, "operator.watchNamespaces={team-a,team-b}"), api_versions=(MONITORING_API,))
    assert one(scoped, "PodMonitor", "mp-servlane-operator-models")["spec"]["namespaceSelector"] == {
        "matchNames": ["team-a", "team-b"]
    }


def test_the_model_pods_labels_are_the_ones_selected() -> None:
    from servlane_operator.labels import model_labels

    labels = model_labels("m", "vllm")
    assert labels["app.kubernetes.io/component"] == "model-server"
    assert labels["app.kubernetes.io/part-of"] == "servlane"
    assert labels["app.kubernetes.io/managed-by"] == "servlane-operator"
