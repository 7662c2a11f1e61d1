"""Reconciling AIModels: build the children, apply them, write status. Pure parts live elsewhere."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast, get_args

import kopf
from kubernetes.client.exceptions import ApiException

from servlane_api import manifests
from servlane_api.aimodel import AIModel, Phase
from servlane_api.conditions import CHILD_CONFLICT, now_rfc3339
from servlane_operator import operator_metrics
from servlane_operator.builders import ChildPlan, endpoint_url, plan_children, replicas_handover
from servlane_operator.builders.deployment import replaces_all_pods
from servlane_operator.builders.ownership import Ownership, child_actions, ownership
from servlane_operator.kube import Kube
from servlane_operator.labels import REPLICAS_HANDOVER_MANAGER, child_name
from servlane_operator.observed import DeploymentView, PodView
from servlane_operator.settings import OperatorSettings
from servlane_operator.status import build_status, carried_conflicts, carried_rejection

ModelKey = tuple[str, str]
AIMODEL_PHASES = get_args(Phase)


def _body(body: Mapping[str, Any]) -> kopf.Body:
    return kopf.Body(cast(kopf.RawBody, dict(body)))


def parse_model(body: Mapping[str, Any]) -> AIModel:
    try:
        return manifests.parse_model(body)
    except manifests.InvalidManifest as exc:
        # The CRD schema rejects most bad specs; what gets here cannot be fixed by retrying.
        raise kopf.PermanentError(str(exc)) from exc


def _status_body(
    model: AIModel,
    deployment: DeploymentView | None,
    pods: Iterable[PodView],
    *,
    observed_generation: int | None,
    settings: OperatorSettings,
    conflicts: Sequence[str],
    rejected: str | None = None,
) -> dict[str, Any]:
    status = build_status(
        model,
        deployment,
        list(pods),
        observed_generation=observed_generation,
        endpoint=endpoint_url(model, settings.cluster_domain),
        now=now_rfc3339(),
        conflicts=conflicts,
        rejected=rejected,
    )
    body = status.model_dump(by_alias=True, mode="json")
    if observed_generation is None:
        del body["observedGeneration"]  # left as it is (a merge-patch null would clear it)
    del body["coldStart"]  # written by cold_start_reader alone (a null here would clear it)
    return body


async def write_status(kube: Kube, body: Mapping[str, Any], model: AIModel, status: dict[str, Any]) -> bool:
    """Patches status when it differs from `body`'s; posts an Event when the phase changed. True if written.

    `body` may be an older copy than the cluster's (from an index). Skipping on it is still safe: any
    write that landed since produces an AIModel event, and model_changed re-derives status on each one.
    """
    old = model.status.model_dump(by_alias=True, mode="json")
    if old == {**old, **status}:
        return False
    await kube.patch_status(model.api_version, model.kind, model.namespace, model.name, status)
    operator_metrics.STATUS_WRITES.labels("AIModel").inc()
    operator_metrics.set_phase(
        operator_metrics.MODEL_PHASE, model.namespace, model.name, status.get("phase"), AIMODEL_PHASES
    )
    if old.get("phase") != status.get("phase"):
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
        warn = status["phase"] in ("Degraded", "Failed")
        reason = degraded["reason"] if warn else ready["reason"]
        kopf.event(_body(body), type="Warning" if warn else "Normal", reason=reason, message=ready["message"])
    return True


async def reconcile(
    body: Mapping[str, Any],
    kube: Kube,
    settings: OperatorSettings,
    pods: Iterable[PodView],
    *,
    trigger: str,
    known_deployment: DeploymentView | None = None,
    replicas_override: int | None = None,
) -> None:
    """Apply the model's children (server-side apply, one field manager) and write its status.
    Children whose name someone else's object holds are left alone and reported (builders/ownership.py)."""
    started = time.perf_counter()
    model = parse_model(body)
    uid = str(model.metadata.get("uid", ""))
    ours: dict[str, Any] | None = None
    try:
        # The periodic resync asks the API server again about children known absent (someone may have
        # created one since).
        plan = _plan(model, settings, replicas_override)
        live = await _read_children(kube, model, plan, recheck=trigger == "resync")
        live_deployment = live.get("Deployment")
        ours = live_deployment if ownership(live_deployment, uid) is Ownership.OWNED else None
        spec_changed = model.metadata.get("generation") != model.status.observed_generation
        replace_all = replaces_all_pods(DeploymentView.parse(ours) if ours else None, spec_changed)
        if replace_all:
            plan = _plan(model, settings, replicas_override, replace_all=True)
        actions = child_actions(plan.apply, plan.delete, live, uid)
        if ours is not None:
            await _keep_replicas_for_the_hpa(kube, actions.apply, DeploymentView.parse(ours))
        # The children do not depend on one another (an HPA waits for its Deployment on its own): one
        # round trip's latency for all of them rather than one after the other.
        results = await asyncio.gather(*(kube.apply(obj) for obj in actions.apply))
        applied = {obj["kind"]: result for obj, result in zip(actions.apply, results, strict=True)}
        for api_version, kind, uid in actions.delete:
            await kube.delete(api_version, kind, model.namespace, child_name(model.name), uid=uid)
    except Unbuildable as exc:
        # A pure function of the spec failed (a bug): the same spec fails again, so status says it once.
        operator_metrics.RECONCILES.labels("AIModel", trigger, "error").inc()
        why = f"The operator could not build the objects of this spec ({exc}); please report it with the spec"
        await _report_refusal(kube, body, model, ours, pods, settings, why)
        raise kopf.PermanentError(why) from exc
    except ApiException as exc:
        operator_metrics.RECONCILES.labels("AIModel", trigger, "error").inc()
        if exc.status in REFUSALS:
            # Status says why, where `kubectl get` and Argo CD look. An invalid object (422) is not retried until
            # the spec changes; a forbidden one (403: a policy or webhook that says so, a quota, our own RBAC) or a
            # webhook's 400 may pass once the cluster changes, so it is retried, slowly.
            refusal = refusal_message(exc)
            why = f"The API server refused an object made from this spec: {refusal}"
            await _report_refusal(kube, body, model, ours, pods, settings, why)
            if exc.status == 422:
                raise kopf.PermanentError(f"the API server rejected a child of {model.name}: {refusal}") from exc
            raise kopf.TemporaryError(
                f"the API server refused a child of {model.name}: {refusal}", delay=REFUSED_RETRY_SECONDS
            ) from exc
        raise kopf.TemporaryError(f"applying children failed ({exc.status} {exc.reason})", delay=5) from exc
    deployment = DeploymentView.parse(applied["Deployment"]) if "Deployment" in applied else None
    # Our apply changed the Deployment's spec (a new generation) although the AIModel did not change:
    # someone had edited a field we own (a strategy we switched ourselves is no edit).
    drifted = (
        known_deployment is not None
        and deployment is not None
        and known_deployment.generation != deployment.generation
        and known_deployment.replaces_all == replace_all
    )
    if drifted and trigger == "resync":
        operator_metrics.DRIFT_CORRECTED.labels("Deployment").inc()
        kopf.info(_body(body), reason="DriftCorrected", message="Restored hand-edited fields of the Deployment.")
    conflict = "; ".join(actions.conflicts)
    if conflict and carried_conflicts(model.status) != [conflict]:  # once, not on every resync
        kopf.warn(_body(body), reason=CHILD_CONFLICT, message=conflict)
    generation = int(model.metadata.get("generation", 0))
    status = _status_body(
        model, deployment, pods, observed_generation=generation, settings=settings, conflicts=actions.conflicts
    )
    await write_status(kube, body, model, status)
    operator_metrics.RECONCILES.labels("AIModel", trigger, "ok").inc()
    operator_metrics.RECONCILE_SECONDS.labels("AIModel").observe(time.perf_counter() - started)


