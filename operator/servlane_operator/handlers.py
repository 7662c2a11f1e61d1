"""kopf wiring: which events trigger what. Each handler is a few lines; the work is in
aimodel_reconciler.py and aifeature_reconciler.py, the decisions in builders/, status.py and
servlane_core.rollout.

No handler here may make kopf put a finalizer on an AIModel or AIFeature: deleting one must never wait
for the operator (it may be uninstalled first, crashed, or scaled to zero). So there are no kopf timers
or daemons (they always add one; periodic.py runs the periodic work instead) and no delete handlers
(the DELETED watch event does their work). Children go by garbage collection (their ownerReferences).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from datetime import UTC, datetime
from typing import Any

import kopf
from prometheus_client import start_http_server

from servlane_api import GROUP, VERSION
from servlane_api.targets import parse_target
from servlane_core.scaling.demand import demanded_model, is_fresh, renewed_at
from servlane_operator import aifeature_reconciler, aimodel_reconciler, operator_metrics, periodic
from servlane_operator.autoscaler import ReadyPod, autoscale, record_rollout_pin
from servlane_operator.context import OperatorContext
from servlane_operator.labels import MODEL_LABEL
from servlane_operator.lanes import Priority
from servlane_operator.observed import DeploymentView, PodView, aimodel_index_entry
from servlane_operator.peering import leads
from servlane_operator.watch_scope import DEMAND, DEPLOYMENTS, LEASES, OWNED, PODS, restrict_watches

log = logging.getLogger(__name__)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: OperatorContext, **_: Any) -> None:
    # kopf's bookkeeping goes to annotations under our prefix: nothing is ever written to spec.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    # Pods and Deployments: the API server sends only ours (the handlers' labels= filters run after the fact).
    restrict_watches(settings)
    # Peers of equal priority all pause each other (kopf freezes on a tie); distinct random priorities
    # make exactly one replica active and the others stand by.
    settings.peering.priority = random.randint(1, 1_000_000)
    memo.peering = settings.peering
    start_http_server(memo.settings.metrics_port)


@kopf.on.cleanup()
async def cleanup(memo: OperatorContext, **_: Any) -> None:
    for task in [*memo.periodic, *memo.refresh_tasks]:
        task.cancel()
    await memo.cold_starts.aclose()


def start_periodic(memo: OperatorContext, kwargs: dict[str, Any]) -> None:
    """Starts the periodic loops once, from the first object handler that runs: their tasks inherit its
    context, which kopf.event needs to post Events, and keep its indexes (live views, always current)."""
    if memo.periodic:
        return
    # kopf gives each object a shallow copy of the operator's memo: fill the one shared list in place.
    memo.periodic.extend(
        [
            asyncio.create_task(
                periodic.every(
                    memo.settings.resync_seconds, lambda: resync_models(memo, kwargs), lambda: may_act(memo), "resync"
                )
            ),
            asyncio.create_task(
                periodic.every(
                    memo.settings.autoscale_interval_seconds,
                    lambda: autoscale_models(memo, kwargs),
                    lambda: may_act(memo),
                    "autoscale",
                )
            ),
            asyncio.create_task(
                periodic.every(
                    memo.settings.analysis_interval_seconds,
                    lambda: analyse_features(memo, kwargs),
                    lambda: may_act(memo),
                    "canary analysis",
                )
            ),
        ]
    )


async def may_act(memo: OperatorContext) -> bool:
    """Standalone: always. With peering: only the replica kopf lets work (see peering.py)."""
    peering = memo.peering
    if peering is None:
        return False  # before kopf's startup: no round yet
    if peering.standalone:
        return True
    scopes: list[str | None] = [*memo.settings.namespaces] or [None]  # None: cluster-wide
    for namespace in scopes:
        body = await memo.kube.get_peering(peering.name, namespace)
        status = (body or {}).get("status") or {}
        peers = {key: value for key, value in status.items() if isinstance(value, dict)}
        if body is None or not leads(peers, peering.priority, datetime.now(UTC)):
            return False
    return True


@kopf.index(*DEPLOYMENTS, labels=OWNED)
def deployments_by_model(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    return {(namespace, labels[MODEL_LABEL]): DeploymentView.parse(body)}


@kopf.index(*PODS, labels=OWNED)
def pods_by_model(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    return {(namespace, labels[MODEL_LABEL]): PodView.parse(body)}


@kopf.index(*PODS, labels=OWNED)
def ready_pods_by_model(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    """The pods the autoscaler reads: ready, not terminating, with an address."""
    pod = ReadyPod.parse(body)
    return None if pod is None else {(namespace, labels[MODEL_LABEL]): pod}


@kopf.index(*LEASES, labels={**DEMAND, MODEL_LABEL: kopf.PRESENT})
def demand_by_model(namespace: str | None, name: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    """When each model's demand Lease was last renewed. A Lease counts only under its model's own name, in
    the model's own namespace: it can wake nothing else (servlane_core.scaling.demand)."""
    model = demanded_model(name, labels)
    return None if model is None else {(namespace, model): renewed_at(body)}


