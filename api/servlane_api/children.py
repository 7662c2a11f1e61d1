"""Names of an AIModel's children, and the in-cluster URL of its Service: one rule, read by the operator
(which creates them) and the gateway (which calls them).

The gateway builds a backend's URL from this rule, never from AIModel.status.endpoint: the status is
writable by anyone who may patch `aimodels/status`, and a URL taken from it could send one team's callers
to another team's pods, or to any address in the cluster. From the AIModel's own name and namespace, the
URL can only ever name that AIModel's own Service.
"""

from __future__ import annotations

from servlane_api.runtime_config import DEFAULT_PORT

CHILD_PREFIX = "model-"
DEFAULT_CLUSTER_DOMAIN = "cluster.local"


def child_name(model_name: str) -> str:
    """Name of an AIModel's Deployment, Service and HPA (prefixed so they never take over a user's object)."""
    return CHILD_PREFIX + model_name


def service_base_url(model_name: str, namespace: str, cluster_domain: str = DEFAULT_CLUSTER_DOMAIN) -> str:
    """In-cluster base URL of the AIModel's Service, without the OpenAI `/v1` (what the gateway proxies to)."""
    return f"http://{child_name(model_name)}.{namespace}.svc.{cluster_domain}:{DEFAULT_PORT}"


def service_api_url(model_name: str, namespace: str, cluster_domain: str = DEFAULT_CLUSTER_DOMAIN) -> str:
    """In-cluster base URL of the AIModel's OpenAI API (what the operator writes into status.endpoint)."""
    return service_base_url(model_name, namespace, cluster_domain) + "/v1"
