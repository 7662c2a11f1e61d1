"""`servlane status`: the supervisor's state file as tables (or as JSON with --json)."""

from __future__ import annotations

from collections.abc import Sequence

from servlane_api.aifeature import AnalysisResult
from servlane_api.cold_start import ColdStartSample
from servlane_cli.state import SupervisorState, pid_alive


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [headers, *rows]]
    return "\n".join(lines)


def _text(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _analysis_row(feature: str, a: AnalysisResult) -> list[str]:
    return [
        feature,
        a.time,
        _text(a.canary_model),
        f"{a.canary_weight}%" if a.canary_weight is not None else "-",
        a.verdict,
        str(a.canary_requests),
        _percent(a.canary_error_rate),
        a.message,
    ]


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def _cold_start_row(model: str, cold: ColdStartSample) -> list[str]:
    steps = (cold.runtime_imports, cold.weights_fetched, cold.engine_loaded, cold.runtime_ready, cold.first_token)
    return [model, _seconds(cold.total), *(_seconds(step) for step in steps)]


def render_status(state: SupervisorState) -> str:
    alive = state.running and pid_alive(state.supervisor_pid)
    header = (
        f"servlane serve (pid {state.supervisor_pid}) running, gateway {state.gateway.url}/v1"
        if alive
        else f"servlane serve is not running (last state from {state.updated_at})"
    )
    parts = [header]
    if state.manifest_error:
        kept = "previous manifests still applied" if state.manifests_applied else "nothing applied"
        parts.append(f"manifest error ({kept}): {state.manifest_error}")
    models = [
        [
            m.name,
            m.phase,
            m.endpoint,
            _text(m.pid),
            str(m.restarts),
            _text(m.last_exit_code),
            m.reason if m.phase != "Ready" else f"loaded in {m.load_seconds or 0:.1f}s",
        ]
        for m in state.models
    ]
    parts.append(table(["MODEL", "PHASE", "ENDPOINT", "PID", "RESTARTS", "LAST EXIT", "INFO"], models))
    # Each runtime's last start, from its own /startup: process start to ready, step by step.
    starts = [_cold_start_row(m.name, m.cold_start) for m in state.models if m.cold_start is not None]
    if starts:
        headers = ["COLD START", "TOTAL", "IMPORTS", "WEIGHTS", "ENGINE", "WARM-UP", "FIRST TOKEN AFTER"]
        parts.append(table(headers, starts))
    features = []
    analyses = []
    for f in state.features:
        s = f.status
        weights = ", ".join(f"{w.model}={w.weight}%" for w in s.weights)
        features.append(
            [f.name, _text(s.phase), _text(s.stable_model), _text(s.canary_model), weights or "-", _text(f.target)]
        )
        if s.last_analysis is not None:
            analyses.append(_analysis_row(f.name, s.last_analysis))
    parts.append(table(["FEATURE", "PHASE", "STABLE", "CANARY", "WEIGHTS", "TARGET"], features))
    if analyses:
        headers = ["LAST ANALYSIS", "TIME", "CANARY", "WEIGHT", "VERDICT", "REQUESTS", "ERRORS", "MESSAGE"]
        parts.append(table(headers, analyses))
    return "\n\n".join(parts)
