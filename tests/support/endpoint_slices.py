"""EndpointSlices of a model's Service, as the gateway watches them."""

from __future__ import annotations

from typing import Any

SERVICE_URL = "http://model-m.default.svc.cluster.local:8000/v1"


def endpoint_slice(pod: str, url: str, ready: bool = True, terminating: bool = False) -> dict[str, Any]:
    """One slice per pod: loopback stubs differ by port, and a slice has one port for all its endpoints.
    As the EndpointSlice controller writes them for the operator's Service `model-m`."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    labels = {
        "kubernetes.io/service-name": "model-m",
        "servlane.dev/model": "m",
        "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
    }
    owner = {"apiVersion": "v1", "kind": "Service", "name": "model-m", "uid": "u1", "controller": True}
    return {
        "metadata": {
            "name": f"model-m-{pod}",
            "namespace": "default",
            "labels": labels,
            "ownerReferences": [owner],
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": int(port), "protocol": "TCP"}],
        "endpoints": [
            {
                "addresses": [host],
                "conditions": {"ready": ready, "serving": ready or terminating, "terminating": terminating},
                "targetRef": {"kind": "Pod", "name": pod, "namespace": "default"},
            }
        ],
    }
