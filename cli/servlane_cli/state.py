"""The supervisor's state file: what `servlane status` and `servlane chat` read.

One JSON file per set of inputs (default folder: ~/.cache/servlane/standalone/<hash of the -f paths>),
replaced atomically so readers never see half of it. The AIFeature status inside is the API's own
model, so a later `serve` resumes a rollout where it stopped, as the operator does after a restart.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pydantic import BaseModel, Field

from servlane_api.aifeature import AIFeatureStatus
from servlane_api.cold_start import ColdStartSample
from servlane_cli.manifests import inputs_key

STATE_FILE = "state.json"
ROUTES_FILE = "routes.json"
LOCK_FILE = "supervisor.lock"


class ModelState(BaseModel):
    name: str
    served_model_name: str
    engine: str
    task: str
    phase: str  # the AIModel phases (Pending, Deploying, Ready, Failed), or Stopped after `serve` ended
    reason: str = ""
    port: int
    endpoint: str
    pid: int | None = None
    restarts: int = 0
    last_exit_code: int | None = None
    load_seconds: float | None = None
    # The runtime's own start, step by step (its /startup), once it is ready.
    cold_start: ColdStartSample | None = None
    log_file: str
    warnings: list[str] = Field(default_factory=list)


class FeatureState(BaseModel):
    name: str
    namespace: str = "default"  # a state file written before this field: the standalone default
    target: str | None  # spec.model (None for a fixed split)
    generation: int
    status: AIFeatureStatus


class GatewayProcessState(BaseModel):
    url: str  # base URL; the OpenAI API is under /v1
    metrics_url: str = ""  # its /metrics, on a port of its own (the API port has none)
    pid: int | None = None
    restarts: int = 0
    log_file: str


class SupervisorState(BaseModel):
    supervisor_pid: int
    running: bool
    inputs: list[str]
    updated_at: str
    manifest_error: str | None = None  # the last edit that did not load (the previous manifests stay)
    manifests_applied: bool = False  # some manifests loaded since the start (else the error left nothing running)
    gateway: GatewayProcessState
    models: list[ModelState] = Field(default_factory=list)
    features: list[FeatureState] = Field(default_factory=list)

    def model(self, name: str) -> ModelState | None:
        return next((m for m in self.models if m.name == name), None)

    def feature(self, name: str) -> FeatureState | None:
        return next((f for f in self.features if f.name == name), None)


def default_state_dir(inputs: list[Path]) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "servlane" / "standalone"
    return base / inputs_key(inputs)


def write_atomically(path: Path, text: str) -> None:
    """Write a temporary file next to `path`, then rename it over: readers see the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_state(state_dir: Path) -> SupervisorState | None:
    path = state_dir / STATE_FILE
    if not path.is_file():
        return None
    return SupervisorState.model_validate_json(path.read_text())


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
