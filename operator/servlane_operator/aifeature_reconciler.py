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

from servlane_api import manifests
from servlane_api.aifeature import AIFeature, AIFeatureStatus, FeaturePhase
from servlane_api.aimodel import AIModelSpec
from servlane_api.targets import parse_target
from servlane_core.rollout import (
    MetricsReader,
    combine_overrides,
    referenced_models,
    rollout_pass,
)
from servlane_operator import operator_metrics
from servlane_operator.kube import Kube

log = logging.getLogger(__name__)
FEATURE_PHASES = get_args(FeaturePhase)


def parse_feature(body: Mapping[str, Any]) -> AIFeature:
    try:
        return manifests.parse_feature(body)
    except manifests.InvalidManifest as exc:
        raise kopf.PermanentError(str(exc)) from exc


def referenced(body: Mapping[str, Any]) -> set[str]:
    """The AIModel names a pass of this feature reads (servlane_core.rollout.referenced_models)."""
    feature = parse_feature(body)
    return referenced_models(feature.spec, feature.status)


def true_condition(body: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The object's condition of type `kind` when its status is True, else None."""
    conditions = (body.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind and c.get("status") == "True"), None)


def condition_true(body: Mapping[str, Any], kind: str) -> bool:
    return true_condition(body, kind) is not None


def model_ready(body: Mapping[str, Any]) -> bool:
    return condition_true(body, "Ready")


def scaled_to_zero(body: Mapping[str, Any]) -> bool:
    """The AIModel says it rests at zero replicas (condition ScaledToZero=True) until a request wakes it."""
    return condition_true(body, "ScaledToZero")


def why_failing(body: Mapping[str, Any]) -> str | None:
    """What an AIModel's Degraded condition says ("<reason>: <message>", e.g. a runtime that keeps crashing),
    or None when it is not Degraded: a canary with traffic that is down for such a reason fails its check."""
    degraded = true_condition(body, "Degraded")
    if degraded is None:
        return None
    return f"{degraded.get('reason') or 'Degraded'}: {degraded.get('message') or 'no message'}"


def target_ready(target: str, body: Mapping[str, Any]) -> bool:
    """An AIModel target: its Ready condition. An adapter target (`model:adapter`): also listed in the model's
    spec (the runtime answers 503 for the moments its pods still load it, which the gateway retries)."""
    adapter = parse_target(target).adapter
    if adapter is None:
        return model_ready(body)
    listed = ((body.get("spec") or {}).get("adapters")) or []
    return model_ready(body) and any(a.get("name") == adapter for a in listed)


def budget_of(model: Mapping[str, Any]) -> int:
    """The replica count an AIModel asks for itself: the budget a fixed-GPU canary is carved from.
    Only the spec is read: a status this operator version cannot parse must not hide the model's size."""
    spec = AIModelSpec.model_validate(model.get("spec") or {})
    if spec.autoscaling is not None:
        return spec.autoscaling.min_replicas
    return 1 if spec.replicas is None else spec.replicas


def own_replicas(models: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """Each AIModel's own replica count by name. An invalid AIModel is left out: it has no Deployment to
    scale (its reconcile fails permanently), and plan() pins nothing for a model it does not know."""
    out: dict[str, int] = {}
    for name, model in models.items():
        if parse_target(name).adapter is not None:
            continue  # an adapter shares its model's pods: nothing to carve out of a budget
        try:
            out[name] = budget_of(model)
        except ValidationError:
            continue
    return out


def feature_status(body: Mapping[str, Any]) -> AIFeatureStatus:
    """The status as stored; an unreadable one counts as empty (it pins nothing)."""
    try:
        return AIFeatureStatus.model_validate(body.get("status") or {})
    except ValidationError:
        return AIFeatureStatus()


async def reconcile_feature(
    body: Mapping[str, Any],
    kube: Kube,
    models: Mapping[str, Mapping[str, Any]],
    reader: MetricsReader,
    *,
    now: datetime | None = None,
) -> AIFeatureStatus:
    """One pass of the rollout controller. `models`: the AIModels of the feature's namespace that it refers to
    (`referenced`), by name; a missing one counts as not Ready.
    Returns the new status; `overrides_to_apply` tells from it which Deployments to re-apply at once."""
    started = time.perf_counter()
    feature = parse_feature(body)
    spec, status = feature.spec, feature.status
    now = now or datetime.now(UTC)
    ready = {name: target_ready(name, model) for name, model in models.items()}
    annotations = feature.metadata.get("annotations") or {}
    generation = int(feature.metadata.get("generation", 0))
    outcome = await rollout_pass(
        feature.namespace,
        feature.name,
        spec,
        status,
        ready,
        reader,
        now,
        annotations,
        generation,
        model_replicas=own_replicas(models),
        models_at_zero=frozenset(name for name, model in models.items() if scaled_to_zero(model)),
        models_failing={name: why for name, model in models.items() if (why := why_failing(model)) is not None},
    )
    if outcome.metrics_outage is not None:
        # Not only a log line: plan() records it in status, and the deadline acts on a long outage.
        log.warning("canary metrics for %s/%s unavailable: %s", feature.namespace, feature.name, outcome.metrics_outage)
        operator_metrics.CANARY_METRICS_UNAVAILABLE.labels(feature.namespace, feature.name).inc()
    result = outcome.plan

    new_status = result.status
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
    operator_metrics.RECONCILES.labels("AIFeature", "analysis" if outcome.analysed else "change", "ok").inc()
    operator_metrics.RECONCILE_SECONDS.labels("AIFeature").observe(time.perf_counter() - started)
    return new_status


async def _remove_annotation(kube: Kube, feature: AIFeature, key: str) -> None:
    """A consumed rollout command is removed (metadata, not spec) so it acts once."""
    try:
        await kube.patch_metadata(
            feature.api_version, feature.kind, feature.namespace, feature.name, {"annotations": {key: None}}
        )
    except ApiException as exc:
        if exc.status != 404:
            raise


def replica_overrides(features: Iterable[Mapping[str, Any]]) -> dict[str, int | None]:
    """AIModel name -> replicas imposed by the fixed-GPU-budget rollouts of the given features (one
    namespace), merged per model by combine_overrides; None or absent: the model's own count and HPA."""
    return combine_overrides(feature_status(body) for body in features)


def overrides_to_apply(
    others: Iterable[Mapping[str, Any]], before: AIFeatureStatus, after: AIFeatureStatus
) -> dict[str, int | None]:
    """The models whose merged override moved when one feature's status went from `before` to `after`
    (`others`: the namespace's other features), with their new override, to re-apply at once."""
    return {model: new for model, (_old, new) in override_moves(others, before, after).items()}


def override_moves(
    others: Iterable[Mapping[str, Any]], before: AIFeatureStatus, after: AIFeatureStatus
) -> dict[str, tuple[int | None, int | None]]:
    """As overrides_to_apply, with each model's merged override before and after (None: not pinned)."""
    rest = [feature_status(body) for body in others]
    old, new = combine_overrides([*rest, before]), combine_overrides([*rest, after])
    return {m: (old.get(m), new.get(m)) for m in sorted(old.keys() | new.keys()) if old.get(m) != new.get(m)}
