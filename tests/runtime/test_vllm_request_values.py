"""Request values vLLM refuses are 400s, never 500s, found by fuzzing the vLLM engine (#29 item 2).

No engine is started: vLLM checks the values when it builds its SamplingParams, before the engine sees them.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from servlane_core.protocol import openai as p
from servlane_runtime.engines.base import RequestNotSupported, SamplingOptions
from servlane_runtime.engines.vllm_engine import VllmEngine
from tests.support.vllm import require_vllm, vllm_config


def chat(**fields: object) -> p.ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return p.ChatCompletionRequest.model_validate(body)


@pytest.mark.parametrize("stop", ["", [""], ["", "x"]])
def test_empty_stop_strings_are_dropped(stop: object) -> None:
    assert chat(stop=stop).stop_list() == ([] if stop != ["", "x"] else ["x"])


def test_a_value_vllm_refuses_is_request_not_supported(tmp_path: Path) -> None:
    """`stop: ""` once reached SamplingParams, whose ValueError was raised outside the engine's mapping: a 500."""
    require_vllm()
    engine = VllmEngine(vllm_config(tmp_path), str(tmp_path))

    async def first() -> None:
        async for _ in engine.generate("hi", SamplingOptions(max_tokens=4, stop=("",)), "r1"):
            break

    with pytest.raises(RequestNotSupported, match="empty string"):
        asyncio.run(first())


def test_a_refused_sampling_value_does_not_blame_response_format(tmp_path: Path) -> None:
    """The 400 names the field at fault when the engine knows it: a sampling value is not the schema's fault
    (every generation-time refusal was once reported as `param: response_format`)."""
    require_vllm()
    engine = VllmEngine(vllm_config(tmp_path), str(tmp_path))
    schema = json.dumps({"type": "object", "properties": {"x": {"type": "string"}}})

    async def first() -> None:
        options = SamplingOptions(max_tokens=4, stop=("",), json_schema=schema)
        async for _ in engine.generate("hi", options, "r1"):
            break

    with pytest.raises(RequestNotSupported) as refused:
        asyncio.run(first())
    assert refused.value.param is None
