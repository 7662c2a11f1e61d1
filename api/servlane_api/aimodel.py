"""AIModel: one model version served by the shared runtime (spec and status)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from servlane_api._base import ApiModel, ApiObject
from servlane_api.affinity import Affinity
from servlane_api.autoscaling import AutoscalerStatus, Autoscaling
from servlane_api.cel import CelRule, CelValidated, dns_label_name, max_name_length
from servlane_api.cold_start import ColdStartStatus
from servlane_api.conditions import Condition
from servlane_api.kube_labels import DNS_SUBDOMAIN, LABEL_KEY, LABEL_KEY_PREFIX, LABEL_VALUE, label_keys_rule
from servlane_api.pod_env import RESERVED_ENV_NAMES
from servlane_api.sources import DNS_LABEL, Adapter, ModelSource, SourceKind

# The source and adapter models live in servlane_api.sources; they are part of the AIModel's API.
__all__ = [
    "MAX_MODEL_NAME",
    "QUANTITY",
    "AIModel",
    "AIModelSpec",
    "AIModelStatus",
    "Adapter",
    "CacheVolume",
    "Engine",
    "EngineOptions",
    "EnvVar",
    "ModelSource",
    "Phase",
    "Quantity",
    "Resources",
    "Scheduling",
    "SourceKind",
    "Task",
    "Toleration",
]

# Children are named model-<name> and must stay valid DNS labels (63 characters).
MAX_MODEL_NAME = 57
# Kubernetes resource quantities, e.g. 500m, 2, 16Gi, 1.5G.
QUANTITY = r"^([0-9]+(\.[0-9]+)?|\.[0-9]+)(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$"
Quantity = Annotated[str, Field(pattern=QUANTITY, max_length=32)]
RESERVED_ENV_MESSAGE = (
    f"env must not set {', '.join(RESERVED_ENV_NAMES[:-1])} or {RESERVED_ENV_NAMES[-1]}: "
    "the operator sets them on every model pod"
)


class Engine(StrEnum):
    VLLM = "vllm"
    TRANSFORMERS = "transformers"
    LLAMACPP = "llamacpp"


class Task(StrEnum):
    GENERATE = "generate"
    EMBED = "embed"


class LlamaCppOptions(ApiModel):
    gguf_file: str | None = Field(
        default=None,
        pattern=r"^[^/]+\.gguf$",
        max_length=255,
        description="The .gguf file in the source's folder (e.g. model-Q4_K_M.gguf); default: its only .gguf file. "
        "From an hf:// source only this file is fetched.",
    )
    threads: int | None = Field(
        default=None,
        ge=1,
        le=512,
        description="Threads that decode; default: resources.cpu rounded down (at least 1), else every CPU the "
        "pod may use.",
    )
    parallel_requests: int = Field(
        default=4,
        ge=1,
        le=256,
        description="Requests decoded together, each with its own maxModelLen of KV cache (llama-server's "
        "--parallel); more wait in the runtime's queue.",
    )
    batch_size: int = Field(
        default=512,
        ge=1,
        le=65536,
        description="Most tokens in one decode step (llama.cpp's n_batch): prompts are read in chunks of it.",
    )
    mmap: bool = Field(default=True, description="Map the file instead of reading it into memory.")
    mlock: bool = Field(default=False, description="Keep the weights in RAM (needs a memlock limit that allows it).")
    prompt_cache_mib: int = Field(
        default=1024,
        ge=0,
        le=1 << 20,
        alias="promptCacheMiB",
        description="MiB of host memory for prompts kept after their request (llama-server's --cache-ram): a "
        "request that starts like an earlier one copies that start's KV state back instead of reading it again, "
        "and reports it in usage.prompt_tokens_details.cached_tokens. 0: none. Shrunk at start to what "
        "resources.memory leaves beside the weights and the KV cache.",
    )


class EngineOptions(ApiModel):
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = Field(
        default="auto", description="Weights and activations dtype."
    )
    max_model_len: int | None = Field(
        default=None, ge=16, le=10_000_000, description="Maximum context length in tokens (prompt + output)."
    )
    gpu_memory_utilization: float | None = Field(
        default=None, gt=0, le=1, description="Fraction of each GPU's memory the vLLM engine may use."
    )
    cpu_kv_cache_gib: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        alias="cpuKVCacheGiB",
        description="vLLM on CPU: GiB of memory for the KV cache (VLLM_CPU_KVCACHE_SPACE). Default: what fits in "
        "the pod's memory limit (resources.memory) next to the weights and a margin of 2 GiB plus 10 %.",
    )
    quantization: Literal["awq", "gptq", "fp8", "bitsandbytes", "compressed-tensors"] | None = Field(
        default=None, description="Quantization method of the weights."
    )
    tool_call_parser: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9_.-]*$",
        max_length=64,
        description="How tool calls are read from the model's text in tool_choice 'auto': one of vLLM's "
        "`--tool-call-parser` names (hermes, llama3_json, mistral, pythonic, ...), as the model card says; "
        "default hermes (`<tool_call>` JSON, Qwen and Hermes models). The runtime refuses to start with a "
        "name vLLM does not know. The transformers engine reads hermes only.",
    )
    enable_adapters: bool = Field(
        default=False,
        description="Reserve room for LoRA adapters even while spec.adapters is empty, so that the first adapter "
        "added later loads live instead of restarting the pods (adapters are always enabled while any is listed).",
    )
    max_adapters: int = Field(
        default=4,
        ge=1,
        le=256,
        description="LoRA adapters the engine runs in one batch (vLLM --max-loras); more can be listed, they "
        "take turns.",
    )
    max_adapter_rank: int = Field(
        default=16,
        ge=1,
        le=512,
        description="Highest LoRA rank an adapter may have (vLLM --max-lora-rank); a larger one fails to load.",
    )
    extra_args: list[Annotated[str, Field(max_length=512)]] = Field(
        default_factory=list,
        max_length=64,
        description="Free-form engine arguments, e.g. ['--enable-prefix-caching'], passed as given.",
    )
    llamacpp: LlamaCppOptions | None = Field(
        default=None, description="The llamacpp engine's CPU settings (engine llamacpp only)."
    )


class Resources(ApiModel):
    gpus: int = Field(default=0, ge=0, le=64, description="GPUs per replica; for vLLM also the tensor-parallel size.")
    gpu_resource_name: str = Field(
        default="nvidia.com/gpu",
        # An extended resource's name has a domain (nvidia.com/gpu, amd.com/gpu, gpu.intel.com/i915): the pod API
        # refuses one without (`gpu`: "must be a standard resource for containers"), and `cpu` or `memory` would
        # overwrite the replica's own requests.
        # The domain a DNS subdomain (no `..`, `.-`, `-.`), the name at most 63 characters.
        pattern=DNS_SUBDOMAIN[:-1] + r"/[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$",
        max_length=253,
        description="Extended resource that counts GPUs on the nodes, with its domain, e.g. amd.com/gpu.",
    )
    cpu: Quantity | None = Field(default=None, description="CPU request and limit per replica, e.g. '4'.")
    memory: Quantity | None = Field(default=None, description="Memory request and limit per replica, e.g. 32Gi.")


MAX_NODE_SELECTOR_LABELS = 32


class Toleration(CelValidated):
    cel_rules = (
        CelRule(
            "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
            "a toleration with operator Exists takes no value",
            lambda t: t.operator != "Exists" or not t.value,
        ),
        CelRule(
            "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
            "a toleration without a key must have operator Exists (it then tolerates every taint)",
            lambda t: bool(t.key) or t.operator == "Exists",
        ),
        CelRule(
            "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "tolerationSeconds needs effect NoExecute",
            lambda t: t.toleration_seconds is None or t.effect == "NoExecute",
        ),
        CelRule(
            f"!has(self.key) || self.key.matches('{LABEL_KEY_PREFIX}')",
            "a toleration key's prefix (before '/') must be at most 253 characters",
            lambda t: t.key is None or re.fullmatch(LABEL_KEY_PREFIX, t.key) is not None,
        ),
    )

    key: str | None = Field(default=None, pattern=LABEL_KEY, max_length=317)
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = Field(default=None, pattern=LABEL_VALUE, max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class Scheduling(CelValidated):
    cel_rules = (
        label_keys_rule("self.nodeSelector", "nodeSelector keys must be label keys", lambda s: s.node_selector),
    )

    node_selector: dict[str, Annotated[str, Field(pattern=LABEL_VALUE, max_length=63)]] = Field(
        default_factory=dict, max_length=MAX_NODE_SELECTOR_LABELS
    )
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    affinity: Affinity | None = Field(default=None, description="A core/v1 Affinity, passed to the pods as written.")
    priority_class_name: str | None = Field(default=None, pattern=DNS_SUBDOMAIN, max_length=253)


class KeyRef(ApiModel):
    """A key of a Secret or ConfigMap in the AIModel's namespace (core/v1 SecretKeySelector, ConfigMapKeySelector)."""

    name: str = Field(pattern=DNS_SUBDOMAIN, max_length=253)
    key: str = Field(pattern=r"^[-._a-zA-Z0-9]+$", max_length=253)
    optional: bool | None = None


