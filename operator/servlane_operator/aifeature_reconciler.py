"""Reconciling AIFeatures: read canary metrics when an analysis is due, run the pure rollout plan,
write status, post events. Every decision is in servlane_core.rollout; this module only does the I/O around it."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, cast, get_args

import kopf
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from servlane_api.aifeature import AIFeature, FeaturePhase, ModelReplicas
from servlane_api.aimodel import AIModel
from servlane_core.rollout import (
    MetricsOutage,
    MetricsReader,
    MetricsUnavailableError,
    WindowMetrics,
    analysis_due,
    analysis_window_seconds,
    budget_replicas,
    models_to_measure,
    plan,
)
from servlane_operator import operator_metrics
from servlane_operator.kube import Kube

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
    min_window = reader.min_window_seconds
    metrics: WindowMetrics | MetricsOutage | None = None
    if analysis_due(spec, status, now, min_window):
        try:
            window = analysis_window_seconds(spec.rollout, min_window)
            metrics = await reader.read(feature.namespace, feature.name, models_to_measure(status), window)
        except MetricsUnavailableError as exc:
            # Not only a log line: plan() records it in status, and the deadline acts on a long outage.
            log.warning("canary metrics for %s/%s unavailable: %s", feature.namespace, feature.name, exc)
            operator_metrics.CANARY_METRICS_UNAVAILABLE.labels(feature.namespace, feature.name).inc()
            metrics = MetricsOutage(str(exc))
    ready = {name: model_ready(model) for name, model in models.items()}
    annotations = feature.metadata.get("annotations") or {}
    generation = int(feature.metadata.get("generation", 0))
    result = plan(spec, status, ready, metrics, now, annotations, generation, min_window_seconds=min_window)

    new_status = result.status
    stable = new_status.stable_model
    if stable is not None and stable in models:
        overrides = budget_replicas(spec, new_status, budget_of(models[stable]))
        new_status.replica_overrides = [ModelReplicas(model=m, replicas=r) for m, r in sorted(overrides.items())]
    patch = new_status.model_dump(by_alias=True, mode="json")
    if patch != status.model_dump(by_alias=True, mode="json"):
        await kube.patch_status(feature.api_version, feature.kind, feature.namespace, feature.name, patch)
        operator_metrics.STATUS_WRITES.labels("AIFeature").inc()
    operator_metrics.set_phase(
        operator_metrics.FEATURE_PHASE, feature.namespace, feature.name, new_status.phase, FEATURE_PHASES
    )
    if new_status.phase == "RolledBack" and status.phase != "RolledBack":
        operator_metrics.ROLLBACKS.labels(feature.namespace, feature.name).inc()
    event_body = kopf.Body(cast(kopf.RawBody, dict(body)))
    for event in result.events:
        kopf.event(event_body, type=event.type, reason=event.reason, message=event.message)
        if event.reason == "ProgressDeadlineExceeded":
            action = spec.rollout.on_progress_deadline
            operator_metrics.PROGRESS_DEADLINE_EXCEEDED.labels(feature.namespace, feature.name, action).inc()
    if result.consumed_annotation is not None:
        await _remove_annotation(kube, feature, result.consumed_annotation)
    operator_metrics.RECONCILES.labels("AIFeature", "analysis" if metrics is not None else "change", "ok").inc()
    operator_metrics.RECONCILE_SECONDS.labels("AIFeature").observe(time.perf_counter() - started)
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
