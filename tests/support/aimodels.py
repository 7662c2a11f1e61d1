"""An AIModel object as the API server would hand it to the operator (name, namespace, uid, generation)."""

from __future__ import annotations

from typing import Any

from servlane_api.aimodel import AIModel


def make_model(spec: dict[str, Any], name: str = "llama", namespace: str = "team-a", **status: Any) -> AIModel:
    body = {
        "apiVersion": "servlane.dev/v1alpha1",
        "kind": "AIModel",
        "metadata": {"name": name, "namespace": namespace, "uid": "uid-123", "generation": 3},
        "spec": spec,
        "status": status,
    }
    return AIModel.model_validate(body)
