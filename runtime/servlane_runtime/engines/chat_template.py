"""Rendering a chat through a Hugging Face tokenizer's chat template, tools included (both engines).

A template that has no place for tools renders them as nothing: the model would never see them and the
client would think it chose not to call any. So a template is asked once, with a probe tool, whether the
tool reaches the prompt; if not, a request with tools is refused (400) instead of silently served.
"""

from __future__ import annotations

from typing import Any

from .base import EngineError, RequestNotSupported

_PROBE_NAME = "servlane_probe_tool"
_PROBE_TOOL = {
    "type": "function",
    "function": {"name": _PROBE_NAME, "description": "probe", "parameters": {"type": "object", "properties": {}}},
}


class ChatTemplate:
    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._supports_tools: bool | None = None

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        if not getattr(self._tokenizer, "chat_template", None):
            raise EngineError("the model's tokenizer has no chat template; use /v1/completions")
        if not tools:
            return str(self._tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        if not self.supports_tools():
            raise RequestNotSupported("this model's chat template does not support tools; send the request without")
        rendered = self._tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True
        )
        return str(rendered)

    def supports_tools(self) -> bool:
        """Whether a tool given to the template shows up in the prompt (asked once, then remembered)."""
        if self._supports_tools is None:
            try:
                probe = self._tokenizer.apply_chat_template(
                    [{"role": "user", "content": "hi"}], tools=[_PROBE_TOOL], tokenize=False, add_generation_prompt=True
                )
                self._supports_tools = _PROBE_NAME in str(probe)
            except Exception:  # a template that raises on tools (or on this probe) cannot be trusted with them
                self._supports_tools = False
        return self._supports_tools
