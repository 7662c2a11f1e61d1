"""The operator's autoscaler at the edge: read each ready pod's engine signals, call the pure decision
(servlane_core.scaling), write status.autoscaler and re-apply the Deployment with the decided count.

Signals come from each model pod's metrics port (the runtime's /metrics): vLLM's own
`vllm:num_requests_running`, `vllm:num_requests_waiting` and `vllm:kv_cache_usage_perc` (or the older
`vllm:gpu_cache_usage_perc`) where the engine exports them, else the runtime's own in-flight and queue
gauges (the transformers engine); the runtime's request counter tells whether a request was served
since the last read. No Prometheus and no metrics adapter are needed.

The decision's state (last scale, last activity, last time the load needed the replicas) is kept in
memory between ticks and written to status.autoscaler when it matters (a new count or reason, or times
that moved by more than STATUS_TIME_SLACK_SECONDS), so that a restarted operator continues the same windows.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from servlane_api.aimodel import AIModel
from servlane_api.autoscaling import AutoscalerStatus
from servlane_api.runtime_config import DEFAULT_METRICS_PORT
from servlane_core.rollout.timeutil import from_rfc3339
from servlane_core.scaling import (
    Decision,
    PodSignals,
    ScalingPolicy,
    ScalingState,
    decide,
    held_by_rollout,
    released_by_rollout,
    saw_activity,
)
from servlane_operator.aimodel_reconciler import parse_model, reconcile
from servlane_operator.kube import Kube
from servlane_operator.observed import DeploymentView, PodView
from servlane_operator.settings import OperatorSettings

log = logging.getLogger(__name__)

ModelKey = tuple[str, str]
# A hostile pod could answer with an endless body: what a runtime's /metrics needs is far below this.
MAX_METRICS_BYTES = 1 << 20
SCRAPE_TIMEOUT_SECONDS = 2.0
# Times in status may lag the in-memory ones by this much (fewer status writes while a model is busy).
STATUS_TIME_SLACK_SECONDS = 30.0
# Endpoints whose requests are no sign of use (a client listing models must not keep a model awake).
_NOT_ACTIVITY = frozenset({"/v1/models"})


@dataclass(frozen=True)
class ReadyPod:
    """A model pod the autoscaler reads: ready, not terminating, with an address (from the pod index)."""

    name: str
    ip: str

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> ReadyPod | None:
        meta, status = body.get("metadata") or {}, body.get("status") or {}
        if meta.get("deletionTimestamp") or not status.get("podIP"):
            return None
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        return cls(name=str(meta.get("name", "")), ip=str(status["podIP"])) if ready else None


def parse_signals(text: str) -> PodSignals | None:
    """A pod's engine signals from its /metrics text, or None when it exports neither vLLM's nor the
    runtime's in-flight counts."""
    values: dict[str, float] = {}
    requests_total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "servlane_runtime_requests_total":
                if sample.labels.get("endpoint") not in _NOT_ACTIVITY:
                    requests_total += float(sample.value)
            elif sample.name in _SIGNALS:
                # vLLM labels its series by model name (and engine): one pod serves one model, so they add up.
                values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
    kv = values.get("vllm:kv_cache_usage_perc", values.get("vllm:gpu_cache_usage_perc"))
    if "vllm:num_requests_running" in values:
        running, waiting = values["vllm:num_requests_running"], values.get("vllm:num_requests_waiting", 0.0)
    elif "servlane_runtime_in_flight" in values:
        running, waiting = values["servlane_runtime_in_flight"], values.get("servlane_runtime_queue_depth", 0.0)
    else:
        return None
    finite = [v for v in (running, waiting, requests_total) if math.isfinite(v)]
    if len(finite) != 3 or (kv is not None and not math.isfinite(kv)):
        return None
    return PodSignals(running=running, waiting=waiting, requests_total=requests_total, kv_cache_usage=kv)


_SIGNALS = frozenset(
    {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "servlane_runtime_in_flight",
        "servlane_runtime_queue_depth",
    }
)


def state_from_status(status: AutoscalerStatus | None) -> ScalingState:
    if status is None:
        return ScalingState()

    def epoch(text: str | None) -> float | None:
        if not text:
            return None
        try:
            return from_rfc3339(text).timestamp()
        except ValueError:
            return None

    return ScalingState(
        last_scale_time=epoch(status.last_scale_time),
        last_activity_time=epoch(status.last_activity_time),
        last_busy_time=epoch(status.last_busy_time),
    )