class Unbuildable(Exception):
    """The builders failed on this spec (they are pure: it would fail again)."""


def _plan(
    model: AIModel, settings: OperatorSettings, replicas_override: int | None, *, replace_all: bool = False
) -> ChildPlan:
    try:
        return plan_children(model, settings, replicas_override, replace_all=replace_all)
    except Exception as exc:
        raise Unbuildable(f"{type(exc).__name__}: {exc}") from exc


async def _report_refusal(
    kube: Kube,
    body: Mapping[str, Any],
    model: AIModel,
    ours: dict[str, Any] | None,
    pods: Iterable[PodView],
    settings: OperatorSettings,
    why: str,
) -> None:
    """Status for a spec whose children cannot be applied: Degraded, ChildRejected, `why`; the spec observed."""
    status = _status_body(
        model,
        DeploymentView.parse(ours) if ours is not None else None,
        pods,
        observed_generation=int(model.metadata.get("generation", 0)),
        settings=settings,
        conflicts=(),
        rejected=why,
    )
    await write_status(kube, body, model, status)


# The API server's answers that refuse a child made from the spec, as status reports them (ChildRejected).
REFUSALS = (400, 403, 422)
REFUSED_RETRY_SECONDS = 30

# A refusal in status is read by people: the API server's own sentence, not its whole Status object.
MAX_REFUSAL_CHARS = 1000


