"""A runtime that cannot serve ends at once, with a code and a reason, instead of staying up unready.

The kubelet then restarts it (CrashLoopBackOff) and the operator quotes the reason in the AIModel's status,
rather than a pod that waits out a 30-minute startup probe.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from servlane_api.runtime_exit import MODEL_LOAD_FAILED, MODEL_SOURCE_FAILED
from servlane_runtime.engines.base import EngineDeadError
from servlane_runtime.engines.transformers_engine import as_engine_death, is_device_failure
from tests.support.servers import SubprocessServer, tiny_config

SECRET = "s3cr3t-value-for-the-test"


def test_a_model_path_that_does_not_exist_ends_the_process_with_the_reason(tmp_path: Path) -> None:
    missing = tmp_path / f"models-{SECRET}" / "missing"
    started = time.monotonic()
    with SubprocessServer(tiny_config(missing), {"MY_API_TOKEN": SECRET}, wait_for_health=False) as server:
        code = server.exit_code_within(60)
        took = time.monotonic() - started
        log, message = server.log(), server.termination_log.read_text()
    # A source that is not there is the source's failure (the AIModel says ModelSourceFailed), not the engine's.
    assert code == MODEL_SOURCE_FAILED, log
    assert took < 30, f"took {took:.1f}s to give up on a missing path"
    assert "does not exist" in log
    assert message.count("\n") == 1
    assert "does not exist" in message
    # The termination message is copied into the pod's status, readable by anyone who can read pods.
    assert SECRET not in message
    assert "models-***" in message


def test_a_directory_without_a_model_ends_the_process(tmp_path: Path) -> None:
    with SubprocessServer(tiny_config(tmp_path), wait_for_health=False) as server:
        code = server.exit_code_within(120)
        log, message = server.log(), server.termination_log.read_text()
    assert code == MODEL_LOAD_FAILED, log
    assert str(tmp_path) in message


@pytest.mark.parametrize(
    ("error", "dead"),
    [
        (RuntimeError("CUDA error: an illegal memory access was encountered"), True),
        (RuntimeError("CUDA error: device-side assert triggered"), True),
        (RuntimeError("CUDA error: out of memory"), False),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), False),
        (ValueError("Input length of input_ids is 9000"), False),
        (RuntimeError("shape mismatch"), False),
    ],
)
def test_only_device_failures_kill_the_transformers_engine(error: Exception, dead: bool) -> None:
    assert is_device_failure(error) is dead
    converted = as_engine_death(error)
    if dead:
        assert isinstance(converted, EngineDeadError)
        assert converted.__cause__ is error
    else:
        assert converted is error
