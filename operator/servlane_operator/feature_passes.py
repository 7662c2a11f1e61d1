"""One AIFeature's rollout pass and what it moves across resources: the AIModels whose pins it changed.

A feature's passes take turns (its change handler and the periodic analysis may both start one), each from
the feature's latest copy with the status this process last wrote (written_status.py). Only the models the
feature refers to are read: a pass costs the same with ten or a thousand models around.
"""

from __future__ import annotations

from typing import Any

from servlane_api.targets import parse_target
from servlane_operator import aifeature_reconciler, periodic
from servlane_operator.context import OperatorContext
from servlane_operator.indexes import Indexes
from servlane_operator.lanes import Priority
from servlane_operator.model_passes import apply_model, features


async def analyse_features(context: OperatorContext, indexes: Indexes) -> None:
    """Every analysis_interval_seconds: one pass of every AIFeature's rollout controller."""
    await periodic.each(
        "canary analysis",
        ((f"{ns}/{name}", feature_pass(context, indexes, ns, name)) for ns, name in indexes.feature_keys()),
    )


async def feature_pass(context: OperatorContext, indexes: Indexes, namespace: str, name: str) -> None:
    async with context.locks.hold(("AIFeature", namespace, name)):
        found = next((b for b in indexes.features(namespace) if b["metadata"]["name"] == name), None)
        if found is None:
            return  # deleted meanwhile
        await _pass(context, indexes, namespace, context.feature_statuses.latest(found))


async def _pass(context: OperatorContext, indexes: Indexes, namespace: str, body: Any) -> None:
    # A target may be an adapter (`model:adapter`): its AIModel is what exists, has pods and readiness.
    models = {
        target: (namespace, parse_target(target).model) for target in sorted(aifeature_reconciler.referenced(body))
    }
    in_namespace = {target: model for target, key in models.items() if (model := indexes.model(key)) is not None}
    new_status = await aifeature_reconciler.reconcile_feature(body, context.kube, in_namespace, context.reader)
    context.feature_statuses.wrote(body, new_status.model_dump(by_alias=True, mode="json"))
    # Fixed-GPU-budget shares moved: re-apply those models now rather than at their next resync, with the
    # pins merged over every feature of the namespace (another one may share the model).
    name = body["metadata"]["name"]
    others = [f for f in features(context, indexes, namespace) if f["metadata"]["name"] != name]
    before = aifeature_reconciler.feature_status(body)
    for moved, (previous, _pinned) in aifeature_reconciler.override_moves(others, before, new_status).items():
        if moved in in_namespace:
            await apply_model(
                context, indexes, (namespace, moved), trigger="budget", priority=Priority.CHANGE, released_from=previous
            )
