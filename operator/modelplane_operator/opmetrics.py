"""The operator's own Prometheus metrics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter(
    "modelplane_operator_reconciles_total",
    "Reconciles by resource kind, trigger and result",
    ["kind", "trigger", "result"],
)
RECONCILE_SECONDS = Histogram(
    "modelplane_operator_reconcile_duration_seconds",
    "Time to build, apply and write status for one object",
    ["kind"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
STATUS_WRITES = Counter("modelplane_operator_status_writes_total", "Status patches written", ["kind"])
DRIFT_CORRECTED = Counter(
    "modelplane_operator_drift_corrections_total", "Children whose hand edits the resync put back", ["kind"]
)
MODELS_BY_PHASE = Gauge("modelplane_operator_models", "AIModels known to the operator by phase", ["phase"])
