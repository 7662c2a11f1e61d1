"""Servlane's API: the custom resources as pydantic models, the single source of truth for the CRDs."""

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
