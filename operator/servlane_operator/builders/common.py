"""Metadata shared by every child object of an AIModel."""

from __future__ import annotations

from typing import Any

from servlane_api.aimodel import AIModel
from servlane_operator.labels import child_name, model_labels


def owner_reference(model: AIModel) -> dict[str, Any]:
    """Makes the AIModel the controller of a child, so deleting it garbage-collects the child."""
    return {
        "apiVersion": model.api_version,
        "kind": model.kind,
        "name": model.name,
        "uid": model.metadata["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(model: AIModel) -> dict[str, Any]:
    return {
        "name": child_name(model.name),
        "namespace": model.namespace,
        "labels": model_labels(model.name, model.spec.engine.value),
        "ownerReferences": [owner_reference(model)],
    }