def _rfc3339(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def status_of(decision: Decision) -> AutoscalerStatus:
    state = decision.state
    return AutoscalerStatus(
        desired_replicas=decision.replicas,
        reason=decision.reason,
        message=decision.message,
        last_scale_time=_rfc3339(state.last_scale_time),
        last_activity_time=_rfc3339(state.last_activity_time),
        last_busy_time=_rfc3339(state.last_busy_time),
    )


def status_needs_write(old: AutoscalerStatus | None, new: AutoscalerStatus) -> bool:
    """A new count or reason, or a time that moved by more than the slack (or appeared)."""
    if old is None or (old.desired_replicas, old.reason) != (new.desired_replicas, new.reason):
        return True
    for before, after in (
        (old.last_scale_time, new.last_scale_time),
        (old.last_activity_time, new.last_activity_time),
        (old.last_busy_time, new.last_busy_time),
    ):
        if (before is None) != (after is None):
            return True
        if (
            before
            and after
            and abs((from_rfc3339(after) - from_rfc3339(before)).total_seconds()) > STATUS_TIME_SLACK_SECONDS
        ):
            return True
    return False


@dataclass
class Autoscaler:
    """One per operator: the scrape client and, per model, the last decision's state and request counters."""

    client: httpx.AsyncClient = field(default_factory=lambda: httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_SECONDS))
    clock: Callable[[], float] = time.time
    metrics_port: int = DEFAULT_METRICS_PORT
    states: dict[ModelKey, ScalingState] = field(default_factory=dict)
    totals: dict[ModelKey, dict[str, float]] = field(default_factory=dict)
    # The status.autoscaler this process last decided (camelCase, as written), by model.
    decided: dict[ModelKey, dict[str, Any]] = field(default_factory=dict)

    def forget(self, key: ModelKey) -> None:
        self.states.pop(key, None)
        self.totals.pop(key, None)
        self.decided.pop(key, None)

    def with_decision(self, body: Mapping[str, Any], live_replicas: int | None = None) -> Mapping[str, Any]:
        """`body` with this process's latest decision in status.autoscaler. A copy of the AIModel from an index
        or an event may predate the status patch that wrote it: applied as it is, its older count would undo
        the scaling until the next pass (a resync between the two would flap the Deployment).

        With no decision yet anywhere (autoscaling just turned on, or an operator that left the replicas to
        an HPA), the Deployment's live count (`live_replicas`) stands in until the first pass decides, so
        the switch does not reset a serving model to its minimum."""
        meta = body.get("metadata") or {}
        status = body.get("status") or {}
        written = self.decided.get((str(meta.get("namespace", "")), str(meta.get("name", ""))))
        if not (body.get("spec") or {}).get("autoscaling"):
            return body
        if written is None and not status.get("autoscaler") and live_replicas is not None:
            written = {"desiredReplicas": live_replicas}
        if written is None:
            return body
        return {**body, "status": {**status, "autoscaler": written}}

    async def read(self, pods: Sequence[ReadyPod]) -> dict[str, PodSignals]:
        """Each ready pod's signals by pod name; a pod that does not answer is left out."""
        found = await asyncio.gather(*(self._scrape(pod) for pod in pods))
        return {pod.name: signals for pod, signals in zip(pods, found, strict=True) if signals is not None}

    async def _scrape(self, pod: ReadyPod) -> PodSignals | None:
        host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip
        url = f"http://{host}:{self.metrics_port}/metrics"
        try:
            async with self.client.stream("GET", url) as response:
                response.raise_for_status()
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_METRICS_BYTES:
                        log.warning("metrics of pod %s are over %d bytes: ignored", pod.name, MAX_METRICS_BYTES)
                        return None
            return parse_signals(body.decode("utf-8", errors="replace"))
        except (httpx.HTTPError, ValueError) as exc:
            log.debug("scraping pod %s failed: %s", pod.name, exc)
            return None

    async def decide_for(
        self,
        model: AIModel,
        current: int,
        pods: Sequence[ReadyPod],
        *,
        demand: bool,
        pinned: int | None,
        starting: int = 0,
    ) -> Decision | None:
        """The model's decision now (None: not autoscaled). Reads the pods only while it has replicas;
        `starting`: its pods on their way to a first Ready (PodView.starting)."""
        scaling = model.spec.autoscaling
        if scaling is None:
            return None
        key = (model.namespace, model.name)
        signals = await self.read(pods) if current > 0 and pods else {}
        previous = self.totals.get(key, {})
        active = saw_activity(previous, signals)
        self.totals[key] = {pod: s.requests_total for pod, s in signals.items()}
        state = self.states.get(key) or state_from_status(model.status.autoscaler)
        decision = decide(
            ScalingPolicy.of(scaling),
            current,
            list(signals.values()),
            active=active,
            demand=demand,
            now=self.clock(),
            state=state,
            pinned=pinned,
            unread=len(pods) - len(signals) if current > 0 else 0,
            starting=starting,
        )
        self.states[key] = decision.state
        return decision


