"""kopf wiring: which events trigger what. Each handler is a few lines; the work is in models.py."""

from __future__ import annotations

import logging
from typing import Any

import kopf
from prometheus_client import start_http_server

from modelplane_api import GROUP, VERSION
from modelplane_operator import models
from modelplane_operator.kube import Kube, load_client
from modelplane_operator.labels import MANAGED_BY, MODEL_LABEL, OPERATOR_NAME
from modelplane_operator.observed import DeploymentView, PodView
from modelplane_operator.settings import OperatorSettings

SETTINGS = OperatorSettings.from_env()
OWNED = {MANAGED_BY: OPERATOR_NAME}
ModelKey = tuple[str, str]


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    # kopf's bookkeeping goes to annotations under our prefix: nothing is ever written to spec.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    memo.kube = Kube(load_client())
    start_http_server(SETTINGS.metrics_port)


@kopf.index("apps", "v1", "deployments", labels=OWNED)
def deployments_by_model(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    return {(namespace, labels[MODEL_LABEL]): DeploymentView.parse(body)}


@kopf.index("", "v1", "pods", labels=OWNED)
def pods_by_model(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    return {(namespace, labels[MODEL_LABEL]): PodView.parse(body)}


@kopf.index(GROUP, VERSION, "aimodels")
def aimodels_by_key(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> Any:
    return {(namespace, name): dict(body)}


def _indexed(kwargs: dict[str, Any], index: str, key: ModelKey) -> list[Any]:
    """Entries of one of the indexes above (kopf passes indexes as keyword arguments by name)."""
    return list(kwargs[index].get(key, []))


@kopf.on.resume(GROUP, VERSION, "aimodels")
@kopf.on.create(GROUP, VERSION, "aimodels")
@kopf.on.update(GROUP, VERSION, "aimodels", field="spec")
async def reconcile_model(body: kopf.Body, namespace: str | None, name: str, memo: Any, **kwargs: Any) -> None:
    pods = _indexed(kwargs, "pods_by_model", (namespace or "", name))
    await models.reconcile(body, memo.kube, SETTINGS, pods, trigger="change")


@kopf.timer(GROUP, VERSION, "aimodels", interval=SETTINGS.resync_seconds, initial_delay=SETTINGS.resync_seconds)
async def resync_model(body: kopf.Body, namespace: str | None, name: str, memo: Any, **kwargs: Any) -> None:
    key = (namespace or "", name)
    known = next(iter(_indexed(kwargs, "deployments_by_model", key)), None)
    pods = _indexed(kwargs, "pods_by_model", key)
    await models.reconcile(body, memo.kube, SETTINGS, pods, trigger="resync", known_deployment=known)


@kopf.on.event("apps", "v1", "deployments", labels=OWNED)
@kopf.on.event("", "v1", "pods", labels=OWNED)
async def child_changed(namespace: str | None, labels: kopf.Labels, memo: Any, **kwargs: Any) -> None:
    key = (namespace or "", labels.get(MODEL_LABEL, ""))
    owner = next(iter(_indexed(kwargs, "aimodels_by_key", key)), None)
    if owner is None:
        return  # the AIModel is gone; garbage collection removes the child
    deployment = next(iter(_indexed(kwargs, "deployments_by_model", key)), None)
    await models.refresh_status(owner, memo.kube, SETTINGS, deployment, _indexed(kwargs, "pods_by_model", key))
