"""The prompt prefix that prefix-affinity routing hashes: what the model's KV cache can reuse.

Chat: the messages up to and including the first user message (role and text of each), at most
PREFIX_CHARS of them. A conversation resends its earlier messages with each turn, so every turn of it
has the same key and lands on the pod that already holds its prefix, from the first turn on (the first N
characters of the whole rendering would change between the first turns of a short conversation).
Requests sharing a long system prompt share a key too: the bounded load spreads them once that pod is
busy. Completions and embeddings: the first PREFIX_CHARS of the prompt (or first input).
"""

from __future__ import annotations

import json
from typing import Any

PREFIX_CHARS = 2048


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: their text, and anything else as it was sent
        return "".join(
            str(part.get("text", "")) if isinstance(part, dict) and part.get("type") == "text" else _dump(part)
            for part in content
        )
    return _dump(content)


def _dump(value: object) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return ""


def prompt_prefix(body: dict[str, Any], chars: int = PREFIX_CHARS) -> str | None:
    """The key to hash, or None when the body has nothing to hash (then the pick is by load)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        rendered: list[str] = []
        size = 0
        for message in messages:
            if not isinstance(message, dict):
                continue
            part = f"{message.get('role', '')}\x1f{_text(message.get('content'))}\x1e"
            rendered.append(part)
            size += len(part)
            if message.get("role") == "user" or size >= chars:
                break
        return "".join(rendered)[:chars] or None
    prompt = body.get("prompt", body.get("input"))
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch: its first prompt (one request goes to one pod anyway)
    if isinstance(prompt, str):
        return prompt[:chars] or None
    if isinstance(prompt, list):  # token ids
        return _dump(prompt[:chars]) or None
    return None
