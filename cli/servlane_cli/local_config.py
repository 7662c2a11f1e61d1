"""An AIModel as one local runtime process: the operator's own RuntimeConfig mapping, then local overrides.

`build_runtime_config` (servlane_api.runtime_contract) is what the operator writes into each pod, so a
manifest means the same engine, task and options here as in a cluster. Only where the process runs
changes (loopback port, a user cache folder); fields that only a cluster can honour are named in a
warning and otherwise ignored.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from servlane_api.aimodel import AIModel, SourceKind
from servlane_api.runtime_config import RuntimeConfig
from servlane_api.runtime_contract import build_runtime_config

# AIModelSpec fields that shape pods, not the runtime: meaningless for one local process.
_CLUSTER_ONLY = {
    "scheduling": "scheduling",
    "autoscaling": "autoscaling",
    "image": "image",
    "cache": "cache",
    "shm_size": "shmSize",
}


@dataclass(frozen=True)
class LocalRuntime:
    config: RuntimeConfig
    env: dict[str, str]  # the AIModel's plain env values, added to the supervisor's environment
    warnings: tuple[str, ...]

    def fingerprint(self) -> str:
        """What must restart the process when it changes (the ports are the supervisor's, not the spec's)."""
        return self.config.model_copy(update={"port": 0, "metrics_port": 0}).to_env_value() + repr(
            sorted(self.env.items())
        )


def has_gpu() -> bool:
    return Path("/dev/nvidia0").exists() or bool(os.environ.get("SERVLANE_ASSUME_GPU"))


def local_adapters(model: AIModel) -> tuple[list[dict[str, str]], list[str]]:
    """The runtime's adapters file content (servlane_runtime.adapters) for a manifest, and warnings: a
    pvc:// adapter exists only in a cluster. Not part of the fingerprint: adapters change without a restart."""
    listed, warnings = [], []
    for adapter in model.spec.adapters:
        if adapter.pvc_claim is not None:
            warnings.append(f"adapter {adapter.name}: pvc:// sources exist only in a cluster; use a local path")
            continue
        listed.append({"name": adapter.name, "source": adapter.source})
    return listed, warnings


def local_runtime(
    model: AIModel,
    port: int,
    cache_dir: Path,
    gpu: bool,
    adapters_file: Path | None = None,
    metrics_port: int | None = None,
) -> LocalRuntime:
    """`adapters_file`: where the supervisor keeps this model's adapters list (used when it serves adapters).
    `metrics_port`: where its /metrics listens (None: the runtime's default, as in a pod)."""
    if model.spec.source.kind is SourceKind.PVC:
        raise ValueError(f"{model.spec.source.uri}: pvc:// sources exist only in a cluster; use a local path")
    if model.spec.source.kind is SourceKind.OCI:
        raise ValueError(f"{model.spec.source.uri}: oci:// images are mounted by a kubelet; use a local path")
    spec = model.spec
    explicit = spec.model_fields_set
    warnings = [f"{name} is ignored in standalone mode" for key, name in _CLUSTER_ONLY.items() if key in explicit]
    if spec.replicas is not None and spec.replicas != 1:
        warnings.append(f"replicas: {spec.replicas} is ignored: standalone mode runs one process per AIModel")
    if spec.resources.cpu or spec.resources.memory:
        warnings.append("resources.cpu/memory are ignored: no limits are applied to local processes")
    if spec.source.credentials_secret:
        warnings.append("source.credentialsSecret is ignored: set HF_TOKEN (or AWS_*) in your environment")
    update: dict[str, object] = {"port": port, "host": "127.0.0.1", "cache_dir": str(cache_dir)}
    if metrics_port is not None:
        update["metrics_port"] = metrics_port
    if adapters_file is not None:
        update["adapters_file"] = str(adapters_file)
    if spec.resources.gpus and not gpu:
        warnings.append(f"resources.gpus: {spec.resources.gpus} is ignored: no GPU found, the model runs on the CPU")
        update["tensor_parallel_size"] = 1
    env: dict[str, str] = {}
    for var in spec.env:
        if var.value_from is not None:
            warnings.append(f"env {var.name}: valueFrom is ignored (no Secrets or ConfigMaps here)")
        elif var.value is not None:
            env[var.name] = var.value
    config = build_runtime_config(model)
    explicit_threads = spec.engine_options.llamacpp is not None and spec.engine_options.llamacpp.threads is not None
    if not explicit_threads:
        # In a pod the threads follow resources.cpu; here no limit applies: the runtime counts the CPUs it may use.
        update["llamacpp"] = config.llamacpp.model_copy(update={"threads": None})
    config = config.model_copy(update=update)
    return LocalRuntime(RuntimeConfig.model_validate(config.model_dump()), env, tuple(warnings))
