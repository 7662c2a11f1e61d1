"""The operator's own Prometheus metrics."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter(
    "servlane_operator_reconciles_total",
    "Reconciles by resource kind, trigger and result",
    ["kind", "trigger", "result"],
)
RECONCILE_SECONDS = Histogram(
    "servlane_operator_reconcile_duration_seconds",
    "Time to build, apply and write status for one object",
    ["kind"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
STATUS_WRITES = Counter("servlane_operator_status_writes_total", "Status patches written", ["kind"])
DRIFT_CORRECTED = Counter(
    "servlane_operator_drift_corrections_total", "Children whose hand edits the resync put back", ["kind"]
)
MODEL_PHASE = Gauge(
    "servlane_operator_model_phase",
    "1 for each AIModel's current phase, 0 for the others",
    ["namespace", "name", "phase"],
)
FEATURE_PHASE = Gauge(
    "servlane_operator_feature_phase",
    "1 for each AIFeature's current phase, 0 for the others",
    ["namespace", "name", "phase"],
)
ROLLBACKS = Counter("servlane_operator_feature_rollbacks_total", "Canary rollbacks", ["namespace", "feature"])
PROGRESS_DEADLINE_EXCEEDED = Counter(
    "servlane_operator_feature_progress_deadline_exceeded_total",
    "Rollouts that got no verdict within rollout.progressDeadlineSeconds, by the action taken",
    ["namespace", "feature", "action"],
)
CANARY_METRICS_UNAVAILABLE = Counter(
    "servlane_operator_canary_metrics_unavailable_total",
    "Canary analyses whose metrics could not be read (Prometheus or the gateway pods unreachable)",
    ["namespace", "feature"],
)


def set_phase(gauge: Gauge, namespace: str, name: str, phase: object, phases: Iterable[str]) -> None:
    for candidate in phases:
        gauge.labels(namespace, name, candidate).set(1 if candidate == phase else 0)


def forget(gauge: Gauge, namespace: str, name: str, phases: Iterable[str]) -> None:
    """Drops a deleted object's series so dashboards do not show it forever."""
    for candidate in phases:
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, name, candidate)
