"""AIFeature: a named capability (e.g. `chat`) and which AIModels answer it, with canary rollouts."""

from __future__ import annotations

from itertools import pairwise
from typing import Annotated, Literal

from pydantic import Field, field_validator

from servlane_api._base import ApiModel, ApiObject
from servlane_api.cel import CelRule, CelValidated, max_name_length
from servlane_api.conditions import Condition
from servlane_api.targets import TARGET

# An AIModel of the namespace, or one of its adapters as `<aimodel>:<adapter>` (servlane_api.targets).
ModelName = Annotated[str, Field(pattern=TARGET, max_length=253)]
DURATION = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
MAX_ROLLOUT_INTERVAL = "168h"
MAX_REPLICAS = 1000  # as an AIModel's replicas and autoscaling.maxReplicas


class WeightedModel(ApiModel):
    model: ModelName = Field(
        description="An AIModel in the same namespace, or one of its adapters as '<aimodel>:<adapter>'."
    )
    weight: int = Field(ge=0, le=100, description="Percent of the feature's traffic.")


class Analysis(ApiModel):
    max_error_rate: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="Highest tolerated share of failed canary requests: 5xx, timeouts, cut streams, error "
        "events inside a stream, and backend 4xx (400, 413, 429...) beyond the stable's own 4xx rate.",
    )
    max_error_rate_increase: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="Highest tolerated excess of the canary's failure rate over the stable's in the same window.",
    )
    max_p95_time_to_first_token_seconds: float | None = Field(default=None, gt=0)
    max_p95_latency_seconds: float | None = Field(default=None, gt=0)
    max_p95_ratio_to_stable: float = Field(
        default=2.0,
        ge=1,
        description="The canary's p95 latency and time to first token (successful requests only) may be at "
        "most this many times the stable's in the same window, plus 0.25 s.",
    )
    min_requests: int = Field(
        default=20,
        ge=1,
        description="Requests the canary must see in a window before any verdict (fewer: the step holds); "
        "a stable with fewer is no baseline for the comparison.",
    )
    failure_threshold: int = Field(default=1, ge=1, description="Failed checks that trigger a rollback.")


def stored_at_most(value: object, maximum: int) -> object:
    """A stored integer read as `maximum` when above it (a maximum added or lowered after objects were stored:
    they must keep validating, and routing); anything else as it is, for the field's own validation."""
    if isinstance(value, int) and not isinstance(value, bool) and value > maximum:
        return maximum
    return value


class Rollout(CelValidated):
    cel_rules = (
        CelRule(
            "self.steps.all(s, s > 0 && s <= 100)",
            "rollout.steps must be percentages between 1 and 100",
            lambda rollout: all(0 < step <= 100 for step in rollout.steps),
        ),
        CelRule(
            "self.steps.isSorted() && self.steps.all(s, self.steps.filter(t, t == s).size() == 1)",
            "rollout.steps must be increasing",
            lambda rollout: all(a < b for a, b in pairwise(rollout.steps)),
        ),
    )

    steps: list[int] = Field(default_factory=lambda: [5, 25, 50, 100], min_length=1, max_length=20)
    # Not refused above MAX_ROLLOUT_INTERVAL (longer ones were admitted before, and stored objects must keep
    # routing): the analysis window is capped there (servlane_core.rollout.schedule).
    interval: str = Field(
        default="1m",
        pattern=DURATION,
        max_length=32,
        description=f"Time per step, e.g. 30s, 2m, 1h; a longer one than {MAX_ROLLOUT_INTERVAL} counts as "
        f"{MAX_ROLLOUT_INTERVAL}.",
    )
    analysis: Analysis = Field(default_factory=Analysis)
    fixed_gpu_budget: bool = Field(
        default=False,
        description="Take the canary's replicas out of the stable model's replicas step by step "
        "instead of running both at full size.",
    )
    min_stable_replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_REPLICAS,  # it becomes the stable model's replicas: no more than the AIModel itself may ask
        description="With fixedGpuBudget: stable replicas always kept warm for a rollback.",
    )

    @field_validator("min_stable_replicas", mode="before")
    @classmethod
    def _stored_before_the_maximum(cls, value: object) -> object:
        # Unbounded before: an object stored then keeps validating (as ResponseCache.max_bytes), read as the
        # maximum. The CRD refuses new values above it.
        return stored_at_most(value, MAX_REPLICAS)

    progress_deadline_seconds: int = Field(
        default=600,
        ge=1,
        description="A rollout that gets no verdict this long (canary never Ready, no metrics, too few "
        "requests) is handled as onProgressDeadline says; at least two analysis intervals apply.",
    )
    on_progress_deadline: Literal["Rollback", "Pause"] = Field(
        default="Rollback", description="Rollback: all traffic back to the stable. Pause: hold until resumed."
    )


class FeatureDefaults(ApiModel):
    system_prompt: str | None = Field(default=None, max_length=32_768)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens_cap: int | None = Field(default=None, ge=1, description="Upper bound on max_tokens per request.")


