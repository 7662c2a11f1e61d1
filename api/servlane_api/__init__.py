"""Servlane's API: the contracts between its processes.

The custom resources as pydantic models (the single source of truth for the CRDs) and how a manifest is
read into them (manifests), the runtime's configuration and how it follows from an AIModel (runtime_config,
runtime_contract), the pod environment and exit codes the operator and the runtime agree on (pod_env,
runtime_exit), and the metric names the gateway writes and the canaries read (metric_names).
"""

from servlane_api.aifeature import AIFeature, AIFeatureSpec, AIFeatureStatus
from servlane_api.aimodel import AIModel, AIModelSpec, AIModelStatus, Engine
from servlane_api.conditions import Condition

GROUP = "servlane.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

__all__ = [
    "API_VERSION",
    "GROUP",
    "VERSION",
    "AIFeature",
    "AIFeatureSpec",
    "AIFeatureStatus",
    "AIModel",
    "AIModelSpec",
    "AIModelStatus",
    "Condition",
    "Engine",
]