# The pod fields an env var may read (the pod API's list for the downward API in env), a label's or an
# annotation's value by its key.
ENV_FIELD_PATH = (
    r"^(metadata\.(name|namespace|uid)|spec\.(nodeName|serviceAccountName)|status\.(hostIPs?|podIPs?)"
    r"|metadata\.(labels|annotations)\['" + LABEL_KEY[1:-1] + r"'\])$"
)
# The container resources an env var may read, and the divisors the pod API takes for each.
ENV_RESOURCE = r"^(limits|requests)\.(cpu|memory|ephemeral-storage|hugepages-[0-9]+(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?)$"
CPU_DIVISORS = ("1m", "1")
BYTE_DIVISORS = ("1", "1k", "1M", "1G", "1T", "1P", "1E", "1Ki", "1Mi", "1Gi", "1Ti", "1Pi", "1Ei")


class ObjectFieldRef(ApiModel):
    """A field of the pod (core/v1 ObjectFieldSelector), e.g. metadata.name or status.podIP."""

    api_version: Literal["v1"] | None = None
    field_path: str = Field(
        pattern=ENV_FIELD_PATH,
        max_length=400,
        description="metadata.name, .namespace, .uid, .labels['KEY'] or .annotations['KEY'], spec.nodeName, "
        "spec.serviceAccountName, status.hostIP(s) or status.podIP(s).",
    )


