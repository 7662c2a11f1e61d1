"""When a rollout acts: the analysis window, the progress deadline, the next analysis and the requeue.

An analysis is due one window after the step started or after the last analysis, whichever is later; the
window is never shorter than the metric source can measure.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from servlane_api.aifeature import MAX_ROLLOUT_INTERVAL, AIFeatureSpec, AIFeatureStatus, FeaturePhase, Rollout
from servlane_core.rollout.timeutil import from_rfc3339, parse_duration

WAITING_POLL_SECONDS = 10.0
IN_FLIGHT: tuple[FeaturePhase, ...] = ("Progressing", "Paused")
MAX_WINDOW_SECONDS = parse_duration(MAX_ROLLOUT_INTERVAL)


def analysis_window_seconds(rollout: Rollout, min_window_seconds: float = 0.0) -> float:
    """The time between two analyses, and the window each reads: the interval, or the source's minimum."""
    # Bounded as the API bounds new intervals (an object stored before that would overflow the datetime).
    return min(max(parse_duration(rollout.interval), min_window_seconds), MAX_WINDOW_SECONDS)


def progress_deadline_seconds(rollout: Rollout, window_seconds: float) -> float:
    """The spec's deadline, but never less than two analysis windows (one window may be a baseline)."""
    return max(float(rollout.progress_deadline_seconds), 2 * window_seconds)


def analysis_due(spec: AIFeatureSpec, status: AIFeatureStatus, now: datetime, min_window_seconds: float = 0.0) -> bool:
    """Whether plan() will analyse metrics now: read them only then (the scrape reader's window is per call)."""
    if spec.split is not None or status.phase not in IN_FLIGHT or status.canary_model is None:
        return False
    due = next_analysis_at(analysis_window_seconds(spec.rollout, min_window_seconds), status)
    return due is not None and now >= due


def next_analysis_at(window: float, status: AIFeatureStatus) -> datetime | None:
    """One window after the step started or after the last analysis, whichever is later."""
    if status.step_index is None or status.step_started_at is None:
        return None
    anchor = from_rfc3339(status.step_started_at)
    if status.analyses:
        anchor = max(anchor, from_rfc3339(status.analyses[-1].time))
    return anchor + timedelta(seconds=window)


def requeue_after(rollout: Rollout, status: AIFeatureStatus, now: datetime, window: float) -> float | None:
    if status.phase not in IN_FLIGHT or status.canary_model is None:
        return None
    due = next_analysis_at(window, status)
    if due is None:
        return WAITING_POLL_SECONDS
    return max(1.0, (due - now).total_seconds())
