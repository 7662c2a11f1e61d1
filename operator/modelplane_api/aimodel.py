"""AIModel: one model version served by the shared runtime (spec and status)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from modelplane_api._base import ApiModel, ApiObject, defaults_of
from modelplane_api.cel import cel_rules
from modelplane_api.conditions import Condition

# Children are named model-<name> and must stay valid DNS labels (63 characters).
MAX_MODEL_NAME = 57
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Kubernetes resource quantities, e.g. 500m, 2, 16Gi, 1.5G.
QUANTITY = r"^([0-9]+(\.[0-9]+)?|\.[0-9]+)(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$"
SOURCE_URI = r"^(hf://[^/@\s]+/[^/@\s]+(@[^\s]+)?|pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/[^\s]*)?|s3://[^/\s]+(/[^\s]*)?|/[^\s]*)$"
SOURCE_URI_MESSAGE = (
    "source.uri must be hf://org/name[@revision], pvc://claim/path, s3://bucket/path, or an absolute path in the image"
)
Quantity = Annotated[str, Field(pattern=QUANTITY, max_length=32)]


class Engine(StrEnum):
    VLLM = "vllm"
    TRANSFORMERS = "transformers"


class Task(StrEnum):
    GENERATE = "generate"
    EMBED = "embed"


class SourceKind(StrEnum):
    HF = "hf"
    PVC = "pvc"
    S3 = "s3"
    IMAGE = "image"


class ModelSource(ApiModel):
    model_config = cel_rules(
        (f"self.uri.matches(r'{SOURCE_URI}')", SOURCE_URI_MESSAGE),
        (
            "!has(self.credentialsSecret) || self.uri.startsWith('hf://') || self.uri.startsWith('s3://')",
            "source.credentialsSecret applies only to hf:// and s3:// sources",
        ),
    )

    uri: str = Field(
        max_length=1024,
        description=(
            "Where the weights are: hf://org/name[@revision], pvc://claim/path, s3://bucket/path, "
            "or an absolute path baked into the image."
        ),
    )
    credentials_secret: str | None = Field(
        default=None,
        pattern=DNS_LABEL,
        max_length=253,
        description="Secret in the same namespace whose keys become environment variables "
        "(HF_TOKEN for hf://, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY for s3://).",
    )

    @field_validator("uri")
    @classmethod
    def _known_scheme(cls, uri: str) -> str:
        if re.match(SOURCE_URI, uri) is None:
            raise ValueError(SOURCE_URI_MESSAGE)
        return uri

    @property
    def kind(self) -> SourceKind:
        scheme = self.uri.split("://", 1)[0] if "://" in self.uri else ""
        return {"hf": SourceKind.HF, "pvc": SourceKind.PVC, "s3": SourceKind.S3}.get(scheme, SourceKind.IMAGE)

    def pvc_claim_and_path(self) -> tuple[str, str]:
        """For pvc://claim/path: the claim name and the path inside it ('' for its root)."""
        match = re.match(r"^pvc://([^/]+)/?(.*)$", self.uri)
        if match is None:
            raise ValueError(f"{self.uri!r} is not a pvc:// source")
        return match.group(1), match.group(2)


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
    quantization: Literal["awq", "gptq", "fp8", "bitsandbytes", "compressed-tensors"] | None = Field(
        default=None, description="Quantization method of the weights."
    )
    extra_args: list[Annotated[str, Field(max_length=512)]] = Field(
        default_factory=list,
        max_length=64,
        description="Free-form engine arguments, e.g. ['--enable-prefix-caching'], passed as given.",
    )


class Resources(ApiModel):
    gpus: int = Field(default=0, ge=0, le=64, description="GPUs per replica; for vLLM also the tensor-parallel size.")
    gpu_resource_name: str = Field(
        default="nvidia.com/gpu",
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$",
        max_length=253,
        description="Extended resource that counts GPUs on the nodes.",
    )
    cpu: Quantity | None = Field(default=None, description="CPU request and limit per replica, e.g. '4'.")
    memory: Quantity | None = Field(default=None, description="Memory request and limit per replica, e.g. 32Gi.")


class Toleration(ApiModel):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class Scheduling(ApiModel):
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    affinity: dict[str, Any] | None = Field(
        default=None, description="A core/v1 Affinity, passed to the pods unchanged."
    )
    priority_class_name: str | None = Field(default=None, max_length=253)


class AutoscalingMetric(ApiModel):
    model_config = cel_rules(
        (
            "self.type != 'Pods' || has(self.name)",
            "a Pods metric needs metric.name, e.g. modelplane_requests_in_flight",
        ),
        (
            "self.type != 'Pods' || has(self.targetAverageValue)",
            "a Pods metric needs metric.targetAverageValue",
        ),
    )

    type: Literal["CPU", "Pods"] = Field(
        default="CPU", description="CPU utilisation, or a per-pod custom metric served by a metrics adapter."
    )
    target_utilization: int = Field(
        default=70, ge=1, le=100, description="Target average CPU utilisation in percent (type CPU)."
    )
    name: str | None = Field(default=None, max_length=253, description="Pods metric name (type Pods).")
    target_average_value: Quantity | None = Field(default=None, description="Per-pod target (type Pods).")


