"""The tiny Llama with a chat template that supports tools (hermes/Qwen style), for the tool-calling tests.

The shared tiny model's template has no place for tools (and the runtime refuses tools for it, which is
tested too). This copy differs only in its template: without tools it renders exactly as the shared one;
with tools it lists them in a system turn and writes earlier calls as `<tool_call>{"name", "arguments"}`
(the format Qwen2.5 and Hermes models are trained on). Built once per session in a temporary folder.

Use from a test module: `tools_model_dir = tool_model.tools_model_dir` (so pytest finds the fixture).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.models import build_tiny_llama

TOOLS_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|system|>\n"
    "You may call functions. Their signatures, within <tools></tools>:\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n"
    "Return each call as a JSON object within <tool_call></tool_call> tags:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>{{ eos_token }}\n'
    "{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
    "{% for call in m.get('tool_calls') or [] %}<tool_call>\n"
    '{"name": {{ call.function.name | tojson }}, "arguments": {{ call.function.arguments | tojson }}}\n'
    "</tool_call>{% endfor %}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@pytest.fixture(scope="session")
def tools_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoTokenizer

    target = tmp_path_factory.mktemp("tiny-llama-tools") / "model"
    shutil.copytree(build_tiny_llama(), target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    tokenizer.chat_template = TOOLS_CHAT_TEMPLATE
    tokenizer.save_pretrained(target)
    # transformers keeps a template in chat_template.jinja or tokenizer_config.json: make sure ours won.
    assert AutoTokenizer.from_pretrained(target).chat_template == TOOLS_CHAT_TEMPLATE
    return target
