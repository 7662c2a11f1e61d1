"""One rollout pass, the same for the operator and for standalone mode (`servlane serve`): read the
window metrics only when an analysis is due (the scrape reader's window is the time between two reads),
then plan(). A source that cannot be read is an outage, not an error: plan() records it in status, and
the progress deadline acts on a long one.

The callers differ only in I/O, which stays with them: where the status lives (the API server, or memory
and a state file), where events go (Kubernetes Events, or the log), what counts as a generation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from servlane_api.aifeature import AIFeatureSpec, AIFeatureStatus
from servlane_core.rollout.decide import RolloutPlan, models_to_measure, plan
from servlane_core.rollout.schedule import analysis_due, analysis_window_seconds
from servlane_core.rollout.window import MetricsOutage, MetricsReader, MetricsUnavailableError, WindowMetrics


@dataclass(frozen=True)
class PassOutcome:
    plan: RolloutPlan
    analysed: bool  # an analysis was due: the window metrics were read (or found unreadable)
    metrics_outage: str | None  # why the window metrics could not be read, when an analysis was due


async def rollout_pass(
    namespace: str,
    name: str,
    spec: AIFeatureSpec,
    status: AIFeatureStatus,
    models_ready: Mapping[str, bool],
    reader: MetricsReader,
    now: datetime,
    annotations: Mapping[str, str],
    generation: int,
    *,
    model_replicas: Mapping[str, int] | None = None,
    models_at_zero: frozenset[str] = frozenset(),
    models_failing: Mapping[str, str] | None = None,
) -> PassOutcome:
    min_window = reader.min_window_seconds
    metrics: WindowMetrics | MetricsOutage | None = None
    outage: str | None = None
    if analysis_due(spec, status, now, min_window):
        try:
            window = analysis_window_seconds(spec.rollout, min_window)
            metrics = await reader.read(namespace, name, models_to_measure(status), window)
        except MetricsUnavailableError as exc:
            outage = str(exc)
            metrics = MetricsOutage(outage)
    result = plan(
        spec,
        status,
        models_ready,
        metrics,
        now,
        annotations,
        generation,
        min_window_seconds=min_window,
        model_replicas=model_replicas,
        models_at_zero=models_at_zero,
        models_failing=models_failing,
    )
    return PassOutcome(plan=result, analysed=metrics is not None, metrics_outage=outage)
