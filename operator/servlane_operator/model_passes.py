"""What the operator does to one AIModel's children, whatever asked: a spec change, the periodic resync,
a fixed-GPU-budget move, the autoscaler, a demand Lease.

Every pass holds the model's lock (object_locks.py), then a lane slot, and only then reads what it applies:
the model's latest copy, the replicas any rollout pins it to (from every feature of the namespace, as this
process last wrote them), the autoscaler's decision. So two passes never apply different counts out of
order, and none applies what was true before it waited.
"""

from __future__ import annotations

import time
from typing import Any

from servlane_core.scaling.demand import is_fresh
from servlane_operator import aifeature_reconciler, aimodel_reconciler, periodic
from servlane_operator.autoscaler import autoscale, record_rollout_pin
from servlane_operator.context import OperatorContext
from servlane_operator.indexes import Indexes, ModelKey
from servlane_operator.lanes import Priority


def model_lock(key: ModelKey) -> tuple[str, str, str]:
    return ("AIModel", *key)


def features(context: OperatorContext, indexes: Indexes, namespace: str) -> list[dict[str, Any]]:
    """The namespace's AIFeatures, each with the status this process last wrote where its copy lags."""
    return [dict(context.feature_statuses.latest(body)) for body in indexes.features(namespace)]


def pinned_replicas(context: OperatorContext, indexes: Indexes, key: ModelKey) -> int | None:
    """The replicas the namespace's fixed-GPU-budget rollouts pin the model to (None: its own count)."""
    return aifeature_reconciler.replica_overrides(features(context, indexes, key[0])).get(key[1])


async def apply_model(
    context: OperatorContext,
    indexes: Indexes,
    key: ModelKey,
    *,
    trigger: str,
    priority: Priority,
    released_from: int | None = None,
) -> None:
    """Applies the model's children as they should be now. `trigger="budget"`: a rollout moved the
    model's pin (`released_from`: the pin it had), recorded as its autoscaler's decision first."""
    async with context.locks.hold(model_lock(key)), context.lanes.slot(priority):
        latest = indexes.model(key)
        if latest is None:
            return  # deleted while waiting: nothing to apply (its children go by garbage collection)
        known = indexes.deployment(key)
        pinned = pinned_replicas(context, indexes, key)
        if trigger == "budget":
            # An autoscaled model resumes from its last pin when released, so each pin is its decision.
            await record_rollout_pin(
                latest, context.kube, context.autoscaler, pinned=pinned, released_from=released_from
            )
        current = context.autoscaler.with_decision(latest, None if known is None else known.desired)
        await aimodel_reconciler.reconcile(
            current,
            context.kube,
            context.settings,
            indexes.pods(key),
            trigger=trigger,
            known_deployment=known,
            replicas_override=pinned,
        )


async def resync_models(context: OperatorContext, indexes: Indexes) -> None:
    """Every resync_seconds: re-apply every AIModel's children, which puts hand edits back."""
    await periodic.each(
        "resync",
        (
            (f"{ns}/{name}", apply_model(context, indexes, (ns, name), trigger="resync", priority=Priority.RESYNC))
            for ns, name in indexes.models()
        ),
    )


async def autoscale_models(context: OperatorContext, indexes: Indexes) -> None:
    """Every autoscale_interval_seconds: one autoscaler pass of every autoscaled AIModel."""
    keys = [key for key, body in indexes.models().items() if (body.get("spec") or {}).get("autoscaling")]
    for key in list(context.autoscaler.states):
        if key not in keys:
            context.autoscaler.forget(key)  # deleted, or autoscaling turned off: a later one starts afresh
    await periodic.each(
        "autoscale", ((f"{ns}/{name}", autoscale_model(context, indexes, (ns, name))) for ns, name in keys)
    )


async def autoscale_model(context: OperatorContext, indexes: Indexes, key: ModelKey, *, demand: bool = False) -> None:
    async with context.locks.hold(model_lock(key)), context.lanes.slot(Priority.CHANGE):
        body = indexes.model(key)
        deployment = indexes.deployment(key)
        if body is None or deployment is None:
            return  # deleted, or not applied yet (the change handler applies it first)
        now = time.time()
        demand = demand or any(is_fresh(renewed, now) for renewed in indexes.demand_renewals(key))
        await autoscale(
            body,
            context.kube,
            context.settings,
            context.autoscaler,
            deployment,
            indexes.ready_pods(key),
            indexes.pods(key),
            demand=demand,
            pinned=pinned_replicas(context, indexes, key),
        )
