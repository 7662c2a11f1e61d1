"""The NetworkPolicy that lets only the gateway (and the metrics scraper) reach an AIModel's pods, each on its port.

Model pods serve an unauthenticated OpenAI API: the gateway is where API keys, rate limits and request
limits are enforced, so nothing else in the cluster may call the pods directly. Each peer is admitted on
its own port only: the gateway pods on the API port (`http`), the scraper and the operator (whose
autoscaler reads the engine's signals there) on the runtime's metrics port (`metrics`, which serves
/metrics and nothing else), so neither can call the model and the gateway cannot read the metrics.
Each is pinned to a namespace: the scraper's explicit one (settings.metrics_scraper_namespace), never
cluster-wide, the gateway pods' own (settings.gateway_namespace) and the operator's own
(settings.operator_namespace), never their labels alone.

Ingress only: egress (model downloads from hubs or object stores) differs too much between clusters.
The kubelet's probes come from the node, which CNIs admit regardless of NetworkPolicies.
"""

from __future__ import annotations

from typing import Any

from servlane_api.aimodel import AIModel
from servlane_operator.builders.common import child_metadata
from servlane_operator.labels import GATEWAY_LABELS, selector_labels
from servlane_operator.settings import OperatorSettings

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set on every namespace by the API server
# The chart's operator pods (its component labels), admitted in the operator's own namespace only.
OPERATOR_LABELS = {"app.kubernetes.io/component": "operator", "app.kubernetes.io/part-of": "servlane"}


def _namespace(name: str) -> dict[str, Any]:
    return {"matchLabels": {NAMESPACE_NAME_LABEL: name}}


def gateway_peer(settings: OperatorSettings) -> dict[str, Any]:
    """The gateway pods, the only callers of the API port.

    Raises ValueError without settings.gateway_namespace: labels alone can be worn by any tenant's pod, so
    the gateway is only ever recognised by its labels within its own namespace (the operator also refuses
    to start so, OperatorSettings.unscoped_gateway_trust)."""
    if not settings.gateway_namespace:
        raise ValueError(
            "no gateway namespace (SERVLANE_GATEWAY_NAMESPACE): refusing a NetworkPolicy that would admit pods "
            "with the gateway's labels from every namespace"
        )
    return {
        "namespaceSelector": _namespace(settings.gateway_namespace),
        "podSelector": {"matchLabels": dict(GATEWAY_LABELS)},
    }


def scraper_peer(settings: OperatorSettings) -> dict[str, Any] | None:
    """Whatever scrapes the metrics port, when one is configured."""
    if not settings.metrics_scraper_namespace:
        return None
    scraper_pods = {"matchLabels": dict(settings.metrics_scraper_labels)} if settings.metrics_scraper_labels else {}
    return {"namespaceSelector": _namespace(settings.metrics_scraper_namespace), "podSelector": scraper_pods}


def operator_peer(settings: OperatorSettings) -> dict[str, Any] | None:
    """The operator's pods, whose autoscaler reads the metrics port, when their namespace is known."""
    if not settings.operator_namespace:
        return None
    return {
        "namespaceSelector": _namespace(settings.operator_namespace),
        "podSelector": {"matchLabels": OPERATOR_LABELS},
    }


def ingress_rules(settings: OperatorSettings) -> list[dict[str, Any]]:
    """One rule per port, each naming the peers that need it (ports named as in the pod template)."""
    rules = [{"from": [gateway_peer(settings)], "ports": [{"port": "http", "protocol": "TCP"}]}]
    readers = [peer for peer in (scraper_peer(settings), operator_peer(settings)) if peer is not None]
    if readers:
        rules.append({"from": readers, "ports": [{"port": "metrics", "protocol": "TCP"}]})
    return rules


def build_network_policy(model: AIModel, settings: OperatorSettings) -> dict[str, Any] | None:
    """The AIModel's NetworkPolicy, or None when settings.model_network_policy is off (then any old one goes)."""
    if not settings.model_network_policy:
        return None
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(model),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(model.name)},
            "policyTypes": ["Ingress"],
            # With policyTypes Ingress, every port and every peer not listed is denied.
            "ingress": ingress_rules(settings),
        },
    }
