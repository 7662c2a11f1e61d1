"""The ClusterIP Service in front of an AIModel's pods."""

from __future__ import annotations

from typing import Any

from servlane_api.aimodel import AIModel
from servlane_api.children import service_api_url
from servlane_api.runtime_config import DEFAULT_PORT
from servlane_operator.builders.common import child_metadata
from servlane_operator.labels import selector_labels


def build_service(model: AIModel) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(model),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(model.name),
            "ports": [{"name": "http", "port": DEFAULT_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def endpoint_url(model: AIModel, cluster_domain: str) -> str:
    """In-cluster base URL of the model's OpenAI API."""
    return service_api_url(model.name, model.namespace, cluster_domain)
