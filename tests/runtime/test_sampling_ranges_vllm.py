"""Our request models accept a sampling value exactly when vLLM's own validation does (its OpenAI protocol
model, then SamplingParams), so neither engine meets a value vLLM would refuse, and no value vLLM serves
is refused here. The one deliberate difference: `n` stops at 16 (vLLM allows 16,384 sequences).
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import pytest
from pydantic import ValidationError

from servlane_core.protocol import openai as p
from tests.support.vllm import require_vllm

pytestmark = pytest.mark.slow

TINY = 5e-324  # the smallest positive float: found by fuzzing, a 500 on the transformers engine
CASES: dict[str, list[Any]] = {
    "temperature": [0.0, TINY, 1e-300, 0.005, 0.01, 1.0, 2.0, 2.0000001, -TINY, -1.0, math.inf, math.nan],
    "top_p": [TINY, 1e-9, 0.5, 1.0, 0.0, -TINY, 1.0000001, math.inf, math.nan],
    "presence_penalty": [-2.0, 0.0, 2.0, -2.0000001, 2.0000001, math.nan],
    "frequency_penalty": [-2.0, 2.0, 2.0000001, -math.inf],
    "max_tokens": [1, 10**30, 0, -1],
    "seed": [0, -1, p.SEED_MIN, p.SEED_MAX, p.SEED_MAX + 1, p.SEED_MIN - 1, 10**400],
    "n": [1, 16, 0, -1],
}


@pytest.fixture(scope="module")
def vllm_accepts() -> Any:
    require_vllm()
    sampling = importlib.import_module("vllm.sampling_params")
    protocol = importlib.import_module("vllm.entrypoints.openai.chat_completion.protocol")
    refusals = (ValueError, TypeError, importlib.import_module("vllm.exceptions").VLLMValidationError)

    def accepts(field: str, value: Any) -> bool:
        try:
            protocol.ChatCompletionRequest.model_validate(chat(**{field: value}))
            sampling.SamplingParams(**{field: value})
        except refusals:  # pydantic's ValidationError is a ValueError
            return False
        return True

    return accepts


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def we_accept(field: str, value: Any) -> bool:
    try:
        p.ChatCompletionRequest.model_validate(chat(**{field: value}))
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize(("field", "value"), [(f, v) for f, values in CASES.items() for v in values])
def test_the_same_values_as_vllm(vllm_accepts: Any, field: str, value: Any) -> None:
    assert we_accept(field, value) == vllm_accepts(field, value), f"{field}={value!r}"


def test_n_is_capped_below_vllms_cap(vllm_accepts: Any) -> None:
    assert vllm_accepts("n", 17)
    assert not we_accept("n", 17)
