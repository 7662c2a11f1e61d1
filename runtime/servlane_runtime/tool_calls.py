"""Which generated text is content and which becomes tool calls, per choice, streamed or not.

The runtime's own parser reads the hermes/Qwen format (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`,
several for parallel calls), which most tool-capable open models' templates teach; an engine may bring its
own (vLLM's tool parsers). Forced calls come as guided JSON (servlane_core.protocol.tools), not in the
template's format, so they never need a parser.
"""

from __future__ import annotations

import json
import re
from typing import Any

from servlane_core.protocol.tools import OutputPlan, ParsedToolCall, calls_from_cut_forced_json, calls_from_forced_json

from .engines.base import ToolCallParser

HERMES_START = "<tool_call>"
_HERMES_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


class HermesToolParser:
    """`<tool_call>` JSON objects; a call that is not valid JSON is left in the content, not guessed at."""

    start_marker = HERMES_START

    def parse(self, text: str, tools: list[dict[str, Any]]) -> tuple[str | None, list[ParsedToolCall]]:
        start = text.find(HERMES_START)
        if start < 0:
            return text, []
        calls = []
        for body in _HERMES_CALL.findall(text[start:]):
            try:
                value = json.loads(body)
            except ValueError:
                return text, []
            if not isinstance(value, dict) or not isinstance(value.get("name"), str):
                return text, []
            arguments = value.get("arguments", value.get("parameters", {}))
            as_text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
            calls.append(ParsedToolCall(value["name"], as_text))
        return (text[:start] or None), calls


class ChoiceOutput:
    """One choice's text as it is generated: `push` returns the content that may be sent now, `finish` the
    rest of the content and the tool calls. Without tools everything is content, at once."""

    def __init__(self, plan: OutputPlan, parser: ToolCallParser | None) -> None:
        self._mode = plan.tool_mode
        self._tools = plan.tools or []
        self._parser = parser or HermesToolParser()
        self._text = ""
        self._sent = 0
        self._held = False  # auto: a tool call may have started, nothing more is sent as it comes

    def push(self, text: str) -> str:
        if self._mode == "none":
            return text
        self._text += text
        if self._mode == "forced" or self._held:
            return ""
        marker = self._parser.start_marker
        at = self._text.find(marker, max(0, self._sent - len(marker)))
        if at >= 0:
            self._held = True
            safe = at
        else:
            safe = len(self._text) - _partial_suffix(self._text, marker)
        out = self._text[self._sent : safe] if safe > self._sent else ""
        self._sent = max(self._sent, safe)
        return out

    def finish(self) -> tuple[str, list[ParsedToolCall]]:
        if self._mode == "none":
            return "", []
        if self._mode == "forced":
            # Cut short (max_tokens): the calls as far as they came; never the guided array's own text.
            return "", calls_from_forced_json(self._text) or calls_from_cut_forced_json(self._text)
        _, calls = self._parser.parse(self._text, self._tools)
        if not calls:
            return self._text[self._sent :], []
        return "", calls


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that could still grow into `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