@kopf.index(GROUP, VERSION, "aimodels")
def aimodels_by_key(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> Any:
    return {(namespace, name): aimodel_index_entry(body)}


def _indexed(kwargs: dict[str, Any], index: str, key: Any) -> list[Any]:
    """Entries of one of the indexes above (kopf passes indexes as keyword arguments by name)."""
    return list(kwargs[index].get(key, []))


@kopf.index(GROUP, VERSION, "aifeatures")
def aifeatures_by_namespace(namespace: str | None, body: kopf.Body, **_: Any) -> Any:
    return {namespace: dict(body)}


def _live_replicas(kwargs: dict[str, Any], key: tuple[str, str]) -> int | None:
    """The replicas the model's Deployment runs now, as last seen (None: no Deployment yet)."""
    deployment: DeploymentView | None = next(iter(_indexed(kwargs, "deployments_by_model", key)), None)
    return None if deployment is None else deployment.desired


def _features(memo: OperatorContext, kwargs: dict[str, Any], namespace: str) -> list[Any]:
    """The namespace's AIFeatures, each with the status this process last wrote where its copy lags."""
    return [memo.feature_statuses.latest(body) for body in _indexed(kwargs, "aifeatures_by_namespace", namespace)]


def _override(memo: OperatorContext, kwargs: dict[str, Any], namespace: str, name: str) -> int | None:
    return aifeature_reconciler.replica_overrides(_features(memo, kwargs, namespace)).get(name)


@kopf.on.resume(GROUP, VERSION, "aimodels")
@kopf.on.create(GROUP, VERSION, "aimodels")
@kopf.on.update(GROUP, VERSION, "aimodels", field="spec")
async def reconcile_model(
    body: kopf.Body, reason: str, namespace: str | None, name: str, memo: OperatorContext, **kwargs: Any
) -> None:
    start_periodic(memo, kwargs)
    key = (namespace or "", name)
    async with memo.locks.hold(model_lock(key)), memo.lanes.slot(REASON_PRIORITY.get(reason, Priority.CREATE)):
        # Read after the wait for a slot: the children may have moved on meanwhile.
        latest = next(iter(_indexed(kwargs, "aimodels_by_key", key)), None)
        if latest is None:
            return  # deleted while waiting: nothing to apply (its children go by garbage collection)
        pods = _indexed(kwargs, "pods_by_model", key)
        override = _override(memo, kwargs, *key)
        current = memo.autoscaler.with_decision(latest, _live_replicas(kwargs, key))
        await aimodel_reconciler.reconcile(
            current, memo.kube, memo.settings, pods, trigger="change", replicas_override=override
        )


# A spec edit goes before new models, which go before the whole list again after a restart.
REASON_PRIORITY: dict[str, Priority] = {
    kopf.Reason.UPDATE: Priority.CHANGE,
    kopf.Reason.CREATE: Priority.CREATE,
    kopf.Reason.RESUME: Priority.RESUME,
}


async def resync_models(memo: OperatorContext, kwargs: dict[str, Any]) -> None:
    """Every resync_seconds: re-apply every AIModel's children, which puts hand edits back."""
    models = {key: next(iter(copies)) for key, copies in kwargs["aimodels_by_key"].items()}
    await periodic.each(
        "resync", ((f"{ns}/{name}", resync_model(body, memo, kwargs)) for (ns, name), body in models.items())
    )


async def resync_model(body: dict[str, Any], memo: OperatorContext, kwargs: dict[str, Any]) -> None:
    key = (body["metadata"].get("namespace", ""), body["metadata"]["name"])
    async with memo.locks.hold(model_lock(key)), memo.lanes.slot(Priority.RESYNC):
        latest: dict[str, Any] | None = next(iter(_indexed(kwargs, "aimodels_by_key", key)), None)
        if latest is None:
            return  # deleted while waiting
        known = next(iter(_indexed(kwargs, "deployments_by_model", key)), None)
        pods = _indexed(kwargs, "pods_by_model", key)
        override = _override(memo, kwargs, *key)
        current = memo.autoscaler.with_decision(latest, None if known is None else known.desired)
        await aimodel_reconciler.reconcile(
            current,
            memo.kube,
            memo.settings,
            pods,
            trigger="resync",
            known_deployment=known,
            replicas_override=override,
        )


@kopf.on.event(*DEPLOYMENTS, labels=OWNED)
@kopf.on.event(*PODS, labels=OWNED)
async def child_changed(namespace: str | None, labels: kopf.Labels, memo: OperatorContext, **kwargs: Any) -> None:
    start_periodic(memo, kwargs)
    request_refresh(memo, kwargs, (namespace or "", labels.get(MODEL_LABEL, "")))


def request_refresh(
    memo: OperatorContext, kwargs: dict[str, Any], key: tuple[str, str], *, only_once_applied: bool = False
) -> None:
    """Queues one status refresh of the model, unless one is already waiting, and returns at once.

    Returning at once matters: kopf handles one event per object at a time, so a handler that waited here
    for a slot (behind a burst of other models) would hold back that object's next event, a spec edit
    included. Waiting refreshes coalesce: the one that runs reads the indexes when its slot comes, so it
    writes the latest view of every event that arrived before, once."""
    pending = memo.refreshing
    if key in pending:  # one is waiting already: it will read what this event brought
        pending[key] = pending[key] and only_once_applied
        return
    pending[key] = only_once_applied
    task = asyncio.create_task(_refresh(memo, kwargs, key))
    memo.refresh_tasks.add(task)  # the loop keeps only weak references to tasks
    task.add_done_callback(memo.refresh_tasks.discard)


async def _refresh(memo: OperatorContext, kwargs: dict[str, Any], key: tuple[str, str]) -> None:
    try:
        await memo.lanes.acquire(Priority.STATUS)
    except asyncio.CancelledError:
        memo.refreshing.pop(key, None)
        raise
    try:
        # From here on, a new event queues another refresh: this one may already have read the indexes.
        only_once_applied = memo.refreshing.pop(key, False)
        owner = next(iter(_indexed(kwargs, "aimodels_by_key", key)), None)
        if owner is None:
            return  # the AIModel is gone; garbage collection removes the child
        deployment = next(iter(_indexed(kwargs, "deployments_by_model", key)), None)
        if deployment is None and only_once_applied:
            return  # not applied yet: the change handler writes the first status
        pods = _indexed(kwargs, "pods_by_model", key)
        await aimodel_reconciler.refresh_status(owner, memo.kube, memo.settings, deployment, pods)
    except Exception:  # the next event or resync writes it; kopf would only have logged it too
        log.exception("status refresh of %s/%s failed", *key)
    finally:
        memo.lanes.release()


@kopf.on.event(*PODS, labels=OWNED)
async def pod_changed(body: kopf.Body, memo: OperatorContext, **_: Any) -> None:
    """A model pod that turned Ready: its cold start goes to its AIModel's status (in the background)."""
    memo.cold_starts.observe(body)


@kopf.on.event(GROUP, VERSION, "aimodels")
async def model_changed(
    type: str, body: kopf.Body, namespace: str | None, name: str, memo: OperatorContext, **kwargs: Any
) -> None:
    """Every AIModel event re-derives status from the children as last seen, against the AIModel's latest
    copy (kopf updates the index before handlers run): a status written from an older view of the children
    than the latest is corrected."""
    start_periodic(memo, kwargs)
    if type == "DELETED":
        # Its children go by garbage collection (ownerReferences); only our own metric series is left.
        operator_metrics.forget(operator_metrics.MODEL_PHASE, namespace or "", name, aimodel_reconciler.AIMODEL_PHASES)
        memo.cold_starts.forget_model(namespace or "", name)
        return
    if not (body.get("status") or {}).get("observedGeneration"):
        return  # not reconciled yet: the change handler writes the first status
    request_refresh(memo, kwargs, (namespace or "", name), only_once_applied=True)


@kopf.on.resume(GROUP, VERSION, "aifeatures")
@kopf.on.create(GROUP, VERSION, "aifeatures")
@kopf.on.update(GROUP, VERSION, "aifeatures", field="spec")
async def reconcile_feature(
    body: kopf.Body, namespace: str | None, name: str, memo: OperatorContext, **kwargs: Any
) -> None:
    start_periodic(memo, kwargs)
    await feature_pass(namespace or "", name, memo, kwargs)


async def analyse_features(memo: OperatorContext, kwargs: dict[str, Any]) -> None:
    """Every analysis_interval_seconds: one pass of every AIFeature's rollout controller."""
    index = kwargs["aifeatures_by_namespace"]
    features = [(ns or "", body["metadata"]["name"]) for ns, copies in index.items() for body in copies]
    await periodic.each(
        "canary analysis", ((f"{ns}/{name}", feature_pass(ns, name, memo, kwargs)) for ns, name in features)
    )


def model_lock(key: tuple[str, str]) -> tuple[str, str, str]:
    return ("AIModel", *key)


async def feature_pass(ns: str, name: str, memo: OperatorContext, kwargs: dict[str, Any]) -> None:
    """One rollout pass of a feature, one at a time per feature (the change handler and the periodic
    analysis may both start one), from its latest copy and the status this process last wrote."""
    async with memo.locks.hold(("AIFeature", ns, name)):
        copies = _indexed(kwargs, "aifeatures_by_namespace", ns)
        found = next((b for b in copies if b["metadata"]["name"] == name), None)
        if found is None:
            return  # deleted meanwhile
        await _feature_pass(memo.feature_statuses.latest(found), ns, memo, kwargs)


async def _feature_pass(body: Any, ns: str, memo: OperatorContext, kwargs: dict[str, Any]) -> None:
    # Only the models this feature refers to: a pass costs the same with ten or a thousand models around.
    index = kwargs["aimodels_by_key"]
    wanted = aifeature_reconciler.referenced(body)
    # A target may be an adapter (`model:adapter`): its AIModel is what exists, has pods and readiness.
    models = {name: (ns, parse_target(name).model) for name in sorted(wanted)}
    in_namespace = {name: next(iter(index[key])) for name, key in models.items() if key in index}
    new_status = await aifeature_reconciler.reconcile_feature(body, memo.kube, in_namespace, memo.reader)
    memo.feature_statuses.wrote(body, new_status.model_dump(by_alias=True, mode="json"))
    # Fixed-GPU-budget shares moved: re-apply those models now rather than at their next resync, with the
    # override merged over every feature of the namespace (another one may share the model).
    name_of = body["metadata"]["name"]
    others = [f for f in _features(memo, kwargs, ns) if f["metadata"]["name"] != name_of]
    before = aifeature_reconciler.feature_status(body)
    moves = aifeature_reconciler.override_moves(others, before, new_status)
    for name, (previous, override) in moves.items():
        if name in in_namespace:
            key = (ns, name)
            async with memo.locks.hold(model_lock(key)), memo.lanes.slot(Priority.CHANGE):
                model = next(iter(_indexed(kwargs, "aimodels_by_key", key)), None)
                if model is None:
                    continue  # deleted meanwhile
                pods = _indexed(kwargs, "pods_by_model", key)
                # An autoscaled model resumes from its last pin when released, so each pin is its decision.
                await record_rollout_pin(model, memo.kube, memo.autoscaler, pinned=override, released_from=previous)
                current = memo.autoscaler.with_decision(model, _live_replicas(kwargs, key))
                await aimodel_reconciler.reconcile(
                    current, memo.kube, memo.settings, pods, trigger="budget", replicas_override=override
                )


async def autoscale_models(memo: OperatorContext, kwargs: dict[str, Any]) -> None:
    """Every autoscale_interval_seconds: one autoscaler pass of every autoscaled AIModel."""
    keys = [
        key
        for key, copies in kwargs["aimodels_by_key"].items()
        if (next(iter(copies)).get("spec") or {}).get("autoscaling")
    ]
    for key in list(memo.autoscaler.states):
        if key not in keys:
            memo.autoscaler.forget(key)  # deleted, or autoscaling turned off: a later one starts afresh
    await periodic.each("autoscale", ((f"{ns}/{name}", autoscale_model(memo, kwargs, (ns, name))) for ns, name in keys))


async def autoscale_model(
    memo: OperatorContext, kwargs: dict[str, Any], key: tuple[str, str], *, demand: bool = False
) -> None:
    async with memo.locks.hold(model_lock(key)), memo.lanes.slot(Priority.CHANGE):
        body = next(iter(_indexed(kwargs, "aimodels_by_key", key)), None)
        deployment = next(iter(_indexed(kwargs, "deployments_by_model", key)), None)
        if body is None or deployment is None:
            return  # deleted, or not applied yet (the change handler applies it first)
        now = time.time()
        demand = demand or any(is_fresh(renewed, now) for renewed in _indexed(kwargs, "demand_by_model", key))
        await autoscale(
            body,
            memo.kube,
            memo.settings,
            memo.autoscaler,
            deployment,
            _indexed(kwargs, "ready_pods_by_model", key),
            _indexed(kwargs, "pods_by_model", key),
            demand=demand,
            pinned=_override(memo, kwargs, *key),
        )


@kopf.on.event(*LEASES, labels={**DEMAND, MODEL_LABEL: kopf.PRESENT})
async def demand_changed(
    type: str,
    body: kopf.Body,
    namespace: str | None,
    name: str,
    labels: kopf.Labels,
    memo: OperatorContext,
    **kwargs: Any,
) -> None:
    """A fresh demand Lease wakes its model at zero at once, not at the next autoscaler pass."""
    start_periodic(memo, kwargs)
    model = demanded_model(name, labels)
    if type == "DELETED" or model is None or not is_fresh(renewed_at(body), time.time()):
        return
    key = (namespace or "", model)
    deployment = next(iter(_indexed(kwargs, "deployments_by_model", key)), None)
    if deployment is None or deployment.desired > 0:
        return  # not at zero: the periodic pass sees the demand too
    await autoscale_model(memo, kwargs, key, demand=True)


# No @kopf.on.delete: even an optional one is skipped when an object without a finalizer vanishes at
# once. The watch's DELETED event always reaches these low-level handlers while the operator runs; when
# it does not run, its in-memory metrics are gone anyway and a restart never sees the deleted object.
@kopf.on.event(GROUP, VERSION, "aifeatures")
async def feature_event(type: str, namespace: str | None, name: str, memo: OperatorContext, **kwargs: Any) -> None:
    start_periodic(memo, kwargs)
    if type == "DELETED":
        memo.feature_statuses.forget(str((kwargs.get("body") or {}).get("metadata", {}).get("uid", "")))
        operator_metrics.forget(
            operator_metrics.FEATURE_PHASE, namespace or "", name, aifeature_reconciler.FEATURE_PHASES
        )
