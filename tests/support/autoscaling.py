"""The autoscaler under test: a metrics scraper on a fake transport, an AIModel body, a live Deployment, and kopf's
events silenced."""

from __future__ import annotations

from typing import Any

import httpx
import kopf
import pytest

from servlane_operator.autoscaler import (
    Autoscaler,
    ReadyPod,
)
from servlane_operator.observed import DeploymentView

NS, NAME = "team-a", "llama"
IDLE_METRICS = """\
servlane_runtime_in_flight 0
servlane_runtime_queue_depth 0
servlane_runtime_requests_total{code="200",endpoint="/v1/chat/completions"} 9.0
"""


def pod(name: str = "p1") -> ReadyPod:
    return ReadyPod(name=name, ip="10.0.0.1")


def scraper(handler: Any) -> Autoscaler:
    return Autoscaler(client=httpx.AsyncClient(transport=httpx.MockTransport(handler)), clock=lambda: 1_000_000.0)


def model_body(spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "servlane.dev/v1alpha1",
        "kind": "AIModel",
        "metadata": {"name": NAME, "namespace": NS, "uid": "uid-1", "generation": 1},
        "spec": {"source": {"uri": "/models/tiny"}, "engine": "transformers", **spec},
        "status": {"observedGeneration": 1, **(status or {})},
    }


def live_deployment(replicas: int) -> DeploymentView:
    return DeploymentView(
        generation=1,
        observed_generation=1,
        desired=replicas,
        replicas=replicas,
        ready=replicas,
        updated=replicas,
        available=replicas,
        deadline_exceeded=False,
    )


@pytest.fixture
def quiet_events(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("event", "info", "warn"):
        monkeypatch.setattr(kopf, name, lambda *_args, **_kw: None)
