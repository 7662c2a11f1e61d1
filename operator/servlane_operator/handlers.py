"""kopf wiring: which events trigger what. Each handler is a few lines; the passes are in model_passes.py,
feature_passes.py and status_refresh.py, the work in aimodel_reconciler.py and aifeature_reconciler.py,
the decisions in builders/, status.py and servlane_core.

No handler here may make kopf put a finalizer on an AIModel or AIFeature: deleting one must never wait
for the operator (it may be uninstalled first, crashed, or scaled to zero). So there are no kopf timers
or daemons (they always add one; loops.py runs the periodic work instead) and no delete handlers
(the DELETED watch event does their work). Children go by garbage collection (their ownerReferences).
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import kopf
from prometheus_client import start_http_server

from servlane_api import GROUP, VERSION
from servlane_core.scaling.demand import demanded_model, is_fresh, renewed_at
from servlane_operator import aifeature_reconciler, aimodel_reconciler, operator_metrics
from servlane_operator.autoscaler import ReadyPod
from servlane_operator.context import OperatorContext
from servlane_operator.feature_passes import feature_pass
from servlane_operator.indexes import Indexes
from servlane_operator.labels import MODEL_LABEL
from servlane_operator.lanes import Priority
from servlane_operator.loops import start_loops
from servlane_operator.model_passes import apply_model, autoscale_model
from servlane_operator.observed import DeploymentView, PodView, aimodel_index_entry
from servlane_operator.status_refresh import request_refresh
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


# The indexes (indexes.py reads them): kopf keeps each up to date from its watch.
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


@kopf.index(GROUP, VERSION, "aifeatures")
def aifeatures_by_namespace(namespace: str | None, body: kopf.Body, **_: Any) -> Any:
    return {namespace: dict(body)}


def _started(memo: OperatorContext, kwargs: dict[str, Any]) -> Indexes:
    """The indexes of this call; the periodic loops start from the first handler that runs."""
    indexes = Indexes(kwargs)
    start_loops(memo, indexes)
    return indexes


# A spec edit goes before new models, which go before the whole list again after a restart.
REASON_PRIORITY: dict[str, Priority] = {
    kopf.Reason.UPDATE: Priority.CHANGE,
    kopf.Reason.CREATE: Priority.CREATE,
    kopf.Reason.RESUME: Priority.RESUME,
}


@kopf.on.resume(GROUP, VERSION, "aimodels")
@kopf.on.create(GROUP, VERSION, "aimodels")
@kopf.on.update(GROUP, VERSION, "aimodels", field="spec")
async def reconcile_model(reason: str, namespace: str | None, name: str, memo: OperatorContext, **kwargs: Any) -> None:
    indexes = _started(memo, kwargs)
    priority = REASON_PRIORITY.get(reason, Priority.CREATE)
    await apply_model(memo, indexes, (namespace or "", name), trigger="change", priority=priority)


@kopf.on.event(*DEPLOYMENTS, labels=OWNED)
@kopf.on.event(*PODS, labels=OWNED)
async def child_changed(namespace: str | None, labels: kopf.Labels, memo: OperatorContext, **kwargs: Any) -> None:
    request_refresh(memo, _started(memo, kwargs), (namespace or "", labels.get(MODEL_LABEL, "")))


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
    indexes = _started(memo, kwargs)
    if type == "DELETED":
        # Its children go by garbage collection (ownerReferences); only our own metric series is left.
        operator_metrics.forget(operator_metrics.MODEL_PHASE, namespace or "", name, aimodel_reconciler.AIMODEL_PHASES)
        memo.cold_starts.forget_model(namespace or "", name)
        return
    if not (body.get("status") or {}).get("observedGeneration"):
        return  # not reconciled yet: the change handler writes the first status
    request_refresh(memo, indexes, (namespace or "", name), only_once_applied=True)


@kopf.on.resume(GROUP, VERSION, "aifeatures")
@kopf.on.create(GROUP, VERSION, "aifeatures")
@kopf.on.update(GROUP, VERSION, "aifeatures", field="spec")
async def reconcile_feature(namespace: str | None, name: str, memo: OperatorContext, **kwargs: Any) -> None:
    await feature_pass(memo, _started(memo, kwargs), namespace or "", name)


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
    indexes = _started(memo, kwargs)
    model = demanded_model(name, labels)
    if type == "DELETED" or model is None or not is_fresh(renewed_at(body), time.time()):
        return
    key = (namespace or "", model)
    deployment = indexes.deployment(key)
    if deployment is None or deployment.desired > 0:
        return  # not at zero: the periodic pass sees the demand too
    await autoscale_model(memo, indexes, key, demand=True)


# No @kopf.on.delete: even an optional one is skipped when an object without a finalizer vanishes at
# once. The watch's DELETED event always reaches these low-level handlers while the operator runs; when
# it does not run, its in-memory metrics are gone anyway and a restart never sees the deleted object.
@kopf.on.event(GROUP, VERSION, "aifeatures")
async def feature_event(
    type: str, body: kopf.Body, namespace: str | None, name: str, memo: OperatorContext, **kwargs: Any
) -> None:
    _started(memo, kwargs)
    if type == "DELETED":
        memo.feature_statuses.forget(str(body.get("metadata", {}).get("uid", "")))
        operator_metrics.forget(
            operator_metrics.FEATURE_PHASE, namespace or "", name, aifeature_reconciler.FEATURE_PHASES
        )