MAX_RESPONSE_CACHE_BYTES = 256 << 20  # of one feature's answers: the gateway's default cap


# Opt-in: a hit tells its caller that the same request was made recently in this feature, so it stays off
# where callers must not learn of each other's requests. What is cached: docs/gateway.md, "Response cache".
class ResponseCache(ApiModel):
    enabled: bool = Field(default=False, description="Keep and serve again this feature's deterministic answers.")
    ttl_seconds: int = Field(default=300, ge=1, le=86_400, description="How long an answer is served again.")
    max_entries: int = Field(
        default=1000,
        ge=1,
        le=1_000_000,
        description="Most answers kept for the feature: per gateway replica, or in all with a shared Redis; "
        "the oldest go first.",
    )
    max_bytes: int = Field(
        default=16 << 20,
        ge=1024,
        le=MAX_RESPONSE_CACHE_BYTES,
        description="Most bytes of answers kept for the feature (per gateway process, or in the shared Redis); "
        "an answer larger than this is never kept. The gateway's own bounds (a share per namespace, a cap, "
        "a size per answer) may lower it further.",
    )

    @field_validator("max_bytes", mode="before")
    @classmethod
    def _stored_before_the_maximum_was_lowered(cls, value: object) -> object:
        # The maximum was 4 GiB. An object stored then keeps validating (the API server's validation
        # ratcheting lets it be updated while maxBytes is unchanged), so it must keep routing: read as the
        # maximum rather than left out of the route table. The CRD still refuses new values above it.
        return stored_at_most(value, MAX_RESPONSE_CACHE_BYTES)


# How the gateway picks a pod (an endpoint of the AIModel's Service) once it has picked the AIModel by weight.
RoutingPolicy = Literal["least-load", "prefix-affinity", "round-robin"]


class AIFeatureSpec(CelValidated):
    cel_rules = (
        CelRule(
            "[has(self.model), has(self.split)].filter(x, x).size() == 1",
            "set exactly one of model (a rollout target) or split (a fixed A/B split)",
            lambda spec: (spec.model is None) != (spec.split is None),
        ),
        CelRule(
            "!has(self.split) || self.split.map(s, s.weight).sum() == 100",
            "split weights must add up to 100",
            lambda spec: spec.split is None or sum(s.weight for s in spec.split) == 100,
        ),
    )

    model: ModelName | None = Field(
        default=None,
        description="The AIModel that should serve this feature, or one of its adapters as '<aimodel>:<adapter>'.",
    )
    split: list[WeightedModel] | None = Field(default=None, min_length=1, max_length=16)
    rollout: Rollout = Field(default_factory=Rollout)
    defaults: FeatureDefaults = Field(default_factory=FeatureDefaults)
    response_cache: ResponseCache = Field(
        default_factory=ResponseCache,
        description="The gateway answers a repeated deterministic request (temperature 0, or a seed) to the "
        "same model version again, without the backend.",
    )
    routing: RoutingPolicy = Field(
        default="least-load",
        description="How the gateway picks a pod of the chosen AIModel: least-load (the less busy of two "
        "random ready pods, by the gateway's requests in flight), prefix-affinity (the same prompt prefix, "
        "hence the same conversation, goes to the same pod while that pod is not overloaded: its KV cache "
        "is reused), or round-robin.",
    )


FeaturePhase = Literal["Pending", "Stable", "Progressing", "Paused", "RolledBack", "Split"]


class AnalysisResult(ApiModel):
    time: str
    step: int = Field(description="Index into rollout.steps of the step that was analysed.")
    canary_model: str | None = None
    canary_weight: int | None = None
    verdict: Literal["advance", "hold", "promote", "rollback"]
    outcome: Literal["pass", "fail", "inconclusive"] | None = Field(
        default=None, description="What the window showed; inconclusive: no metrics or too few requests."
    )
    window_seconds: float | None = None
    canary_requests: int = 0
    canary_error_rate: float | None = Field(default=None, description="5xx, timeouts, cut and errored streams.")
    canary_client_error_rate: float | None = Field(default=None, description="Backend 4xx answers.")
    canary_failure_rate: float | None = Field(
        default=None, description="Server errors plus the 4xx beyond the stable's rate: what maxErrorRate judges."
    )
    canary_p95_ttft_seconds: float | None = None
    canary_p95_latency_seconds: float | None = None
    stable_requests: int = 0
    stable_error_rate: float | None = None
    stable_client_error_rate: float | None = None
    stable_p95_ttft_seconds: float | None = None
    stable_p95_latency_seconds: float | None = None
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
    awaiting_verdict_since: str | None = Field(
        default=None,
        description="Since when the rollout has had no verdict; rollout.progressDeadlineSeconds counts from it.",
    )
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


class AIFeature(ApiObject, CelValidated):
    # The root of the CRD schema; crdgen writes these next to spec and status.
    cel_rules = (max_name_length(253),)

    kind: str = "AIFeature"
    spec: AIFeatureSpec
    status: AIFeatureStatus = Field(default_factory=AIFeatureStatus)
