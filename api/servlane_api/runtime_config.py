"""The contract between the operator and the runtime: what one runtime process serves and how.

The operator writes it into the Deployment as the JSON env var `SERVLANE_RUNTIME_CONFIG`;
standalone mode passes the same JSON; the runtime reads it back with `RuntimeConfig.from_env()`.
Both sides test against this one model.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from servlane_api.s3_source import S3Settings

ENV_VAR = "SERVLANE_RUNTIME_CONFIG"
DEFAULT_PORT = 8000
# /metrics on a port of its own, never the API's: a scraper admitted to it is not admitted to the model's
# unauthenticated API (the operator's NetworkPolicy admits each peer on its port only).
DEFAULT_METRICS_PORT = 9090
HEALTH_PATH = "/health"
READY_PATH = "/ready"
# GET /ready?wait=SECONDS: while the model loads, the runtime answers once it is ready (or failed), or after
# that many seconds (at most READY_MAX_WAIT_SECONDS): readiness pushed to the gateway, which holds requests
# for a starting model, instead of polled by it. Without the parameter (the kubelet's probes) it answers at once.
READY_WAIT_PARAM = "wait"
READY_MAX_WAIT_SECONDS = 30.0
METRICS_PATH = "/metrics"
MODEL_CACHE_DIR = "/var/cache/servlane"
PVC_MOUNT_DIR = "/mnt/models"
# Where an oci:// model image is mounted (an image volume, read-only): the image's root holds the model files.
MODEL_IMAGE_DIR = "/mnt/model-image"
# LoRA adapters: the list the runtime follows (a ConfigMap volume) and where pvc:// adapters are mounted.
ADAPTERS_DIR = "/etc/servlane/adapters"
ADAPTERS_FILE = f"{ADAPTERS_DIR}/adapters.json"
ADAPTER_PVC_DIR = "/mnt/adapters"
# Request body limits (the runtime's and the gateway's defaults): generous for any real OpenAI request.
DEFAULT_MAX_BODY_BYTES = 4 << 20
DEFAULT_MAX_JSON_DEPTH = 64
DEFAULT_MAX_LIST_ITEMS = 2048


class LlamaCppSettings(BaseModel):
    """The llama.cpp engine's CPU settings (engineOptions of an AIModel with engine llamacpp)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The .gguf file in the source's folder; None: its only .gguf file (or the source itself, when it is one).
    gguf_file: str | None = Field(default=None, pattern=r"^[^/]+\.gguf$")
    # Threads for decoding; None: every CPU the process may use.
    threads: int | None = Field(default=None, ge=1, le=512)
    # Requests decoded together (KV cache sequences, llama-server's slots); more wait in the engine's queue.
    parallel: int = Field(default=4, ge=1, le=256)
    # Most tokens in one decode (llama.cpp's n_batch): prompt chunks share it with the running requests.
    batch_size: int = Field(default=512, ge=1, le=65536)
    mmap: bool = True  # map the file instead of reading it into memory (pages shared, loaded on use)
    mlock: bool = False  # keep the weights in RAM (needs the memlock limit)
    # Host memory for prompts kept once their sequence serves another request (llama-server's --cache-ram): a
    # request that starts like an earlier one copies that start's KV state back instead of reading it again.
    # 0: none. Shrunk to what the memory limit leaves beside the weights and the KV cache.
    prompt_cache_mib: int = Field(default=1024, ge=0, le=1 << 20)


class RuntimeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model_source: str = Field(description="A local path, or hf://org/name[@revision], or s3://bucket/path.")
    # For s3:// sources: the store's endpoint, region, addressing style and stall timeout (credentials: env).
    s3: S3Settings = Field(default_factory=S3Settings)
    served_model_name: str
    engine: Literal["vllm", "transformers", "llamacpp"]
    task: Literal["generate", "embed"] = "generate"
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    # vLLM on CPU: GiB of KV cache (VLLM_CPU_KVCACHE_SPACE). None: the pod's own VLLM_CPU_KVCACHE_SPACE if it
    # sets one, else sized by the runtime from the memory limit (free memory in standalone) less the weights.
    cpu_kv_cache_gib: int | None = Field(default=None, ge=1)
    quantization: str | None = None
    tensor_parallel_size: int = Field(default=1, ge=1)
    # vLLM's `--tool-call-parser` name (None: hermes). The vLLM engine refuses a name it does not know at
    # startup; the transformers engine reads hermes only, so the config refuses anything else for it.
    tool_call_parser: str | None = None
    llamacpp: LlamaCppSettings = Field(default_factory=LlamaCppSettings)
    extra_args: list[str] = Field(default_factory=list)
    # LoRA adapters: the engine reserves room for them at start (vLLM --enable-lora), and the runtime keeps
    # the adapters it serves equal to the JSON list in adapters_file ([{"name", "source"}], a mounted
    # ConfigMap the operator rewrites), so adapters come and go without a restart.
    adapters_enabled: bool = False
    max_adapters: int = Field(default=4, ge=1)
    max_adapter_rank: int = Field(default=16, ge=1)
    adapters_file: str | None = None
    port: int = DEFAULT_PORT
    metrics_port: int = Field(default=DEFAULT_METRICS_PORT, ge=1, le=65535)
    host: str = "0.0.0.0"
    cache_dir: str = MODEL_CACHE_DIR
    load_timeout_seconds: float = Field(default=1800, gt=0)
    # Admission control: how many requests run at once, how many may wait, and for how long.
    max_in_flight: int = Field(default=64, ge=1)
    max_queue: int = Field(default=256, ge=0)
    queue_timeout_seconds: float = Field(default=30, gt=0)
    # Request bodies: larger than max_body_bytes is a 413; nested deeper than max_json_depth, or with an
    # array (messages, prompt, input, ...) longer than max_list_items, a 400.
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1)
    max_json_depth: int = Field(default=DEFAULT_MAX_JSON_DEPTH, ge=2, le=128)
    max_list_items: int = Field(default=DEFAULT_MAX_LIST_ITEMS, ge=1)

    @model_validator(mode="after")
    def _parser_fits_the_engine(self) -> RuntimeConfig:
        if self.engine in ("transformers", "llamacpp") and self.tool_call_parser not in (None, "hermes"):
            raise ValueError(
                f"tool_call_parser {self.tool_call_parser!r}: the {self.engine} engine reads only hermes tool calls"
            )
        if self.metrics_port == self.port:
            raise ValueError(f"metrics_port {self.metrics_port} is the API port: /metrics needs a port of its own")
        if self.engine != "vllm" and self.cpu_kv_cache_gib is not None:
            raise ValueError("cpu_kv_cache_gib applies to the vllm engine only")
        return self

    def to_env_value(self) -> str:
        return self.model_dump_json(exclude_defaults=False)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> RuntimeConfig:
        env = os.environ if environ is None else environ
        raw = env.get(ENV_VAR)
        if raw is None:
            raise KeyError(f"{ENV_VAR} is not set: the runtime needs its configuration as JSON")
        return cls.model_validate_json(raw)
