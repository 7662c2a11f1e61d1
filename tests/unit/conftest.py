from __future__ import annotations

from typing import Any

import pytest

from servlane_api.aimodel import AIModel
from servlane_operator.settings import OperatorSettings

GPU_IMAGE = "registry.local/servlane-runtime:test-cuda"
CPU_IMAGE = "registry.local/servlane-runtime:test-cpu"


def make_model(spec: dict[str, Any], name: str = "llama", namespace: str = "team-a", **status: Any) -> AIModel:
    body = {
        "apiVersion": "servlane.dev/v1alpha1",
        "kind": "AIModel",
        "metadata": {"name": name, "namespace": namespace, "uid": "uid-123", "generation": 3},
        "spec": spec,
        "status": status,
    }
    return AIModel.model_validate(body)


@pytest.fixture
def settings() -> OperatorSettings:
    return OperatorSettings(
        runtime_image_gpu=GPU_IMAGE, runtime_image_cpu=CPU_IMAGE, gateway_namespace="servlane-system"
    )
