"""AIFeature: a named capability (e.g. `chat`) and which AIModels answer it, with canary rollouts."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from modelplane_api._base import ApiModel, ApiObject, defaults_of
from modelplane_api.aimodel import DNS_LABEL
from modelplane_api.cel import cel_rules
from modelplane_api.conditions import Condition

ModelName = Annotated[str, Field(pattern=DNS_LABEL, max_length=253)]
DURATION = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"


class WeightedModel(ApiModel):
    model: ModelName = Field(description="An AIModel in the same namespace.")
    weight: int = Field(ge=0, le=100, description="Percent of the feature's traffic.")


class Analysis(ApiModel):
    max_error_rate: float = Field(
        default=0.05, ge=0, le=1, description="Highest tolerated share of 5xx, timeouts and aborted streams."
    )
    max_p95_time_to_first_token_seconds: float | None = Field(default=None, gt=0)
    max_p95_latency_seconds: float | None = Field(default=None, gt=0)
    min_requests: int = Field(default=20, ge=1, description="Requests the canary must see before any verdict.")
    failure_threshold: int = Field(default=1, ge=1, description="Failed checks that trigger a rollback.")


class Rollout(ApiModel):
    model_config = cel_rules(
        ("self.steps.all(s, s > 0 && s <= 100)", "rollout.steps must be percentages between 1 and 100"),
        (
            "self.steps.isSorted() && self.steps.all(s, self.steps.filter(t, t == s).size() == 1)",
            "rollout.steps must be increasing",
        ),
    )

    steps: list[int] = Field(default_factory=lambda: [5, 25, 50, 100], min_length=1, max_length=20)
    interval: str = Field(default="1m", pattern=DURATION, description="Time per step, e.g. 30s, 2m, 1h.")
    analysis: Analysis = Field(default_factory=Analysis, json_schema_extra=defaults_of(Analysis))
    fixed_gpu_budget: bool = Field(
        default=False,
        description="Take the canary's replicas out of the stable model's replicas step by step "
        "instead of running both at full size.",
    )
    min_stable_replicas: int = Field(
        default=1, ge=0, description="With fixedGpuBudget: stable replicas always kept warm for a rollback."
    )

    @model_validator(mode="after")
    def _increasing(self) -> Rollout:
        if any(b <= a for a, b in zip(self.steps, self.steps[1:], strict=False)):
            raise ValueError("rollout.steps must be increasing")
        return self


class FeatureDefaults(ApiModel):
    system_prompt: str | None = Field(default=None, max_length=32_768)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens_cap: int | None = Field(default=None, ge=1, description="Upper bound on max_tokens per request.")


class AIFeatureSpec(ApiModel):
    model_config = cel_rules(
        (
            "[has(self.model), has(self.split)].filter(x, x).size() == 1",
            "set exactly one of model (a rollout target) or split (a fixed A/B split)",
        ),
        (
            "!has(self.split) || self.split.map(s, s.weight).sum() == 100",
            "split weights must add up to 100",
        ),
    )

    model: ModelName | None = Field(default=None, description="The AIModel that should serve this feature.")
    split: list[WeightedModel] | None = Field(default=None, min_length=1, max_length=16)
    rollout: Rollout = Field(default_factory=Rollout, json_schema_extra=defaults_of(Rollout))
    defaults: FeatureDefaults = Field(default_factory=FeatureDefaults, json_schema_extra=defaults_of(FeatureDefaults))

    @model_validator(mode="after")
    def _model_or_split(self) -> AIFeatureSpec:
        if (self.model is None) == (self.split is None):
            raise ValueError("set exactly one of model (a rollout target) or split (a fixed A/B split)")
        if self.split is not None and sum(s.weight for s in self.split) != 100:
            raise ValueError("split weights must add up to 100")
        return self


FeaturePhase = Literal["Pending", "Stable", "Progressing", "Paused", "RolledBack", "Split"]


class AnalysisResult(ApiModel):
    time: str
    step: int = Field(description="Index into rollout.steps of the step that was analysed.")
    canary_model: str | None = None
    canary_weight: int | None = None
    verdict: Literal["advance", "hold", "promote", "rollback"]
    canary_requests: int = 0
    canary_error_rate: float | None = None
    canary_p95_ttft_seconds: float | None = None
    canary_p95_latency_seconds: float | None = None
    stable_error_rate: float | None = None
    message: str = ""


class ModelReplicas(ApiModel):
    model: ModelName
    replicas: int = Field(ge=0)


class AIFeatureStatus(ApiModel):
    observed_generation: int | None = None
    phase: FeaturePhase | None = None
    stable_model: str | None = None
    canary_model: str | None = None
    canary_weight: int | None = None
    step_index: int | None = None
    step_started_at: str | None = None
    failed_checks: int | None = None
    rolled_back_model: str | None = Field(
        default=None, description="A canary that was rolled back; it gets no traffic until spec changes."
    )
    rolled_back_generation: int | None = Field(
        default=None,
        description="metadata.generation when the rollback happened: the same model is tried again only "
        "after the spec changes.",
    )
    weights: list[WeightedModel] = Field(default_factory=list, description="Current traffic split.")
    replica_overrides: list[ModelReplicas] = Field(
        default_factory=list,
        description="With rollout.fixedGpuBudget: the replicas each AIModel's Deployment runs during the rollout.",
    )
    last_analysis: AnalysisResult | None = None
    analyses: list[AnalysisResult] = Field(default_factory=list, description="Recent analyses, newest last.")
    conditions: list[Condition] = Field(default_factory=list)


class AIFeature(ApiObject):
    kind: str = "AIFeature"
    spec: AIFeatureSpec
    status: AIFeatureStatus = Field(default_factory=AIFeatureStatus)
