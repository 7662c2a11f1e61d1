"""The chart's every-toggle values (those that need no server of their own), installed on the real node by
e2e/test_real_helm_toggles.py and run in docker by tests/images/test_gateway_image.py."""

from __future__ import annotations

from typing import Any

from tests.support.real_pods import (
    NODE_SELECTOR,
)

RELEASE, SYSTEM, TEAM = "servlane-toggles", "servlane-toggles-system", "team-toggles"


ABSENT_COLLECTOR = "http://otel-collector.observability.svc.cluster.local:4318"  # no such Service


def toggles_values(key_digest: str) -> dict[str, Any]:
    """Every toggle that needs no server of its own (also run by tests/images/test_gateway_image.py)."""
    on_real_node = {"nodeSelector": NODE_SELECTOR}
    return {
        "operator": {"watchNamespaces": [TEAM], **on_real_node},
        "gateway": {
            "replicaCount": 1,
            "workers": 2,
            "service": {"type": "NodePort"},
            "podDisruptionBudget": {"enabled": False},
            "console": {"enabled": True},
            "apiKeys": {"entries": [{"name": "team-toggles", "key": key_digest}]},
            **on_real_node,
        },
        "tracing": {"enabled": True, "otlpEndpoint": ABSENT_COLLECTOR, "samplingRatio": 1.0},
        "networkPolicy": {"enabled": True},
    }
