"""The operator/runtime contract from an AIModel: what the runtime serves, built purely from the manifest.

The operator writes it into each model pod (as JSON in SERVLANE_RUNTIME_CONFIG) and `servlane serve` starts
its local runtime processes from it, so a manifest means the same engine, task and options in both.
"""

from __future__ import annotations

import math
from decimal import Decimal

from servlane_api.aimodel import AIModel, AIModelSpec, SourceKind
from servlane_api.runtime_config import (
    ADAPTERS_FILE,
    DEFAULT_METRICS_PORT,
    DEFAULT_PORT,
    MODEL_CACHE_DIR,
    MODEL_IMAGE_DIR,
    PVC_MOUNT_DIR,
    LlamaCppSettings,
    RuntimeConfig,
)
from servlane_api.s3_source import S3Settings


def serves_adapters(model: AIModel) -> bool:
    """Whether the model's runtime loads LoRA adapters (generation models with adapters enabled)."""
    return model.spec.adapters_enabled and model.spec.task.value == "generate"


# A Kubernetes quantity's suffixes (servlane_api.aimodel.QUANTITY), as multipliers.
QUANTITY_SUFFIXES: dict[str, Decimal] = {
    "m": Decimal("0.001"),
    **{s: Decimal(1000) ** (i + 1) for i, s in enumerate("kMGTPE")},
    **{s + "i": Decimal(1024) ** (i + 1) for i, s in enumerate("KMGTPE")},
}
MAX_THREADS = 512  # the runtime's own bound on llama.cpp's threads (servlane_api.runtime_config)


def quantity_value(quantity: str) -> Decimal:
    """A quantity as servlane_api.aimodel.QUANTITY admits it ("500m", "2.5", "1k", "2Gi") as a number."""
    for suffix in sorted(QUANTITY_SUFFIXES, key=len, reverse=True):  # two letters first: Mi before M
        if quantity.endswith(suffix):
            return Decimal(quantity[: -len(suffix)]) * QUANTITY_SUFFIXES[suffix]
    return Decimal(quantity)


def whole_cpus(quantity: str) -> int:
    """A CPU quantity ("500m", "2", "2.5", "1k") as whole CPUs, rounded down, at least 1 and at most the runtime's
    bound on threads: threads beyond the limit would only be throttled. (It read "1k" with float(): a crash of
    the operator's builder, retried for good with nothing in status.)"""
    return max(1, min(MAX_THREADS, math.floor(quantity_value(quantity))))


def llamacpp_settings(spec: AIModelSpec) -> LlamaCppSettings:
    """engineOptions.llamacpp as the runtime reads it; threads default to the pod's whole CPUs (resources.cpu)."""
    options = spec.engine_options.llamacpp
    if options is None:
        threads = whole_cpus(spec.resources.cpu) if spec.resources.cpu else None
        return LlamaCppSettings(threads=threads)
    threads = options.threads or (whole_cpus(spec.resources.cpu) if spec.resources.cpu else None)
    return LlamaCppSettings(
        gguf_file=options.gguf_file,
        threads=threads,
        parallel=options.parallel_requests,
        batch_size=options.batch_size,
        mmap=options.mmap,
        mlock=options.mlock,
        prompt_cache_mib=options.prompt_cache_mib,
    )


def build_runtime_config(model: AIModel) -> RuntimeConfig:
    """What the runtime serves for `model`: paths as the model pod mounts them, the runtime's ports."""
    spec = model.spec
    source = spec.source
    if source.kind is SourceKind.PVC:
        _, path = source.pvc_claim_and_path()
        model_source = f"{PVC_MOUNT_DIR}/{path}".rstrip("/")
    elif source.kind is SourceKind.OCI:
        model_source = MODEL_IMAGE_DIR  # the kubelet has pulled and mounted it: nothing to fetch at start
    else:
        model_source = source.uri
    options = spec.engine_options
    return RuntimeConfig(
        model_source=model_source,
        s3=source.s3.settings() if source.s3 is not None else S3Settings(),
        served_model_name=model.served_model_name,
        engine=spec.engine.value,
        task=spec.task.value,
        dtype=options.dtype,
        max_model_len=options.max_model_len,
        gpu_memory_utilization=options.gpu_memory_utilization,
        cpu_kv_cache_gib=options.cpu_kv_cache_gib,
        quantization=options.quantization,
        tool_call_parser=options.tool_call_parser,
        llamacpp=llamacpp_settings(spec) if spec.engine.value == "llamacpp" else LlamaCppSettings(),
        tensor_parallel_size=max(1, spec.resources.gpus),
        extra_args=list(options.extra_args),
        adapters_enabled=serves_adapters(model),
        max_adapters=options.max_adapters,
        max_adapter_rank=options.max_adapter_rank,
        adapters_file=ADAPTERS_FILE if serves_adapters(model) else None,
        port=DEFAULT_PORT,
        metrics_port=DEFAULT_METRICS_PORT,
        cache_dir=MODEL_CACHE_DIR,
    )
