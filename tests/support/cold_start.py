"""A pod and its events at each step of a cold start (scheduled, pulled, started) and the runtime's startup times."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from servlane_api.cold_start import RuntimeStartup

T0 = 1_800_000_000.0  # the pod's creation, a whole second as Kubernetes keeps it


def stamp(offset: float) -> str:
    return datetime.fromtimestamp(T0 + offset, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(
    name: str = "model-tiny-abc", *, ready: float | None = 14, uid: str = "uid-1", ip: str = "10.0.0.7"
) -> dict[str, Any]:
    conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(1)}]
    if ready is not None:
        conditions.append({"type": "Ready", "status": "True", "lastTransitionTime": stamp(ready)})
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": uid,
            "creationTimestamp": stamp(0),
            "labels": {"servlane.dev/model": "tiny", "app.kubernetes.io/managed-by": "servlane-operator"},
        },
        "status": {
            "podIP": ip,
            "conditions": conditions,
            "containerStatuses": [{"name": "runtime", "state": {"running": {"startedAt": stamp(3)}}}],
        },
    }


def pulled(at: float, *, uid: str = "uid-1", field: str = "spec.containers{runtime}") -> dict[str, Any]:
    return {
        "reason": "Pulled",
        "message": 'Container image "ghcr.io/servlane/runtime:0.1.0-cpu" already present on machine',
        "involvedObject": {"kind": "Pod", "uid": uid, "fieldPath": field},
        "lastTimestamp": stamp(at),
    }


STARTUP = RuntimeStartup(
    phases={
        "process_start": T0 + 3.2,
        "imports_done": T0 + 4.7,
        "weights_fetched": T0 + 4.8,
        "engine_loaded": T0 + 9.0,
        "ready": T0 + 9.5,
        "first_token": T0 + 20.25,
    }
)