async def autoscale(
    body: Mapping[str, Any],
    kube: Kube,
    settings: OperatorSettings,
    autoscaler: Autoscaler,
    deployment: DeploymentView,
    ready: Sequence[ReadyPod],
    pods: Sequence[PodView],
    *,
    demand: bool,
    pinned: int | None,
) -> Decision | None:
    """One autoscaling pass of an AIModel: decide, write status.autoscaler, re-apply the Deployment with the
    new count (the builder reads it from status.autoscaler: one writer, and the resync keeps it)."""
    model = parse_model(body)
    starting = sum(1 for pod in pods if pod.starting)
    decision = await autoscaler.decide_for(
        model, deployment.desired, ready, demand=demand, pinned=pinned, starting=starting
    )
    if decision is None:
        return None
    if pinned is not None and pinned != deployment.desired:
        # The pin and the Deployment disagree: one of the two indexes is behind the budget reconcile,
        # which records each pin as it applies it (record_rollout_pin). Recording a stale pin here
        # would make the release resume from it.
        return decision
    written = await _record(model, kube, autoscaler, decision)
    if pinned is None and decision.replicas != deployment.desired:
        log.info(
            "scaling %s/%s from %d to %d: %s",
            model.namespace,
            model.name,
            deployment.desired,
            decision.replicas,
            decision.message,
        )
        current = {**body, "status": {**(body.get("status") or {}), "autoscaler": written}}
        await reconcile(current, kube, settings, pods, trigger="autoscale")
    return decision


async def _record(model: AIModel, kube: Kube, autoscaler: Autoscaler, decision: Decision) -> dict[str, Any]:
    """The decision as this process's latest (with_decision) and, when it matters, in status.autoscaler."""
    key = (model.namespace, model.name)
    autoscaler.states[key] = decision.state
    new = status_of(decision)
    written = new.model_dump(by_alias=True, mode="json", exclude_none=True)
    if status_needs_write(model.status.autoscaler, new):
        await kube.patch_status(model.api_version, model.kind, model.namespace, model.name, {"autoscaler": written})
    autoscaler.decided[key] = written
    return written


async def record_rollout_pin(
    body: Mapping[str, Any], kube: Kube, autoscaler: Autoscaler, *, pinned: int | None, released_from: int | None
) -> None:
    """A fixed-GPU-budget reconcile moved an autoscaled model's pin: record it as the autoscaler's decision
    before the Deployment is applied. `pinned`: the new pin (the count while it holds); None with
    `released_from`: the rollout let the model go at that count, and the autoscaler resumes from it.

    The periodic pass alone would record a pin up to one interval late: a release in between resumed
    from the decision before it (seen in CI: 2 replicas, pinned to 1, pinned to 2, released at 1)."""
    model = parse_model(body)
    scaling = model.spec.autoscaling
    if scaling is None or (pinned is None and released_from is None):
        return
    key = (model.namespace, model.name)
    state = autoscaler.states.get(key) or state_from_status(model.status.autoscaler)
    now = autoscaler.clock()
    if pinned is not None:
        decision = held_by_rollout(pinned, now, state)
    else:
        assert released_from is not None
        decision = released_by_rollout(ScalingPolicy.of(scaling), released_from, now, state)
    await _record(model, kube, autoscaler, decision)