def _divisor_fits(ref: ResourceFieldRef) -> bool:
    allowed = CPU_DIVISORS if ref.resource.endswith(".cpu") else BYTE_DIVISORS
    return ref.divisor is None or ref.divisor in allowed


class ResourceFieldRef(CelValidated):
    """A resource of the container (core/v1 ResourceFieldSelector), e.g. limits.memory."""

    cel_rules = (
        CelRule(
            f"!has(self.divisor) || (self.resource.endsWith('.cpu') ? self.divisor in {list(CPU_DIVISORS)} : "
            f"self.divisor in {list(BYTE_DIVISORS)})",
            f"resourceFieldRef.divisor must be one of {', '.join(CPU_DIVISORS)} for cpu, else one of "
            f"{', '.join(BYTE_DIVISORS)}",
            _divisor_fits,
        ),
    )

    container_name: str | None = Field(default=None, max_length=63)
    resource: str = Field(
        pattern=ENV_RESOURCE,
        max_length=64,
        description="limits. or requests. and cpu, memory, ephemeral-storage or hugepages-SIZE.",
    )
    divisor: str | None = Field(default=None, max_length=8, description="1m or 1 for cpu; 1, 1k, 1Mi... for bytes.")


class EnvVarSource(CelValidated):
    # Typed, so a mistake here is refused with the AIModel (it was kept as given and refused by the pod API
    # only when the Deployment was applied, reported as ChildRejected).
    cel_rules = (
        CelRule(
            "[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef), has(self.resourceFieldRef)]"
            ".filter(x, x).size() == 1",
            "valueFrom takes exactly one of secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef",
            lambda source: (
                sum(
                    ref is not None
                    for ref in (
                        source.secret_key_ref,
                        source.config_map_key_ref,
                        source.field_ref,
                        source.resource_field_ref,
                    )
                )
                == 1
            ),
        ),
    )

    secret_key_ref: KeyRef | None = None
    config_map_key_ref: KeyRef | None = None
    field_ref: ObjectFieldRef | None = None
    resource_field_ref: ResourceFieldRef | None = None


