"""`servlane serve` says why a runtime exited: the runtime's termination message (e.g. the engine's own start
error), not only its exit code."""

from __future__ import annotations

import sys
from pathlib import Path

from servlane_api.runtime_config import RuntimeConfig
from servlane_api.runtime_exit import TERMINATION_LOG_ENV
from servlane_cli.local_config import LocalRuntime
from servlane_cli.supervised_runtime import SupervisedRuntime
from tests.support.aimodels import make_model
from tests.support.polling import wait_until

CAUSE = "loading vllm engine from /m failed: EngineError: vLLM's engine core failed to start: ValueError: no room"


def test_the_exit_reason_carries_the_runtimes_termination_message(tmp_path: Path) -> None:
    model = make_model({"source": {"uri": "/m"}, "engine": "vllm"})
    config = RuntimeConfig(model_source="/m", served_model_name="llama", engine="vllm")
    supervised = SupervisedRuntime(model, LocalRuntime(config, {}, ()), tmp_path / "llama.log", False)
    # A stand-in for the runtime: it writes its reason where it was told, as servlane_runtime does, and exits 10.
    script = f"import os; open(os.environ[{TERMINATION_LOG_ENV!r}], 'w').write({CAUSE!r} + '\\n'); raise SystemExit(10)"
    supervised.process.argv = [sys.executable, "-c", script]
    supervised.process.start()
    wait_until("the stand-in to exit", lambda: supervised.process.process.poll() is not None, 30)  # type: ignore[union-attr]
    supervised.supervise(now=0.0)
    assert supervised.reason.startswith(f"exited with code 10: {CAUSE}; restart 1 in")
    supervised.process.kill_now()
