"""kopf's in-memory indexes, read by name with their types.

handlers.py declares them (`@kopf.index`); kopf passes them to every handler as keyword arguments, live
views that always hold the latest copy it saw of each object. The periodic loops keep the ones of the
handler that started them. Here they are read as what they hold, not as `kwargs: dict[str, Any]`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from servlane_operator.autoscaler import ReadyPod
from servlane_operator.observed import DeploymentView, PodView

ModelKey = tuple[str, str]  # (namespace, AIModel name)


@dataclass(frozen=True)
class Indexes:
    raw: Mapping[str, Any]

    def _entries(self, index: str, key: Any) -> list[Any]:
        return list(self.raw[index].get(key, []))

    def model(self, key: ModelKey) -> dict[str, Any] | None:
        """The AIModel's latest copy (None: deleted, or never seen)."""
        return next(iter(self._entries("aimodels_by_key", key)), None)

    def models(self) -> dict[ModelKey, dict[str, Any]]:
        return {key: next(iter(copies)) for key, copies in self.raw["aimodels_by_key"].items()}

    def deployment(self, key: ModelKey) -> DeploymentView | None:
        return next(iter(self._entries("deployments_by_model", key)), None)

    def live_replicas(self, key: ModelKey) -> int | None:
        """The replicas the model's Deployment runs now, as last seen (None: no Deployment yet)."""
        deployment = self.deployment(key)
        return None if deployment is None else deployment.desired

    def pods(self, key: ModelKey) -> list[PodView]:
        return self._entries("pods_by_model", key)

    def ready_pods(self, key: ModelKey) -> list[ReadyPod]:
        return self._entries("ready_pods_by_model", key)

    def demand_renewals(self, key: ModelKey) -> list[float | None]:
        return self._entries("demand_by_model", key)

    def features(self, namespace: str) -> list[dict[str, Any]]:
        return self._entries("aifeatures_by_namespace", namespace)

    def feature_keys(self) -> list[tuple[str, str]]:
        index = self.raw["aifeatures_by_namespace"]
        return [(ns or "", body["metadata"]["name"]) for ns, copies in index.items() for body in copies]
