"""Handing a Deployment's replicas from the operator to its HPA without a dip.

Server-side apply deletes a field when its only applier stops sending it. When a fixed-GPU-budget pin is
released (or autoscaling is switched on), the operator's Deployment stops carrying spec.replicas so the
HPA can own it; applied as is, the API server would reset replicas to 1 (killing pods that then reload
their weights) until the HPA raised it again. Kubernetes documents the cure ("Transferring ownership"
in the server-side apply docs): a second field manager first applies the current count, so the field
survives the operator's release and the HPA changes it from there.
"""

from __future__ import annotations

from typing import Any

from servlane_operator.labels import FIELD_MANAGER


def replicas_handover(
    desired: dict[str, Any], live_replicas: int, live_appliers: frozenset[str]
) -> dict[str, Any] | None:
    """The apply body that keeps `live_replicas` under the handover manager, or None when none is needed:
    the desired Deployment still sets replicas, or the operator does not own them (nothing would drop)."""
    if "replicas" in desired.get("spec", {}) or FIELD_MANAGER not in live_appliers:
        return None
    meta = desired["metadata"]
    return {
        "apiVersion": desired["apiVersion"],
        "kind": desired["kind"],
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "spec": {"replicas": live_replicas},
    }
