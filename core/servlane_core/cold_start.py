"""A pod's cold start, step by step, from what Kubernetes reports of the pod and what its runtime reports of
itself (GET /startup); and the AIModel's status.coldStart with it added. Pure: no I/O, no clock.

Kubernetes' times (creation, PodScheduled, events, startedAt, Ready) have whole seconds; the runtime's have
fractions. Each step is the time from the step before it, never negative (a whole-second time can look
earlier than the fraction before it), so a step next to a Kubernetes time may read up to a second off.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from servlane_api.cold_start import (
    COLD_START_FIELDS,
    MAX_COLD_START_SAMPLES,
    ColdStartPhases,
    ColdStartSample,
    ColdStartStatus,
    RuntimeStartup,
)

# Seconds in status: hundredths (the runtime's times are finer, Kubernetes' coarser).
_DIGITS = 2


def parse_time(value: object) -> float | None:
    """An RFC 3339 time (Kubernetes' Time or MicroTime) as Unix seconds; None when absent or not a time."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _condition_time(pod: Mapping[str, Any], kind: str) -> float | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return parse_time(cond.get("lastTransitionTime"))
    return None


def _container_started(pod: Mapping[str, Any], container: str) -> float | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            return parse_time(((status.get("state") or {}).get("running") or {}).get("startedAt"))
    return None


def _event_time(event: Mapping[str, Any]) -> float | None:
    # core/v1 Events carry lastTimestamp (or, when written through events.k8s.io, only eventTime).
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        at = parse_time(event.get(key))
        if at is not None:
            return at
    return None


def image_ready_time(pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]], container: str) -> float | None:
    """When the kubelet had the container's image: its first Pulled event of this pod ("Successfully pulled"
    or "already present on machine"), the kubelet's own record of the moment."""
    uid = (pod.get("metadata") or {}).get("uid")
    times = []
    for event in events:
        involved = event.get("involvedObject") or event.get("regarding") or {}
        if event.get("reason") != "Pulled" or (uid and involved.get("uid") not in (None, uid)):
            continue
        field = str(involved.get("fieldPath") or "")
        if field and field != f"spec.containers{{{container}}}":
            continue  # an init container's or an image volume's pull
        at = _event_time(event)
        if at is not None:
            times.append(at)
    return min(times) if times else None


def _step(later: float | None, earlier: float | None) -> float | None:
    if later is None or earlier is None:
        return None
    return round(max(0.0, later - earlier), _DIGITS)


def breakdown(
    pod: Mapping[str, Any],
    events: Iterable[Mapping[str, Any]],
    startup: RuntimeStartup | None,
    container: str = "runtime",
) -> ColdStartSample | None:
    """The start of `pod` (None until it is Ready, or without a creation time). `events` are the pod's (others
    are ignored); `startup` what its runtime answered at /startup (None: not reachable, and the runtime's own
    steps are left out)."""
    meta = pod.get("metadata") or {}
    created = parse_time(meta.get("creationTimestamp"))
    ready = _condition_time(pod, "Ready")
    if created is None or ready is None:
        return None
    scheduled = _condition_time(pod, "PodScheduled")
    started = _container_started(pod, container)
    image = image_ready_time(pod, events, container)
    phases = startup.phases if startup is not None else {}
    # The process's start from the kernel is the finer record of the container's start; without a Pulled
    # event, the image was ready when the container started.
    process_start = phases.get("process_start", started)
    image = image if image is not None else started
    imports, fetched = phases.get("imports_done"), phases.get("weights_fetched")
    loaded, runtime_ready, first = phases.get("engine_loaded"), phases.get("ready"), phases.get("first_token")
    points = [created, scheduled, image, process_start, imports, fetched, loaded, runtime_ready, ready]
    # A step is known when both its ends are: without the runtime's answer its steps stay unknown (total
    # still holds them) rather than one of them standing for all.
    steps = [_step(points[i], points[i - 1]) for i in range(1, len(points))]
    return ColdStartSample(
        pod=str(meta.get("name", "")),
        created=str(meta.get("creationTimestamp")),
        scheduled=steps[0],
        image_ready=steps[1],
        container_started=steps[2],
        runtime_imports=steps[3],
        weights_fetched=steps[4],
        engine_loaded=steps[5],
        runtime_ready=steps[6],
        pod_ready=steps[7],
        first_token=_step(first, ready),
        total=_step(ready, created),
    )


def median_phases(samples: Sequence[ColdStartPhases]) -> ColdStartPhases:
    """Each phase's median over the samples that know it."""
    medians: dict[str, float | None] = {}
    for name in COLD_START_FIELDS:
        known = [v for s in samples if (v := getattr(s, name)) is not None and math.isfinite(v)]
        medians[name] = round(statistics.median(known), _DIGITS) if known else None
    return ColdStartPhases.model_validate(medians)


def record_start(status: ColdStartStatus | None, sample: ColdStartSample) -> ColdStartStatus:
    """status.coldStart with `sample` in it: a pod already there is replaced (its first token came since),
    the most recent MAX_COLD_START_SAMPLES pod starts kept (by creation time), `last` the newest of them."""
    recent = [s for s in (status.recent if status else []) if s.pod != sample.pod] + [sample]
    recent.sort(key=lambda s: parse_time(s.created) or 0.0)  # stable: equal times keep their order
    recent = recent[-MAX_COLD_START_SAMPLES:]
    return ColdStartStatus(last=recent[-1], median=median_phases(recent), recent=recent)


def needs_sample(status: ColdStartStatus | None, pod_name: str) -> bool:
    """Whether a ready pod's start is still to be recorded: it is not in status yet, or its first token is
    still missing (the runtime is asked again then)."""
    known = next((s for s in (status.recent if status else []) if s.pod == pod_name), None)
    return known is None or known.first_token is None


def runtime_steps(startup: RuntimeStartup) -> ColdStartPhases:
    """The runtime's own steps when there is no pod (standalone): total is process start to ready, and
    first token is counted from the runtime's ready."""
    phases = startup.phases
    points = [phases.get(p) for p in ("process_start", "imports_done", "weights_fetched", "engine_loaded", "ready")]
    steps = [_step(points[i], points[i - 1]) for i in range(1, len(points))]
    return ColdStartPhases(
        runtime_imports=steps[0],
        weights_fetched=steps[1],
        engine_loaded=steps[2],
        runtime_ready=steps[3],
        first_token=_step(phases.get("first_token"), phases.get("ready")),
        total=_step(phases.get("ready"), phases.get("process_start")),
    )
