"""engineOptions.toolCallParser reaches the engine: vLLM reads tool calls with the parser the config names, and
a name it does not know ends the runtime at startup, with the reason, before any weights load.

The transformers engine reads the hermes format only, so its config refuses any other parser (the AIModel's
CEL rule says the same at admission).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from servlane_api.runtime_exit import MODEL_LOAD_FAILED
from servlane_core.protocol.tools import ParsedToolCall
from tests.support import tool_model
from tests.support.servers import SubprocessServer, tiny_config
from tests.support.tools import TOOLS
from tests.support.vllm import require_vllm

tools_model_dir = tool_model.tools_model_dir


@pytest.mark.parametrize("parser", [None, "hermes"])
def test_the_transformers_engine_takes_hermes_or_nothing(tmp_path: Path, parser: str | None) -> None:
    assert tiny_config(tmp_path, tool_call_parser=parser).tool_call_parser == parser


def test_the_transformers_engine_refuses_another_parser(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="the transformers engine reads only hermes tool calls"):
        tiny_config(tmp_path, tool_call_parser="llama3_json")


def test_vllm_takes_any_parser_name_in_the_config(tmp_path: Path) -> None:
    """Names are vLLM's to judge (they change between versions, plugins add more): the engine checks them."""
    config = tiny_config(tmp_path, engine="vllm", tool_call_parser="no_such_parser")
    assert config.tool_call_parser == "no_such_parser"


def test_vllm_reads_calls_with_the_configured_parser(tools_model_dir: Path) -> None:
    """pythonic, not hermes: the same call in another model family's format."""
    require_vllm()
    from transformers import AutoTokenizer

    from servlane_runtime.engines.vllm_requests import VllmToolParser, tool_parser_class

    tokenizer = AutoTokenizer.from_pretrained(tools_model_dir)
    pythonic = VllmToolParser(tool_parser_class("pythonic"), tokenizer)
    text = "[get_weather(city='Oslo', unit='c'), get_time(zone='UTC', precise=True)]"
    content, calls = pythonic.parse(text, [dict(t) for t in TOOLS])
    assert not content
    assert calls == [
        ParsedToolCall("get_weather", '{"city": "Oslo", "unit": "c"}'),
        ParsedToolCall("get_time", '{"zone": "UTC", "precise": true}'),
    ]
    # The default is hermes, which does not read this format.
    hermes = VllmToolParser(tool_parser_class(None), tokenizer)
    assert hermes.parse(text, [dict(t) for t in TOOLS]) == (text, [])


@pytest.mark.slow
def test_an_unknown_parser_ends_the_vllm_runtime_at_startup(tools_model_dir: Path) -> None:
    require_vllm()
    config = tiny_config(tools_model_dir, engine="vllm", tool_call_parser="no_such_parser")
    started = time.monotonic()
    with SubprocessServer(config, {"HF_HUB_OFFLINE": "1"}, wait_for_health=False) as server:
        code = server.exit_code_within(180)
        took = time.monotonic() - started
        log, message = server.log(), server.termination_log.read_text()
    assert code == MODEL_LOAD_FAILED, log
    assert "unknown tool_call_parser 'no_such_parser'" in message
    assert "hermes" in message  # the names it does know
    # Refused before vLLM's engine core started (which alone takes most of a minute here).
    assert "EngineCore" not in log
    assert took < 120, f"took {took:.1f}s to refuse the parser"
