"""Everything an AIModel should own, decided in one pure step (then applied by the handler)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servlane_api.aimodel import AIModel
from servlane_operator.builders.adapters import build_adapters_config_map
from servlane_operator.builders.deployment import build_deployment
from servlane_operator.builders.network_policy import build_network_policy
from servlane_operator.builders.service import build_service
from servlane_operator.settings import OperatorSettings


@dataclass(frozen=True)
class ChildPlan:
    apply: list[dict[str, Any]]
    # (apiVersion, kind) of children that must not exist, e.g. the NetworkPolicy once it is switched off.
    delete: list[tuple[str, str]]


# Operators before the scale subresource gave autoscaled models an HPA of their own on the Deployment: it
# would fight the operator's autoscaler over the replicas, so the one it owns goes (a user's own HPA on the
# AIModel's scale subresource is no child and is never touched).
LEGACY_HPA = ("autoscaling/v2", "HorizontalPodAutoscaler")


def plan_children(
    model: AIModel, settings: OperatorSettings, replicas_override: int | None = None, *, replace_all: bool = False
) -> ChildPlan:
    """`replicas_override` (a fixed-GPU-budget canary's share) pins the replicas, over the autoscaler's;
    `replace_all` (deployment.replaces_all_pods) replaces the pods at once when none is ready."""
    apply = [build_deployment(model, settings, replicas_override, replace_all=replace_all), build_service(model)]
    delete: list[tuple[str, str]] = [LEGACY_HPA]
    # Before the Deployment would be better for a first start, but children apply concurrently: a pod that
    # starts before its ConfigMap exists waits for it (the kubelet retries the mount).
    adapters = build_adapters_config_map(model)
    if adapters is not None:
        apply.append(adapters)
    policy = build_network_policy(model, settings)
    if policy is None:
        delete.append(("networking.k8s.io/v1", "NetworkPolicy"))
    else:
        apply.append(policy)
    return ChildPlan(apply=apply, delete=delete)
