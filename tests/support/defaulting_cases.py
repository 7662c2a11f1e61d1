"""Partial manifests, shared by the unit test of the CRD defaults (tests/unit/test_crd_defaults.py) and the
API server one (e2e/test_crd_defaults.py): each must be accepted, and the spec the API server stores (its
defaults applied) must equal the spec pydantic makes of the same manifest.

Every case leaves out part of an object that has defaults, at some level: the API server then fills the
missing fields from the defaults declared on those very fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.support.cel_cases import Manifest, ai_feature, ai_model, feature_spec, model_spec


@dataclass(frozen=True)
class Partial:
    id: str
    manifest: Manifest


PARTIAL_MANIFESTS: tuple[Partial, ...] = (
    # --- AIFeature ---
    Partial("feature-bare", ai_feature(feature_spec())),
    Partial("rollout-empty", ai_feature(feature_spec(rollout={}))),
    Partial("rollout-only-interval", ai_feature(feature_spec(rollout={"interval": "30s"}))),
    Partial("rollout-only-analysis", ai_feature(feature_spec(rollout={"analysis": {"minRequests": 50}}))),
    Partial("rollout-only-empty-analysis", ai_feature(feature_spec(rollout={"analysis": {}}))),
    Partial("rollout-only-steps", ai_feature(feature_spec(rollout={"steps": [10, 100]}))),
    Partial("rollout-only-budget", ai_feature(feature_spec(rollout={"fixedGpuBudget": True}))),
    Partial("defaults-partial", ai_feature(feature_spec(defaults={"temperature": 0.2}))),
    Partial("response-cache-empty", ai_feature(feature_spec(responseCache={}))),
    Partial("response-cache-only-enabled", ai_feature(feature_spec(responseCache={"enabled": True}))),
    Partial("response-cache-only-ttl", ai_feature(feature_spec(responseCache={"ttlSeconds": 30}))),
    Partial(
        "split-with-partial-rollout",
        ai_feature({"split": [{"model": "a", "weight": 100}], "rollout": {"analysis": {"maxErrorRate": 0.1}}}),
    ),
    # --- AIModel ---
    Partial("model-bare", ai_model(model_spec())),
    Partial("autoscaling-only-max", ai_model(model_spec(resources={"cpu": "1"}, autoscaling={"maxReplicas": 3}))),
    Partial(
        "autoscaling-partial",
        ai_model(model_spec(autoscaling={"maxReplicas": 3, "minReplicas": 0, "scaleToZeroAfter": "30s"})),
    ),
    Partial("resources-only-gpus", ai_model(model_spec(resources={"gpus": 1}))),
    Partial("resources-only-memory", ai_model(model_spec(resources={"memory": "16Gi"}))),
    Partial("engine-options-only-max-len", ai_model(model_spec(engineOptions={"maxModelLen": 4096}))),
    Partial("engine-options-empty", ai_model(model_spec(engineOptions={}))),
    Partial("engine-options-only-tool-parser", ai_model(model_spec(engineOptions={"toolCallParser": "mistral"}))),
    Partial("scheduling-only-priority", ai_model(model_spec(scheduling={"priorityClassName": "high"}))),
    Partial(
        "scheduling-only-tolerations",
        ai_model(model_spec(scheduling={"tolerations": [{"key": "gpu", "operator": "Exists"}]})),
    ),
    Partial("cache-and-env", ai_model(model_spec(cache={"emptyDirSizeLimit": "5Gi"}, env=[{"name": "A"}]))),
)
