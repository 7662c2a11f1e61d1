"""Reconciling AIFeatures: read canary metrics when an analysis is due, run the pure rollout plan,
write status, post events. Every decision is in rollout/; this module only does the I/O around it."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, cast, get_args

import kopf
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from modelplane_api.aifeature import AIFeature, FeaturePhase, ModelReplicas
from modelplane_api.aimodel import AIModel
from modelplane_operator import opmetrics
from modelplane_operator.kube import Kube
from modelplane_operator.rollout import (
    MetricsReader,
    MetricsUnavailableError,
    analysis_due,
    budget_replicas,
    models_to_measure,
    plan,
)
from modelplane_operator.rollout.timeutil import parse_duration

log = logging.getLogger(__name__)
FEATURE_PHASES = get_args(FeaturePhase)


def parse_feature(body: Mapping[str, Any]) -> AIFeature:
    try:
        return AIFeature.model_validate(dict(body))
    except ValidationError as exc:
        raise kopf.PermanentError(f"invalid AIFeature: {exc.errors()[0]['msg']}") from exc


def model_ready(body: Mapping[str, Any]) -> bool:
    conditions = (body.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def budget_of(model: Mapping[str, Any]) -> int:
    """The replica count an AIModel asks for itself: the budget a fixed-GPU canary is carved from."""
    spec = AIModel.model_validate(dict(model)).spec
    if spec.autoscaling is not None:
        return spec.autoscaling.min_replicas
    return 1 if spec.replicas is None else spec.replicas


async def reconcile_feature(
    body: Mapping[str, Any],
    kube: Kube,
    models: Mapping[str, Mapping[str, Any]],
    reader: MetricsReader,
    *,
    now: datetime | None = None,
) -> dict[str, int | None]:
    """One pass of the rollout controller. `models` are the AIModels of the feature's namespace by name.
    Returns the AIModels whose fixed-budget replicas changed, with their new override (None: released),
    so the caller re-applies their Deployments at once."""
    started = time.perf_counter()
    feature = parse_feature(body)
    spec, status = feature.spec, feature.status
    now = now or datetime.now(UTC)
    metrics = None
    if analysis_due(spec, status, now):
        try:
            window = parse_duration(spec.rollout.interval)
            metrics = await reader.read(feature.name, models_to_measure(status), window)
        except MetricsUnavailableError as exc:
            log.warning("canary metrics for %s/%s unavailable: %s", feature.namespace, feature.name, exc)
    ready = {name: model_ready(model) for name, model in models.items()}
    annotations = feature.metadata.get("annotations") or {}
    generation = int(feature.metadata.get("generation", 0))
    result = plan(spec, status, ready, metrics, now, annotations, generation)

    new_status = result.status
    stable = new_status.stable_model
    if stable is not None and stable in models:
        overrides = budget_replicas(spec, new_status, budget_of(models[stable]))
        new_status.replica_overrides = [ModelReplicas(model=m, replicas=r) for m, r in sorted(overrides.items())]
    patch = new_status.model_dump(by_alias=True, mode="json")
    if patch != status.model_dump(by_alias=True, mode="json"):
        await kube.patch_status(feature.api_version, feature.kind, feature.namespace, feature.name, patch)
        opmetrics.STATUS_WRITES.labels("AIFeature").inc()
    opmetrics.set_phase(opmetrics.FEATURE_PHASE, feature.namespace, feature.name, new_status.phase, FEATURE_PHASES)
    if new_status.phase == "RolledBack" and status.phase != "RolledBack":
        opmetrics.ROLLBACKS.labels(feature.namespace, feature.name).inc()
    event_body = kopf.Body(cast(kopf.RawBody, dict(body)))
    for event in result.events:
        kopf.event(event_body, type=event.type, reason=event.reason, message=event.message)
    if result.consumed_annotation is not None:
        await _remove_annotation(kube, feature, result.consumed_annotation)
    opmetrics.RECONCILES.labels("AIFeature", "analysis" if metrics else "change", "ok").inc()
    opmetrics.RECONCILE_SECONDS.labels("AIFeature").observe(time.perf_counter() - started)
    before = {o.model: o.replicas for o in status.replica_overrides}
    after = {o.model: o.replicas for o in new_status.replica_overrides}
    return {m: after.get(m) for m in sorted(before.keys() | after.keys()) if before.get(m) != after.get(m)}


async def _remove_annotation(kube: Kube, feature: AIFeature, key: str) -> None:
    """A consumed rollout command is removed (metadata, not spec) so it acts once."""
    try:
        await kube.patch_metadata(
            feature.api_version, feature.kind, feature.namespace, feature.name, {"annotations": {key: None}}
        )
    except ApiException as exc:
        if exc.status != 404:
            raise


def replica_overrides(features: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """AIModel name → replicas imposed by fixed-GPU-budget rollouts of the given features."""
    out: dict[str, int] = {}
    for body in features:
        for item in (body.get("status") or {}).get("replicaOverrides") or []:
            out[str(item["model"])] = int(item["replicas"])
    return out