class EnvVar(CelValidated):
    # As the pod API checks it (a Deployment with both was refused, reported as ChildRejected).
    cel_rules = (
        CelRule(
            "!has(self.valueFrom) || !has(self.value) || self.value == ''",
            "an env var takes value or valueFrom, not both",
            lambda env: env.value_from is None or not env.value,
        ),
    )

    name: str = Field(pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", max_length=253)
    value: str | None = None
    value_from: EnvVarSource | None = Field(
        default=None, description="Where the value comes from: a Secret's or ConfigMap's key, or a pod field."
    )


class CacheVolume(CelValidated):
    cel_rules = (
        CelRule(
            "[has(self.persistentVolumeClaim), has(self.emptyDirSizeLimit)].filter(x, x).size() == 1",
            "cache needs exactly one of persistentVolumeClaim or emptyDirSizeLimit",
            lambda cache: (cache.persistent_volume_claim is None) != (cache.empty_dir_size_limit is None),
        ),
    )

    persistent_volume_claim: str | None = Field(
        default=None,
        pattern=DNS_LABEL,
        max_length=253,
        description="Existing PVC that caches downloaded weights.",
    )
    empty_dir_size_limit: Quantity | None = Field(
        default=None, description="A pod-local cache of at most this size, e.g. 50Gi."
    )


class AIModelSpec(CelValidated):
    # engineOptions, resources and env have defaults, so CEL's has() on them always holds.
    cel_rules = (
        CelRule(
            "!(has(self.replicas) && has(self.autoscaling))",
            "set either replicas or autoscaling, not both",
            lambda spec: spec.replicas is None or spec.autoscaling is None,
        ),
        CelRule(
            "self.engine == 'vllm' || !has(self.autoscaling) || !has(self.autoscaling.targetKVCacheUsage)",
            "autoscaling.targetKVCacheUsage applies to the vllm engine only (the transformers engine reports no "
            "KV-cache use)",
            lambda spec: (
                spec.engine == Engine.VLLM or spec.autoscaling is None or spec.autoscaling.target_kv_cache_usage is None
            ),
        ),
        CelRule(
            "self.engine == 'vllm' || !has(self.engineOptions) || !has(self.engineOptions.gpuMemoryUtilization)",
            "engineOptions.gpuMemoryUtilization applies to the vllm engine only",
            lambda spec: spec.engine == Engine.VLLM or spec.engine_options.gpu_memory_utilization is None,
        ),
        CelRule(
            "self.engine == 'vllm' || !has(self.engineOptions) || !has(self.engineOptions.cpuKVCacheGiB)",
            "engineOptions.cpuKVCacheGiB applies to the vllm engine only",
            lambda spec: spec.engine == Engine.VLLM or spec.engine_options.cpu_kv_cache_gib is None,
        ),
        CelRule(
            "self.engine != 'transformers' || !has(self.engineOptions) || !has(self.engineOptions.quantization) "
            "|| self.engineOptions.quantization == 'bitsandbytes'",
            "the transformers engine supports only bitsandbytes quantization",
            lambda spec: (
                spec.engine != Engine.TRANSFORMERS or spec.engine_options.quantization in (None, "bitsandbytes")
            ),
        ),
        # llama.cpp: the GGUF file carries its quantization and dtypes; the engine is built for CPUs, and serves
        # no adapters; nothing would read extra arguments.
        CelRule(
            "self.engine == 'llamacpp' || !has(self.engineOptions) || !has(self.engineOptions.llamacpp)",
            "engineOptions.llamacpp applies to the llamacpp engine only",
            lambda spec: spec.engine == Engine.LLAMACPP or spec.engine_options.llamacpp is None,
        ),
        CelRule(
            "self.engine != 'llamacpp' || !has(self.engineOptions) || !has(self.engineOptions.quantization)",
            "engine llamacpp takes no engineOptions.quantization: the GGUF file's quantization is what it runs",
            lambda spec: spec.engine != Engine.LLAMACPP or spec.engine_options.quantization is None,
        ),
        CelRule(
            "self.engine != 'llamacpp' || !has(self.engineOptions) || self.engineOptions.dtype == 'auto'",
            "engine llamacpp takes no engineOptions.dtype: the GGUF file's tensor types are what it runs",
            lambda spec: spec.engine != Engine.LLAMACPP or spec.engine_options.dtype == "auto",
        ),
        CelRule(
            "self.engine != 'llamacpp' || self.resources.gpus == 0",
            "engine llamacpp runs on CPUs (its build in the runtime image has no GPU code): set resources.gpus to 0",
            lambda spec: spec.engine != Engine.LLAMACPP or spec.resources.gpus == 0,
        ),
        CelRule(
            "self.engine != 'llamacpp' || (self.adapters.size() == 0 && !self.engineOptions.enableAdapters)",
            "engine llamacpp serves no LoRA adapters",
            lambda spec: spec.engine != Engine.LLAMACPP or not (spec.adapters or spec.engine_options.enable_adapters),
        ),
        CelRule(
            "self.engine != 'llamacpp' || self.engineOptions.extraArgs.size() == 0",
            "engine llamacpp takes no engineOptions.extraArgs: its settings are engineOptions.llamacpp",
            lambda spec: spec.engine != Engine.LLAMACPP or not spec.engine_options.extra_args,
        ),
        # The transformers engine parses the hermes format only: another parser would be silently ignored.
        CelRule(
            "self.engine == 'vllm' || !has(self.engineOptions) || !has(self.engineOptions.toolCallParser) "
            "|| self.engineOptions.toolCallParser == 'hermes'",
            "the transformers and llamacpp engines read only hermes tool calls: another engineOptions.toolCallParser "
            "needs engine vllm",
            lambda spec: spec.engine == Engine.VLLM or spec.engine_options.tool_call_parser in (None, "hermes"),
        ),
        CelRule(
            f"self.env.all(e, !(e.name in [{', '.join(repr(name) for name in RESERVED_ENV_NAMES)}]))",
            RESERVED_ENV_MESSAGE,
            lambda spec: all(e.name not in RESERVED_ENV_NAMES for e in spec.env),
        ),
        # A pod's env is a list keyed by name: a duplicate would make server-side apply of the Deployment fail.
        CelRule(
            "self.env.all(e, self.env.exists_one(f, f.name == e.name))",
            "env must not set the same variable twice",
            lambda spec: len({e.name for e in spec.env}) == len(spec.env),
        ),
        # The gateway reads `a/b` as model `b` of namespace `a`, so such a name could never be called (a rule,
        # not the pattern, so the API server says why).
        CelRule(
            "!has(self.servedModelName) || !self.servedModelName.contains('/')",
            "servedModelName must not contain '/': the gateway reads 'a/b' as model 'b' in namespace 'a' "
            "(use e.g. 'org.model' or 'org-model')",
            lambda spec: spec.served_model_name is None or "/" not in spec.served_model_name,
        ),
        # Adapters are served under their own names next to the base model's: a clash would hide one of them.
        CelRule(
            "self.adapters.all(a, self.adapters.exists_one(b, b.name == a.name))",
            "adapters must have different names",
            lambda spec: len({a.name for a in spec.adapters}) == len(spec.adapters),
        ),
        CelRule(
            "!has(self.servedModelName) || self.adapters.all(a, a.name != self.servedModelName)",
            "an adapter must not be named like the model's servedModelName",
            lambda spec: spec.served_model_name is None or all(a.name != spec.served_model_name for a in spec.adapters),
        ),
        CelRule(
            "self.adapters.size() == 0 || self.task == 'generate'",
            "adapters apply to task generate only",
            lambda spec: not spec.adapters or spec.task == Task.GENERATE,
        ),
    )

    source: ModelSource
    served_model_name: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$",  # `/` is refused by a CEL rule above, with a message
        max_length=253,
        description="The model name clients send (no '/': '<namespace>/<name>' calls another namespace's model); "
        "defaults to the AIModel's name.",
    )
    engine: Engine = Field(
        default=Engine.VLLM,
        description="vllm; transformers for CPU and small GPUs; llamacpp for GGUF files (quantized models) on CPUs.",
    )
    task: Task = Field(default=Task.GENERATE, description="generate (chat/completions) or embed (embeddings).")
    engine_options: EngineOptions = Field(default_factory=EngineOptions)
    resources: Resources = Field(default_factory=Resources)
    scheduling: Scheduling = Field(default_factory=Scheduling)
    replicas: int | None = Field(
        default=None,
        ge=0,
        le=1000,
        description="Fixed replica count (default 1), also written by `kubectl scale`, an HPA or KEDA through "
        "the scale subresource; the operator copies it to the Deployment. Not with autoscaling.",
    )
    autoscaling: Autoscaling | None = Field(
        default=None,
        description="The operator's own autoscaler, on the engine's signals, down to zero and back; it is then "
        "the only writer of the replicas (spec.replicas and the scale subresource are refused).",
    )
    image: str | None = Field(default=None, max_length=512, description="Runtime image override.")
    env: list[EnvVar] = Field(default_factory=list, max_length=128)
    cache: CacheVolume | None = Field(default=None, description="Volume at the model cache for downloaded weights.")
    shm_size: Quantity = Field(default="1Gi", description="Size of the memory-backed /dev/shm.")
    adapters: list[Adapter] = Field(
        default_factory=list,
        max_length=64,
        description="LoRA adapters served next to the base model, each under its own name. Adding or removing "
        "one reaches the running pods without a restart (set engineOptions.enableAdapters on a model that has "
        "none yet); a pvc:// adapter on a claim no other adapter uses yet adds a volume, which restarts them.",
    )

    @property
    def adapters_enabled(self) -> bool:
        return bool(self.adapters) or self.engine_options.enable_adapters


