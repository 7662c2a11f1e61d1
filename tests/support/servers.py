"""Start the runtime for tests: in this process (uvicorn in a thread) or as `python -m servlane_runtime`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import uvicorn

from servlane_api.runtime_config import RuntimeConfig
from servlane_api.runtime_exit import TERMINATION_LOG_ENV
from servlane_runtime.app import create_app
from servlane_runtime.engines import create_engine
from servlane_runtime.metrics_port import bind_listeners
from servlane_runtime.model_host import EngineFactory
from servlane_runtime.server_options import server_options
from tests.support.polling import wait_until
from tests.support.ports import free_port


class _Server:
    base_url: str
    metrics_url: str  # /metrics, on the runtime's metrics port (the API port has none)

    @property
    def v1(self) -> str:
        return f"{self.base_url}/v1"

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.base_url + path, timeout=10)

    def ready_body(self) -> dict[str, Any]:
        return dict(self.get("/ready").json())

    def wait_ready(self, timeout: float = 120) -> None:
        wait_until("/ready", lambda: self._ready_or_failed(), timeout)
        body = self.ready_body()
        assert body["status"] == "ready", body

    def _ready_or_failed(self) -> bool:
        try:
            return self.ready_body()["status"] in ("ready", "failed")
        except httpx.HTTPError:
            return False

    def metric(self, name: str, labels: str = "") -> float:
        """A sample's value from /metrics (0 when absent), e.g. metric("x_total", 'code="200"')."""
        total = 0.0
        for line in httpx.get(self.metrics_url, timeout=10).text.splitlines():
            if line.startswith(name + ("{" if labels else "")) or line.startswith(name + " "):
                if labels and not all(part in line for part in labels.split(",")):
                    continue
                total += float(line.rsplit(" ", 1)[1])
        return total


class InProcessServer(_Server):
    """A real uvicorn server for `config`, on a free loopback port, in a background thread."""

    def __init__(self, config: RuntimeConfig, engine_factory: EngineFactory = create_engine) -> None:
        self.port = free_port()
        update = {"host": "127.0.0.1", "port": self.port, "metrics_port": free_port()}
        self.config = config.model_copy(update=update)
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{self.config.metrics_port}/metrics"
        self.app = create_app(self.config, engine_factory)
        # Both ports, as `python -m servlane_runtime` listens.
        sockets = bind_listeners(self.app, "127.0.0.1", self.port, self.config.metrics_port)
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", **server_options()))
        # Named, so a test can tell work done on the event loop from work in a worker thread.
        self.loop_thread_name = f"uvicorn-{self.port}"
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=sockets)), name=self.loop_thread_name, daemon=True
        )

    def __enter__(self) -> InProcessServer:
        self._thread.start()
        wait_until("uvicorn to start", lambda: self._server.started, 30)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)


class SubprocessServer(_Server):
    """`python -m servlane_runtime --config FILE` as its own process, the way a pod runs it."""

    def __init__(self, config: RuntimeConfig, env: dict[str, str] | None = None, wait_for_health: bool = True) -> None:
        self.wait_for_health = wait_for_health  # False: for runtimes meant to fail (and exit) at once
        self.port = free_port()
        update = {"host": "127.0.0.1", "port": self.port, "metrics_port": free_port()}
        self.config = config.model_copy(update=update)
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{self.config.metrics_port}/metrics"
        self._dir = tempfile.TemporaryDirectory(prefix="servlane-runtime-")
        self.config_path = Path(self._dir.name) / "config.json"
        self.config_path.write_text(self.config.to_env_value())
        self.log_path = Path(self._dir.name) / "server.log"
        # Where a pod's /dev/termination-log would be (never the real one on this machine).
        self.termination_log = Path(self._dir.name) / "termination-log"
        self._env = {**os.environ, TERMINATION_LOG_ENV: str(self.termination_log), **(env or {})}
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> SubprocessServer:
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "servlane_runtime", "--config", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env,
            )
        return self

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def exit_code_within(self, timeout: float) -> int:
        """The process's exit code; it must exit within `timeout` seconds."""
        proc = self._proc
        assert proc is not None
        wait_until("the runtime process to exit", lambda: proc.poll() is not None, timeout)
        return proc.returncode

    def __enter__(self) -> SubprocessServer:
        self.start()
        if not self.wait_for_health:
            return self
        try:
            wait_until("/health", self._alive, 60)
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)  # never leave the process behind
            raise
        return self

    def _alive(self) -> bool:
        assert self._proc is not None
        if self._proc.poll() is not None:
            raise AssertionError(f"runtime exited with {self._proc.returncode}:\n{self.log()}")
        try:
            return self.get("/health").status_code == 200
        except httpx.HTTPError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if exc is not None:
            print(self.log())
        self._dir.cleanup()


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1)


def tiny_config(model_dir: Path, **overrides: object) -> RuntimeConfig:
    fields: dict[str, object] = {
        "model_source": str(model_dir),
        "served_model_name": "tiny-llama",
        "engine": "transformers",
        "max_in_flight": 4,
        "max_queue": 8,
        "queue_timeout_seconds": 10,
    }
    fields.update(overrides)
    return RuntimeConfig.model_validate(fields)
