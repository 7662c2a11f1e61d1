"""A feature's request defaults (AIFeature.spec.defaults), applied to the parsed body in place."""

from __future__ import annotations

from typing import Any

from servlane_api.aifeature import FeatureDefaults

CHAT = "chat/completions"
COMPLETIONS = "completions"


def apply_defaults(body: dict[str, Any], defaults: FeatureDefaults, endpoint: str) -> None:
    """System prompt prepended when the chat has none; temperature/top_p set when absent; max_tokens
    (and max_completion_tokens) capped, and set to the cap when absent so the cap always holds."""
    if endpoint not in (CHAT, COMPLETIONS):
        return
    messages = body.get("messages")
    if endpoint == CHAT and defaults.system_prompt and isinstance(messages, list):
        has_system = any(isinstance(m, dict) and m.get("role") in ("system", "developer") for m in messages)
        if not has_system:
            body["messages"] = [{"role": "system", "content": defaults.system_prompt}, *messages]
    if defaults.temperature is not None and body.get("temperature") is None:
        body["temperature"] = defaults.temperature
    if defaults.top_p is not None and body.get("top_p") is None:
        body["top_p"] = defaults.top_p
    cap = defaults.max_tokens_cap
    if cap is not None:
        present = [f for f in ("max_tokens", "max_completion_tokens") if body.get(f) is not None]
        for field in present:
            value = body[field]
            if isinstance(value, int) and value > cap:
                body[field] = cap
        if not present:
            body["max_tokens"] = cap