def refusal_message(exc: ApiException) -> str:
    """The API server's message in a refusal (its Status object's `message`), else its reason."""
    try:
        message = json.loads(exc.body).get("message") if exc.body else None
    except (ValueError, AttributeError):
        message = None
    text = message if isinstance(message, str) and message else f"{exc.status} {exc.reason}"
    return text if len(text) <= MAX_REFUSAL_CHARS else text[: MAX_REFUSAL_CHARS - 3] + "..."


async def _read_children(
    kube: Kube, model: AIModel, plan: ChildPlan, *, recheck: bool
) -> dict[str, dict[str, Any] | None]:
    """Each child's live object by kind (None: absent), read concurrently. A child to delete that this
    process knows absent is not read (left out) unless `recheck`."""
    name = child_name(model.name)
    wanted = [(obj["apiVersion"], obj["kind"]) for obj in plan.apply] + [
        (api_version, kind)
        for api_version, kind in plan.delete
        if recheck or not kube.known_absent(kind, model.namespace, name)
    ]
    found = await asyncio.gather(*(kube.get(api_version, kind, model.namespace, name) for api_version, kind in wanted))
    live = {kind: obj for (_, kind), obj in zip(wanted, found, strict=True)}
    for _, kind in plan.delete:
        if kind in live and live[kind] is None:
            kube.remember_absent(kind, model.namespace, name)
    return live


async def _keep_replicas_for_the_hpa(kube: Kube, objects: Iterable[dict[str, Any]], live: DeploymentView) -> None:
    """Before an apply that stops setting replicas, a second manager takes them (replicas_handover.py)."""
    desired = next((obj for obj in objects if obj["kind"] == "Deployment"), None)
    if desired is None or "replicas" in desired["spec"]:
        return
    handover = replicas_handover(desired, live.desired, live.replicas_appliers)
    if handover is not None:
        # No force: the count is the live one, so only a concurrent change can conflict (then retry).
        await kube.apply(handover, field_manager=REPLICAS_HANDOVER_MANAGER, force=False)


async def refresh_status(
    body: Mapping[str, Any],
    kube: Kube,
    settings: OperatorSettings,
    deployment: DeploymentView | None,
    pods: Iterable[PodView],
) -> None:
    """Status follows the children between reconciles. It never touches observedGeneration: only a
    reconcile that applied the spec may move it, and `body` may be an older copy than the cluster's.

    Called on every child event (with the AIModel from the index) and on every AIModel event (with the
    event's own copy), so whichever arrives last settles the status: writes race, the last event wins."""
    model = parse_model(body)
    conflicts = carried_conflicts(model.status)
    rejected = carried_rejection(model.status)
    status = _status_body(
        model, deployment, pods, observed_generation=None, settings=settings, conflicts=conflicts, rejected=rejected
    )
    await write_status(kube, body, model, status)
