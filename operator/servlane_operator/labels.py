"""Labels and names shared by builders, watches and the gateway."""

from __future__ import annotations

# The naming rule lives in servlane_api.children: the gateway builds its upstreams from it too.
from servlane_api.children import CHILD_PREFIX as CHILD_PREFIX
from servlane_api.children import child_name as child_name

MODEL_LABEL = "servlane.dev/model"
MANAGED_BY = "app.kubernetes.io/managed-by"
OPERATOR_NAME = "servlane-operator"
FIELD_MANAGER = "servlane-operator"
# Keeps a Deployment's replicas while its HPA takes them over (see builders/replicas_handover.py).
REPLICAS_HANDOVER_MANAGER = "servlane-operator-replicas-handover"
# A hash of the pod template as the operator built it, on the Deployment and on each pod it makes: a pod whose
# hash is the Deployment's runs its current template, whatever generation the Deployment controller has seen.
TEMPLATE_HASH_ANNOTATION = "servlane.dev/template-hash"


def selector_labels(model_name: str) -> dict[str, str]:
    """Immutable Deployment selector: nothing version-dependent."""
    return {MODEL_LABEL: model_name}


def model_labels(model_name: str, engine: str) -> dict[str, str]:
    # No app.kubernetes.io/instance: Argo CD's label tracking reads it as the owning Application's name.
    return {
        **selector_labels(model_name),
        "app.kubernetes.io/name": "aimodel",
        "app.kubernetes.io/component": "model-server",
        "app.kubernetes.io/part-of": "servlane",
        MANAGED_BY: OPERATOR_NAME,
        "servlane.dev/engine": engine,
    }


# The gateway pods (the chart's labels): found by them when canary metrics are scraped without Prometheus,
# and admitted by them to the model pods (builders/network_policy.py).
GATEWAY_LABELS = {"app.kubernetes.io/component": "gateway", "app.kubernetes.io/part-of": "servlane"}
GATEWAY_SELECTOR = ",".join(f"{key}={value}" for key, value in GATEWAY_LABELS.items())
