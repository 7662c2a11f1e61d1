"""The console's JSON view: decided purely from the route table, the AIFeature/AIModel objects, this
replica's request log and the caller's key.

Visibility follows /v1/models: without keys configured everything shows; a key without a scope list (the
admin's: it may call everything) sees every namespace; a scoped key sees only the features and models its
scopes let it call, the models behind those features (their names are already in the feature's weights),
and the recent requests of those features. Nothing else is in the answer, so nothing else can leak.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from servlane_api import AIFeature, AIModel
from servlane_api.targets import parse_target
from servlane_core.routing.routes import RouteTable, feature_weights
from servlane_gateway.access import ApiKey
from servlane_gateway.console.recent import RequestLog, Visible

TRACE_ID_PLACEHOLDER = "{trace_id}"
REPLICA_NOTE = (
    "Request rates, error rates, TTFT and recent requests are this gateway replica's view only "
    "(each replica sees its own share of the traffic)."
)


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def time_to_ready(model: AIModel) -> float | None:
    """Seconds from the AIModel's creation to its Ready condition turning True; None while not Ready or
    without both times."""
    ready = next((c for c in model.status.conditions if c.type == "Ready" and c.status == "True"), None)
    created = parse_time(str(model.metadata.get("creationTimestamp") or ""))
    became = parse_time(ready.last_transition_time) if ready is not None else None
    if created is None or became is None or became < created:
        return None
    return (became - created).total_seconds()


def trace_url(template: str | None, trace_id: str | None) -> str | None:
    """The template with the trace id in place (a trace id is hex, so nothing needs escaping)."""
    if not template or not trace_id or not trace_id.isalnum():
        return None
    return template.replace(TRACE_ID_PLACEHOLDER, trace_id)


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _route_visible(key: ApiKey | None, table: RouteTable | None, namespace: str, name: str) -> bool:
    if key is None:
        return True
    if table is None:
        return False
    route = table.routes.get(f"{namespace}/{name}")
    return route is not None and key.allows(route)


def _feature(feature: AIFeature) -> dict[str, Any]:
    status = feature.status
    return {
        "namespace": feature.namespace,
        "name": feature.name,
        "phase": status.phase,
        "stableModel": status.stable_model,
        "canaryModel": status.canary_model,
        "canaryWeight": status.canary_weight,
        "weights": [{"model": w.model, "weight": w.weight} for w in feature_weights(feature)],
        "analyses": [a.model_dump(by_alias=True, mode="json") for a in status.analyses],
    }


def _cold_start(model: AIModel) -> dict[str, Any] | None:
    """The last pod start and the median of the recent ones, each step in seconds (status.coldStart)."""
    cold = model.status.cold_start
    if cold is None or cold.last is None:
        return None
    return {
        "last": cold.last.model_dump(by_alias=True, mode="json", exclude_none=True),
        "median": cold.median.model_dump(by_alias=True, mode="json", exclude_none=True) if cold.median else None,
        "samples": len(cold.recent),
    }


def _model(model: AIModel, log: RequestLog, visible: Visible) -> dict[str, Any]:
    status = model.status
    stats = log.stats(model.namespace, model.name, visible)  # its traffic through the features the key sees
    return {
        "namespace": model.namespace,
        "name": model.name,
        "phase": status.phase,
        "replicas": status.replicas,
        "readyReplicas": status.ready_replicas,
        "desiredReplicas": status.desired_replicas,
        "timeToReadySeconds": time_to_ready(model),
        "coldStart": _cold_start(model),
        "requests": stats.requests,
        "requestsPerSecond": stats.requests_per_second,
        "errorRate": stats.error_rate,
        "ttftP95Seconds": stats.ttft_p95_seconds,
        "windowSeconds": stats.window_seconds,
    }


def batches_owner(key: ApiKey | None) -> str | None:
    """Whose batches the caller sees: its own key's (a batch's requests are its owner's business, whatever
    the key's scopes); everyone's only with access control off (None)."""
    return None if key is None else key.name


def _batch(batch: dict[str, Any], now: float) -> dict[str, Any]:
    counts = batch.get("request_counts") or {}
    done = int(counts.get("completed") or 0) + int(counts.get("failed") or 0)
    started = batch.get("in_progress_at")
    ended = next(
        (batch[k] for k in ("finalizing_at", "cancelling_at", "failed_at", "expired_at") if batch.get(k)), None
    )
    # Batch times are whole seconds (OpenAI's shape): a batch done within one counts one second.
    elapsed = max(1.0, float(ended or now) - float(started)) if started else 0.0
    return {
        "id": batch.get("id"),
        "owner": batch.get("owner"),
        "status": batch.get("status"),
        "endpoint": batch.get("endpoint"),
        "total": int(counts.get("total") or 0),
        "completed": int(counts.get("completed") or 0),
        "failed": int(counts.get("failed") or 0),
        "createdAt": iso(float(batch["created_at"])) if batch.get("created_at") else None,
        # Throughput while it ran: finished requests per minute since it went in progress.
        "requestsPerMinute": round(done / elapsed * 60, 1) if elapsed > 0 else None,
    }


def build_view(
    table: RouteTable | None,
    features: Iterable[AIFeature],
    models: Iterable[AIModel],
    log: RequestLog,
    key: ApiKey | None,
    trace_url_template: str | None = None,
    batches: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The page's state for `key` (None: access control off). `batches`: the Batch API's newest batches of
    batches_owner(key), or None when the Batch API is off or unavailable."""
    shown_features = sorted(
        (f for f in features if _route_visible(key, table, f.namespace, f.name)), key=lambda f: (f.namespace, f.name)
    )
    # The AIModels behind a visible feature are named in its weights already: their status may show too.
    behind = {(f.namespace, parse_target(w.model).model) for f in shown_features for w in feature_weights(f)}
    shown_models = sorted(
        (
            m
            for m in models
            if (m.namespace, m.name) in behind or _route_visible(key, table, m.namespace, m.served_model_name)
        ),
        key=lambda m: (m.namespace, m.name),
    )
    visible: Visible = None
    if key is not None and key.scopes is not None:
        visible = partial(_route_visible, key, table)
    recent = [
        {
            "time": iso(r.time),
            "namespace": r.namespace,
            "feature": r.feature,
            "model": r.model,
            "status": r.status,
            "durationSeconds": r.seconds,
            "error": r.error,
            "failed": r.failed,
            "slow": r.slow,
            "traceId": r.trace_id,
            "traceUrl": trace_url(trace_url_template, r.trace_id),
        }
        for r in log.recent(visible)  # requests that never resolved to a route: only the unrestricted see them
    ]
    return {
        "generatedAt": iso(log.clock()),
        "scope": "everything" if key is None or key.scopes is None else f"key {key.name}",
        "replicaNote": REPLICA_NOTE,
        "slowSeconds": log.slow_seconds,
        "windowSeconds": log.window,
        "traces": bool(trace_url_template),
        "features": [_feature(f) for f in shown_features],
        "models": [_model(m, log, visible) for m in shown_models],
        "recent": recent,
        "batches": None if batches is None else [_batch(b, log.clock()) for b in batches],
    }