class Autoscaling(ApiModel):
    model_config = cel_rules(
        (
            "self.minReplicas <= self.maxReplicas",
            "autoscaling.minReplicas must not exceed autoscaling.maxReplicas",
        ),
    )

    min_replicas: int = Field(default=1, ge=0, le=1000)
    max_replicas: int = Field(ge=1, le=1000)
    metric: AutoscalingMetric = Field(
        default_factory=AutoscalingMetric, json_schema_extra=defaults_of(AutoscalingMetric)
    )


class EnvVar(ApiModel):
    name: str = Field(pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", max_length=253)
    value: str | None = None
    value_from: dict[str, Any] | None = Field(
        default=None, description="A core/v1 EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef)."
    )


class CacheVolume(ApiModel):
    model_config = cel_rules(
        (
            "[has(self.persistentVolumeClaim), has(self.emptyDirSizeLimit)].filter(x, x).size() == 1",
            "cache needs exactly one of persistentVolumeClaim or emptyDirSizeLimit",
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


class AIModelSpec(ApiModel):
    model_config = cel_rules(
        ("!(has(self.replicas) && has(self.autoscaling))", "set either replicas or autoscaling, not both"),
        (
            "!has(self.autoscaling) || self.autoscaling.metric.type != 'CPU' || has(self.resources.cpu)",
            "autoscaling on CPU utilisation needs resources.cpu, the request utilisation is measured against",
        ),
        (
            "self.engine == 'vllm' || !has(self.engineOptions) || !has(self.engineOptions.gpuMemoryUtilization)",
            "engineOptions.gpuMemoryUtilization applies to the vllm engine only",
        ),
        (
            "self.engine == 'vllm' || !has(self.engineOptions) || !has(self.engineOptions.quantization) "
            "|| self.engineOptions.quantization == 'bitsandbytes'",
            "the transformers engine supports only bitsandbytes quantization",
        ),
    )

    source: ModelSource
    served_model_name: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$",
        max_length=253,
        description="The model name clients send; defaults to the AIModel's name.",
    )
    engine: Engine = Field(default=Engine.VLLM, description="vllm, or transformers for CPU and small GPUs.")
    task: Task = Field(default=Task.GENERATE, description="generate (chat/completions) or embed (embeddings).")
    engine_options: EngineOptions = Field(default_factory=EngineOptions, json_schema_extra=defaults_of(EngineOptions))
    resources: Resources = Field(default_factory=Resources, json_schema_extra=defaults_of(Resources))
    scheduling: Scheduling = Field(default_factory=Scheduling, json_schema_extra=defaults_of(Scheduling))
    replicas: int | None = Field(default=None, ge=0, le=1000, description="Fixed replica count (default 1).")
    autoscaling: Autoscaling | None = None
    image: str | None = Field(default=None, max_length=512, description="Runtime image override.")
    env: list[EnvVar] = Field(default_factory=list, max_length=128)
    cache: CacheVolume | None = Field(default=None, description="Volume at the model cache for downloaded weights.")
    shm_size: Quantity = Field(default="1Gi", description="Size of the memory-backed /dev/shm.")

    @model_validator(mode="after")
    def _replicas_or_autoscaling(self) -> AIModelSpec:
        # Mirrors the CEL rule, so typed code (standalone mode, tests) rejects what the API server would.
        if self.replicas is not None and self.autoscaling is not None:
            raise ValueError("set either replicas or autoscaling, not both")
        if self.autoscaling is not None and self.autoscaling.min_replicas > self.autoscaling.max_replicas:
            raise ValueError("autoscaling.minReplicas must not exceed autoscaling.maxReplicas")
        if self.autoscaling is not None and self.autoscaling.metric.type == "CPU" and self.resources.cpu is None:
            raise ValueError(
                "autoscaling on CPU utilisation needs resources.cpu, the request utilisation is measured against"
            )
        return self


Phase = Literal["Pending", "Deploying", "Ready", "Degraded", "Failed"]


class AIModelStatus(ApiModel):
    observed_generation: int | None = None
    phase: Phase | None = None
    replicas: int | None = Field(default=None, description="Pods the Deployment has.")
    ready_replicas: int | None = None
    desired_replicas: int | None = None
    endpoint: str | None = Field(default=None, description="In-cluster base URL of the OpenAI API.")
    served_model_name: str | None = None
    conditions: list[Condition] = Field(default_factory=list)


class AIModel(ApiObject):
    kind: str = "AIModel"
    spec: AIModelSpec
    status: AIModelStatus = Field(default_factory=AIModelStatus)

    @property
    def served_model_name(self) -> str:
        return self.spec.served_model_name or self.name
