from __future__ import annotations

from typing import Any

import pytest

from modelplane_api.aimodel import AIModel
from modelplane_operator.settings import OperatorSettings


def make_model(spec: dict[str, Any], name: str = "llama", namespace: str = "team-a", **status: Any) -> AIModel:
    body = {
        "apiVersion": "modelplane.dev/v1alpha1",
        "kind": "AIModel",
        "metadata": {"name": name, "namespace": namespace, "uid": "uid-123", "generation": 3},
        "spec": spec,
        "status": status,
    }
    return AIModel.model_validate(body)


@pytest.fixture
def settings() -> OperatorSettings:
    return OperatorSettings(runtime_image="registry.local/modelplane-runtime:test")
