"""The models, features and analyses that the console tests show."""

from __future__ import annotations

from typing import Any

from tests.support.gateway_harness import aifeature, aimodel

ANALYSES = [
    {"time": "2026-01-01T10:00:00Z", "step": 0, "canaryModel": "chat-v2", "canaryWeight": 10, "verdict": "advance",
     "outcome": "pass", "canaryErrorRate": 0.0, "canaryRequests": 120},
    {"time": "2026-01-01T10:05:00Z", "step": 1, "canaryModel": "chat-v2", "canaryWeight": 25, "verdict": "hold",
     "outcome": "inconclusive", "canaryRequests": 8},
    {"time": "2026-01-01T10:10:00Z", "step": 1, "canaryModel": "chat-v2", "canaryWeight": 25, "verdict": "advance",
     "outcome": "pass", "canaryErrorRate": 0.01, "canaryRequests": 300},
    {"time": "2026-01-01T10:15:00Z", "step": 2, "canaryModel": "chat-v2", "canaryWeight": 50, "verdict": "rollback",
     "outcome": "fail", "canaryErrorRate": 0.3, "canaryRequests": 500},
]  # fmt: skip


def console_objects(v1: str, v2: str) -> list[dict[str, Any]]:
    """`chat` split over chat-v1/chat-v2 with a canary history; `summary` on chat-v1 alone; and a model in
    another namespace."""
    chat = aifeature("chat", [("chat-v1", 50), ("chat-v2", 50)])
    chat["status"] |= {"phase": "Progressing", "canaryModel": "chat-v2", "canaryWeight": 50, "analyses": ANALYSES}
    summary = aifeature("summary", [("chat-v1", 100)])
    models = [aimodel("chat-v1", v1), aimodel("chat-v2", v2)]
    for m in models:
        m["metadata"]["creationTimestamp"] = "2026-01-01T09:00:00Z"
        m["status"] |= {"phase": "Ready", "replicas": 1, "readyReplicas": 1, "desiredReplicas": 1}
        m["status"]["conditions"][0]["lastTransitionTime"] = "2026-01-01T09:02:00Z"
    # chat-v1's pods have started twice (status.coldStart, as the operator's cold_start_reader writes it).
    last = {
        "pod": "model-chat-v1-b",
        "created": "2026-01-01T09:00:00Z",
        "scheduled": 1.0,
        "engineLoaded": 6.5,
        "podReady": 0.5,
        "total": 14.0,
    }
    models[0]["status"]["coldStart"] = {"last": last, "median": {"total": 12.0}, "recent": [
        {"pod": "model-chat-v1-a", "created": "2025-12-31T09:00:00Z", "total": 10.0}, last]}  # fmt: skip
    hidden = aimodel("secret-model", v1)
    hidden["metadata"]["namespace"] = "other"
    return [chat, summary, *models, hidden]
