"""kopf wiring: which events trigger what. Each handler is a few lines; the work is in models.py
(AIModels) and features.py (AIFeatures), the decisions in builders/, status.py and rollout/."""

from __future__ import annotations

import logging
import random
from typing import Any

import kopf
from prometheus_client import start_http_server

from modelplane_api import GROUP, VERSION
from modelplane_operator import features, models, opmetrics
from modelplane_operator.kube import Kube, load_client
from modelplane_operator.labels import GATEWAY_SELECTOR, MANAGED_BY, MODEL_LABEL, OPERATOR_NAME
from modelplane_operator.observed import DeploymentView, PodView
from modelplane_operator.rollout import MetricsReader
from modelplane_operator.rollout.prometheus_reader import PrometheusReader
from modelplane_operator.rollout.scrape_reader import ScrapeReader
from modelplane_operator.settings import OperatorSettings

SETTINGS = OperatorSettings.from_env()
OWNED = {MANAGED_BY: OPERATOR_NAME}


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    # kopf's bookkeeping goes to annotations under our prefix: nothing is ever written to spec.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    # Peers of equal priority all pause each other (kopf freezes on a tie); distinct random priorities
    # make exactly one replica active and the others stand by.
    settings.peering.priority = random.randint(1, 1_000_000)
    memo.kube = Kube(load_client())
    memo.reader = canary_reader(SETTINGS, memo.kube)
    start_http_server(SETTINGS.metrics_port)


def canary_reader(settings: OperatorSettings, kube: Kube) -> MetricsReader:
    """Prometheus when configured, else the gateway pods' /metrics scraped directly."""
    if settings.prometheus_url:
        return PrometheusReader(settings.prometheus_url)
    if settings.gateway_metrics_urls:
        return ScrapeReader(list(settings.gateway_metrics_urls))

    async def gateway_pods() -> list[str]:
        pods = await kube.list_pods(GATEWAY_SELECTOR, settings.gateway_namespace)
        ips = [p["status"].get("podIP") for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        return [f"http://{ip}:{settings.gateway_metrics_port}/metrics" for ip in ips if ip]

    return ScrapeReader(gateway_pods)


@kopf.index("apps", "v1", "deployments", labels=OWNED)
def deployments_by_model(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    return {(namespace, labels[MODEL_LABEL]): DeploymentView.parse(body)}


@kopf.index("", "v1", "pods", labels=OWNED)
def pods_by_model(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    return {(namespace, labels[MODEL_LABEL]): PodView.parse(body)}


@kopf.index(GROUP, VERSION, "aimodels")
def aimodels_by_key(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> Any:
    return {(namespace, name): dict(body)}


def _indexed(kwargs: dict[str, Any], index: str, key: Any) -> list[Any]:
    """Entries of one of the indexes above (kopf passes indexes as keyword arguments by name)."""
    return list(kwargs[index].get(key, []))


@kopf.index(GROUP, VERSION, "aifeatures")
def aifeatures_by_namespace(namespace: str | None, body: kopf.Body, **_: Any) -> Any:
    return {namespace: dict(body)}


def _override(kwargs: dict[str, Any], namespace: str, name: str) -> int | None:
    return features.replica_overrides(_indexed(kwargs, "aifeatures_by_namespace", namespace)).get(name)


@kopf.on.resume(GROUP, VERSION, "aimodels")
@kopf.on.create(GROUP, VERSION, "aimodels")
@kopf.on.update(GROUP, VERSION, "aimodels", field="spec")
async def reconcile_model(body: kopf.Body, namespace: str | None, name: str, memo: Any, **kwargs: Any) -> None:
    pods = _indexed(kwargs, "pods_by_model", (namespace or "", name))
    override = _override(kwargs, namespace or "", name)
    await models.reconcile(body, memo.kube, SETTINGS, pods, trigger="change", replicas_override=override)


@kopf.timer(GROUP, VERSION, "aimodels", interval=SETTINGS.resync_seconds, initial_delay=SETTINGS.resync_seconds)
async def resync_model(body: kopf.Body, namespace: str | None, name: str, memo: Any, **kwargs: Any) -> None:
    key = (namespace or "", name)
    known = next(iter(_indexed(kwargs, "deployments_by_model", key)), None)
    pods = _indexed(kwargs, "pods_by_model", key)
    override = _override(kwargs, key[0], name)
    await models.reconcile(
        body, memo.kube, SETTINGS, pods, trigger="resync", known_deployment=known, replicas_override=override
    )


@kopf.on.event("apps", "v1", "deployments", labels=OWNED)
@kopf.on.event("", "v1", "pods", labels=OWNED)
async def child_changed(namespace: str | None, labels: kopf.Labels, memo: Any, **kwargs: Any) -> None:
    key = (namespace or "", labels.get(MODEL_LABEL, ""))
    owner = next(iter(_indexed(kwargs, "aimodels_by_key", key)), None)
    if owner is None:
        return  # the AIModel is gone; garbage collection removes the child
    deployment = next(iter(_indexed(kwargs, "deployments_by_model", key)), None)
    pods = _indexed(kwargs, "pods_by_model", key)
    await models.refresh_status(owner, memo.kube, SETTINGS, deployment, pods)


@kopf.on.event(GROUP, VERSION, "aimodels")
async def model_changed(type: str, body: kopf.Body, namespace: str | None, name: str, memo: Any, **kwargs: Any) -> None:
    """Every AIModel event re-derives status from the children as last seen, against the event's own
    fresh copy: a status written from an older view of the children than the latest is corrected."""
    if type == "DELETED" or not (body.get("status") or {}).get("observedGeneration"):
        return  # not reconciled yet: the change handler writes the first status
    key = (namespace or "", name)
    deployment = next(iter(_indexed(kwargs, "deployments_by_model", key)), None)
    if deployment is None:
        return
    pods = _indexed(kwargs, "pods_by_model", key)
    await models.refresh_status(body, memo.kube, SETTINGS, deployment, pods)


@kopf.on.resume(GROUP, VERSION, "aifeatures")
@kopf.on.create(GROUP, VERSION, "aifeatures")
@kopf.on.update(GROUP, VERSION, "aifeatures", field="spec")
@kopf.timer(GROUP, VERSION, "aifeatures", interval=SETTINGS.analysis_interval_seconds)
async def reconcile_feature(body: kopf.Body, namespace: str | None, memo: Any, **kwargs: Any) -> None:
    ns = namespace or ""
    index = kwargs["aimodels_by_key"]
    in_namespace = {name: next(iter(index[(n, name)])) for (n, name) in index if n == ns}
    changed = await features.reconcile_feature(body, memo.kube, in_namespace, memo.reader)
    # Fixed-GPU-budget shares moved: re-apply those models now rather than at their next resync.
    for name, override in changed.items():
        if name in in_namespace:
            pods = _indexed(kwargs, "pods_by_model", (ns, name))
            await models.reconcile(
                in_namespace[name], memo.kube, SETTINGS, pods, trigger="budget", replicas_override=override
            )


@kopf.on.delete(GROUP, VERSION, "aimodels", optional=True)
async def model_deleted(namespace: str | None, name: str, **_: Any) -> None:
    # optional=True: no finalizer is added; the children go by garbage collection.
    opmetrics.forget(opmetrics.MODEL_PHASE, namespace or "", name, models.AIMODEL_PHASES)


@kopf.on.delete(GROUP, VERSION, "aifeatures", optional=True)
async def feature_deleted(namespace: str | None, name: str, **_: Any) -> None:
    opmetrics.forget(opmetrics.FEATURE_PHASE, namespace or "", name, features.FEATURE_PHASES)
