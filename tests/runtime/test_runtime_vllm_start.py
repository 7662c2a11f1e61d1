"""vLLM that cannot start says why: the termination message (and /health while it lasts) names the engine
core's own exception, not vLLM's "Engine core initialization failed. See root cause above"."""

from __future__ import annotations

from pathlib import Path

import pytest

from servlane_api.runtime_exit import MODEL_LOAD_FAILED
from tests.support.servers import SubprocessServer
from tests.support.vllm import VLLM_ENV, VLLM_START_SECONDS, require_vllm, vllm_config

pytestmark = pytest.mark.slow


def test_a_kv_cache_larger_than_the_machine_is_named_in_the_termination_message(tiny_llama_dir: Path) -> None:
    require_vllm()
    config = vllm_config(tiny_llama_dir, cpu_kv_cache_gib=100_000)
    with SubprocessServer(config, VLLM_ENV, wait_for_health=False) as server:
        code = server.exit_code_within(VLLM_START_SECONDS)
        message = server.termination_log.read_text()
    assert code == MODEL_LOAD_FAILED, server.log()
    assert "vLLM's engine core failed to start" in message
    assert "100000.0 GiB" in message  # vLLM's own words about the KV cache it could not have
    assert "Engine core initialization failed" not in message
