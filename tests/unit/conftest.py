from __future__ import annotations

import pytest

from servlane_operator.settings import OperatorSettings

GPU_IMAGE = "registry.local/servlane-runtime:test-cuda"
CPU_IMAGE = "registry.local/servlane-runtime:test-cpu"


@pytest.fixture
def settings() -> OperatorSettings:
    return OperatorSettings(
        runtime_image_gpu=GPU_IMAGE, runtime_image_cpu=CPU_IMAGE, gateway_namespace="servlane-system"
    )
