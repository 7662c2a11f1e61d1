"""A model scaled to zero that is waking, and the gateway's held-requests metric."""

from __future__ import annotations

from typing import Any

from tests.support.gateway_harness import aimodel

HELD = "servlane_gateway_requests_held"


def waking_model(name: str, url: str, namespace: str = "default", phase: str = "Pending") -> dict[str, Any]:
    """An AIModel scaled to zero (phase Pending, not Ready) whose pods come up at `url`."""
    obj = aimodel(name, url + "/v1", ready=False)
    obj["metadata"]["namespace"] = namespace
    obj["status"]["phase"] = phase
    obj["spec"]["autoscaling"] = {"minReplicas": 0, "maxReplicas": 2}
    return obj
