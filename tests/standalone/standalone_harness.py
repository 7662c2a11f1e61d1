"""`servlane serve` as a real subprocess, read through its state file, driven with the `openai` client."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml
from prometheus_client.parser import text_string_to_metric_families

from servlane_api.metric_names import WEIGHT
from servlane_cli.state import STATE_FILE, SupervisorState, read_state
from tests.support.polling import wait_until

STARTUP_SECONDS = 150.0  # several runtimes importing torch at once on 2 busy cores


def write_manifests(path: Path, documents: list[dict[str, Any]]) -> None:
    """Replace a manifest file atomically, as an editor's save would (the supervisor never sees half)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    os.replace(tmp, path)


def group_gone(pid: int) -> bool:
    """No process is left in the process group the supervisor started `pid` in."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


class Serve:
    def __init__(self, manifests: Path, state_dir: Path, env: dict[str, str] | None = None) -> None:
        self.state_dir = state_dir
        self.log_path = state_dir.parent / f"{state_dir.name}-serve.log"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
        argv = [sys.executable, "-m", "servlane_cli", "serve", "-f", str(manifests), "--port", "0"]
        argv += ["--state-dir", str(state_dir), "--stop-timeout", "5"]
        self.early_chat: tuple[str, int | None] = ("", None)  # stderr and exit code of a chat run during startup
        with self.log_path.open("wb") as out:
            self.process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)

    def state(self) -> SupervisorState | None:
        if not (self.state_dir / STATE_FILE).is_file():
            return None
        return read_state(self.state_dir)

    def must_state(self) -> SupervisorState:
        state = self.state()
        assert state is not None, "no state file yet"
        return state

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, models: list[str], timeout: float = STARTUP_SECONDS) -> SupervisorState:
        def all_ready() -> SupervisorState | None:
            assert self.process.poll() is None, f"servlane serve exited:\n{self.log()}"
            state = self.state()
            if state is None or state.gateway.pid is None:
                return None
            ready = {m.name for m in state.models if m.phase == "Ready"}
            return state if ready >= set(models) else None

        state = wait_until(f"models {models} Ready", all_ready, timeout)

        def routed() -> bool:
            # The gateway reloads the routes file on its own clock: Ready in the state file is not yet
            # routable. A feature whose stable model is ready must carry weight in the gateway.
            try:
                weights = {f.name: self.gateway_weights(f.name) for f in state.features}
            except httpx.HTTPError:
                return False  # the gateway is not listening yet
            return all(sum(weights[f.name].values()) for f in state.features if f.status.stable_model in models)

        wait_until("the gateway to route to the ready models", routed, 10)
        return state

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.must_state().gateway.url + "/v1", api_key="unused", max_retries=0)

    def gateway_weights(self, feature: str) -> dict[str, float]:
        """The weights the gateway applies now (its route_weight gauge), model -> percent."""
        text = httpx.get(self.must_state().gateway.metrics_url, timeout=5).text
        return {
            sample.labels["model"]: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == WEIGHT and sample.labels.get("feature") == feature and sample.value > 0
        }

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "servlane_cli", *args, "--state-dir", str(self.state_dir)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)

    def cli_background(self, *args: str) -> subprocess.Popen[str]:
        argv = [sys.executable, "-m", "servlane_cli", *args, "--state-dir", str(self.state_dir)]
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def stop(self, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise

    def kill_everything(self) -> None:
        """Test teardown after a failure: nothing may outlive the test run."""
        state = self.state()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.stop(timeout=20)
        pids = [m.pid for m in state.models] + [state.gateway.pid] if state else []
        for pid in pids:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)


# The standalone canary tests' rollout: a step a second on windows of a few requests. Such a window judges
# latency on its slowest request, and these tests are about routing, errors, crashes and promotion: they allow
# 10x the stable's p95 (not 2x), so a request slowed by a busy machine does not roll a good canary back. Still
# caught: a canary seconds slower than the stable (the latency check's own cases:
# tests/unit/rollout/test_rollout_failure_modes.py).
FAST_ROLLOUT: dict[str, Any] = {
    "steps": [50, 100],
    "interval": "1s",
    "analysis": {"minRequests": 3, "maxErrorRate": 0.05, "maxP95RatioToStable": 10},
}


def ai_model(name: str, source: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "servlane.dev/v1alpha1",
        "kind": "AIModel",
        "metadata": {"name": name},
        "spec": {"source": {"uri": source}, "engine": "transformers", **spec},
    }


def ai_feature(name: str, model: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "servlane.dev/v1alpha1",
        "kind": "AIFeature",
        "metadata": {"name": name},
        "spec": {"model": model, **spec},
    }
