"""The autoscaling/v2 HorizontalPodAutoscaler, only when the replica range leaves room to scale."""

from __future__ import annotations

from typing import Any

from servlane_api.aimodel import AIModel, Autoscaling
from servlane_operator.builders.common import child_metadata
from servlane_operator.labels import child_name


def wants_hpa(model: AIModel) -> bool:
    scaling = model.spec.autoscaling
    return scaling is not None and scaling.max_replicas > scaling.min_replicas


def _metric(scaling: Autoscaling) -> dict[str, Any]:
    metric = scaling.metric
    if metric.type == "Pods":
        return {
            "type": "Pods",
            "pods": {
                "metric": {"name": metric.name},
                "target": {"type": "AverageValue", "averageValue": metric.target_average_value},
            },
        }
    return {
        "type": "Resource",
        "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": metric.target_utilization}},
    }


def build_hpa(model: AIModel) -> dict[str, Any] | None:
    """The HPA, or None when the model has a fixed replica count (then any old HPA must go)."""
    scaling = model.spec.autoscaling
    if scaling is None or not wants_hpa(model):
        return None
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": child_metadata(model),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": child_name(model.name)},
            "minReplicas": max(1, scaling.min_replicas),
            "maxReplicas": scaling.max_replicas,
            "metrics": [_metric(scaling)],
            # Model pods take minutes to load: scale up promptly, scale down slowly.
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": 0,
                    "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": 300,
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}],
                },
            },
        },
    }
