"""LoRA adapters reach the pods through a ConfigMap, not the pod template, so changing them restarts nothing.

The ConfigMap `model-<name>` holds `adapters.json` (the runtime's adapters file, servlane_runtime.adapters)
and is mounted at ADAPTERS_DIR. The kubelet rewrites the mounted file when the ConfigMap changes (within
its sync period, about a minute by default) and the runtime loads and unloads adapters to match. Only a
pvc:// adapter on a claim that no other adapter uses yet changes the template: its volume is new.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from servlane_api.aimodel import Adapter, AIModel
from servlane_api.runtime_config import ADAPTER_PVC_DIR, ADAPTERS_DIR
from servlane_api.runtime_contract import serves_adapters
from servlane_operator.builders.common import child_metadata

ADAPTERS_KEY = "adapters.json"
ADAPTERS_VOLUME = "adapters"


def source_in_pod(adapter: Adapter) -> str:
    """Where the runtime finds the adapter: hf:// as is, a path as is, pvc://claim/path under its mount."""
    claim = adapter.pvc_claim
    if claim is None:
        return adapter.source
    path = adapter.source.removeprefix(f"pvc://{claim}").strip("/")
    return f"{ADAPTER_PVC_DIR}/{claim}/{path}".rstrip("/")


def build_adapters_config_map(model: AIModel) -> dict[str, Any] | None:
    if not serves_adapters(model):
        return None
    listed = [{"name": a.name, "source": source_in_pod(a)} for a in model.spec.adapters]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(model),
        "data": {ADAPTERS_KEY: json.dumps(listed, indent=1)},
    }


def adapter_volumes(model: AIModel) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ConfigMap's volume, and one read-only volume per PVC that adapters come from (sorted: stable)."""
    if not serves_adapters(model):
        return [], []
    name = child_metadata(model)["name"]
    volumes: list[dict[str, Any]] = [{"name": ADAPTERS_VOLUME, "configMap": {"name": name}}]
    mounts: list[dict[str, Any]] = [{"name": ADAPTERS_VOLUME, "mountPath": ADAPTERS_DIR, "readOnly": True}]
    for claim in sorted({a.pvc_claim for a in model.spec.adapters if a.pvc_claim is not None}):
        # A claim name can be 253 characters; a volume name only 63.
        volume = f"adapters-{hashlib.sha256(claim.encode()).hexdigest()[:12]}"
        volumes.append({"name": volume, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": volume, "mountPath": f"{ADAPTER_PVC_DIR}/{claim}", "readOnly": True})
    return volumes, mounts
