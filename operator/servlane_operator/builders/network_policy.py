"""The NetworkPolicy that lets only the gateway (and the metrics scraper) reach an AIModel's pods.

Model pods serve an unauthenticated OpenAI API: the gateway is where API keys, rate limits and request
limits are enforced, so nothing else in the cluster may call the pods directly. The runtime serves its
/metrics on the same port, so the scraper, once admitted, could call the API too; that is why it is
admitted only by an explicit namespace (settings.metrics_scraper_namespace), never cluster-wide; and
the gateway pods only in their namespace (settings.gateway_namespace), never by their labels alone.

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


def _namespace(name: str) -> dict[str, Any]:
    return {"matchLabels": {NAMESPACE_NAME_LABEL: name}}


def policy_peers(settings: OperatorSettings) -> list[dict[str, Any]]:
    """Who may reach the serving port: the gateway pods, and the metrics scraper when one is configured.

    Raises ValueError without settings.gateway_namespace: labels alone can be worn by any tenant's pod, so
    the gateway is only ever recognised by its labels within its own namespace (the operator also refuses
    to start so, OperatorSettings.unscoped_gateway_trust)."""
    if not settings.gateway_namespace:
        raise ValueError(
            "no gateway namespace (SERVLANE_GATEWAY_NAMESPACE): refusing a NetworkPolicy that would admit pods "
            "with the gateway's labels from every namespace"
        )
    peers: list[dict[str, Any]] = [
        {
            "namespaceSelector": _namespace(settings.gateway_namespace),
            "podSelector": {"matchLabels": dict(GATEWAY_LABELS)},
        }
    ]
    if settings.metrics_scraper_namespace:
        scraper_pods = {"matchLabels": dict(settings.metrics_scraper_labels)} if settings.metrics_scraper_labels else {}
        peers.append({"namespaceSelector": _namespace(settings.metrics_scraper_namespace), "podSelector": scraper_pods})
    return peers


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
            # Only the serving port (named as in the pod template) is listed: with policyTypes Ingress,
            # every other port and every other peer is denied.
            "ingress": [{"from": policy_peers(settings), "ports": [{"port": "http", "protocol": "TCP"}]}],
        },
    }
