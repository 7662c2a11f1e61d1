"""Modelplane's API: the custom resources as pydantic models, the single source of truth for the CRDs."""

from modelplane_api.aifeature import AIFeature, AIFeatureSpec, AIFeatureStatus
from modelplane_api.aimodel import AIModel, AIModelSpec, AIModelStatus, Engine
from modelplane_api.conditions import Condition

GROUP = "modelplane.dev"
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
