"""The fake nodes KWOK manages: a GPU pool of two 8-GPU nodes (tainted like real GPU pools) and a CPU node."""

from __future__ import annotations

from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"


def _node(name: str, *, cpu: str, memory: str, gpus: int, labels: dict[str, str]) -> dict[str, Any]:
    capacity = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "500Gi"}
    taints = []
    if gpus:
        capacity[GPU_RESOURCE] = str(gpus)
        taints.append({"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **labels,
            },
        },
        "spec": {"taints": taints} if taints else {},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "fake"},
        },
    }


def cpu_nodes(count: int, start: int = 2) -> list[dict[str, Any]]:
    """Extra CPU-only nodes, for scale runs that need room for many pods (110 per node)."""
    return [
        _node(f"cpu-node-{i}", cpu="16", memory="64Gi", gpus=0, labels={"node-pool": "cpu"})
        for i in range(start, start + count)
    ]


FAKE_NODES = [
    _node(
        "gpu-node-1",
        cpu="64",
        memory="512Gi",
        gpus=8,
        labels={"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    ),
    _node(
        "gpu-node-2",
        cpu="64",
        memory="512Gi",
        gpus=8,
        labels={"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    ),
    _node("cpu-node-1", cpu="16", memory="64Gi", gpus=0, labels={"node-pool": "cpu"}),
]
