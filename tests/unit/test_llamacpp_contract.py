"""An AIModel with engine llamacpp as its runtime reads it: engineOptions.llamacpp mapped, threads from the pod's
whole CPUs unless set, the CPU runtime image."""

from __future__ import annotations

from typing import Any

import pytest

from servlane_api.aimodel import AIModel
from servlane_api.runtime_config import LlamaCppSettings
from servlane_api.runtime_contract import build_runtime_config, whole_cpus


def llamacpp_model(**spec: Any) -> AIModel:
    body = {"source": {"uri": "pvc://models/qwen-gguf"}, "engine": "llamacpp", **spec}
    return AIModel.model_validate({"metadata": {"name": "q", "namespace": "team"}, "spec": body})


@pytest.mark.parametrize(("quantity", "cpus"), [("500m", 1), ("1", 1), ("1500m", 1), ("2.5", 2), ("16", 16)])
def test_whole_cpus_rounds_down_and_keeps_one(quantity: str, cpus: int) -> None:
    assert whole_cpus(quantity) == cpus


@pytest.mark.parametrize(
    ("quantity", "cpus"), [("2k", 512), ("1Ki", 512), ("0.5k", 500), ("64", 64), ("999999999E", 512), (".5", 1)]
)
def test_every_quantity_the_schema_admits_is_read_and_bounded(quantity: str, cpus: int) -> None:
    """`1k` crashed the Deployment builder (float('1k')): the operator retried it for good, nothing in status."""
    model = llamacpp_model(resources={"cpu": quantity})  # admitted by the AIModel's own pattern
    assert whole_cpus(quantity) == cpus
    config = build_runtime_config(model)
    assert config.llamacpp is not None
    assert config.llamacpp.threads == cpus


def test_the_options_reach_the_runtime_and_threads_follow_the_cpu_limit() -> None:
    options = {
        "ggufFile": "qwen-Q4_K_M.gguf",
        "parallelRequests": 8,
        "batchSize": 256,
        "mlock": True,
        "promptCacheMiB": 0,
    }
    config = build_runtime_config(llamacpp_model(engineOptions={"llamacpp": options}, resources={"cpu": "3500m"}))
    assert (config.engine, config.model_source) == ("llamacpp", "/mnt/models/qwen-gguf")
    assert config.llamacpp == LlamaCppSettings(
        gguf_file="qwen-Q4_K_M.gguf", threads=3, parallel=8, batch_size=256, mmap=True, mlock=True, prompt_cache_mib=0
    )


def test_threads_set_by_hand_win_and_without_a_cpu_limit_the_runtime_counts_its_cpus() -> None:
    pinned = llamacpp_model(engineOptions={"llamacpp": {"threads": 6}}, resources={"cpu": "2"})
    assert build_runtime_config(pinned).llamacpp.threads == 6
    assert build_runtime_config(llamacpp_model()).llamacpp == LlamaCppSettings()
    assert build_runtime_config(llamacpp_model(resources={"cpu": "4"})).llamacpp.threads == 4


def test_other_engines_carry_the_defaults_only() -> None:
    model = AIModel.model_validate({"metadata": {"name": "t"}, "spec": {"source": {"uri": "/m"}, "engine": "vllm"}})
    assert build_runtime_config(model).llamacpp == LlamaCppSettings()