Phase = Literal["Pending", "Deploying", "Ready", "Degraded", "Failed"]


class AIModelStatus(ApiModel):
    observed_generation: int | None = None
    phase: Phase | None = None
    replicas: int | None = Field(default=None, description="Pods the Deployment has.")
    ready_replicas: int | None = None
    desired_replicas: int | None = None
    endpoint: str | None = Field(default=None, description="In-cluster base URL of the OpenAI API.")
    selector: str | None = Field(
        default=None, description="Label selector of the model's pods (the scale subresource's, for HPA and KEDA)."
    )
    autoscaler: AutoscalerStatus | None = Field(default=None, description="The autoscaler's last decision.")
    served_model_name: str | None = None
    conditions: list[Condition] = Field(default_factory=list)
    cold_start: ColdStartStatus | None = Field(
        default=None, description="How the pods started: the last start, the median of recent ones (cold_start_reader)."
    )


class AIModel(ApiObject, CelValidated):
    # The root of the CRD schema; crdgen writes these next to spec and status.
    cel_rules = (max_name_length(MAX_MODEL_NAME), dns_label_name("model's Service and Deployment"))

    kind: str = "AIModel"
    spec: AIModelSpec
    status: AIModelStatus = Field(default_factory=AIModelStatus)

    @property
    def served_model_name(self) -> str:
        return self.spec.served_model_name or self.name
