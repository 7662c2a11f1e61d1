"""A property-based fuzz of the servers' own OpenAPI schemas (schemathesis on hypothesis), against real processes.

`servers()` starts a runtime (`python -m servlane_runtime`, transformers engine, the tiny Llama with a short
context so any generation is quick) and a gateway (`python -m servlane_gateway`) in front of it. `fuzz()`
draws cases from a server's /openapi.json for every operation, valid (positive) and invalid (negative),
and sends them; half of the bodies get the real model name so the engine runs, not just the 404 path.
A watcher polls both /health endpoints throughout. Used by tests/fuzz (bounded, CI) and bench/fuzz_servers.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import Case, GenerationMode
from schemathesis.core.result import Err

from servlane_api.runtime_config import RuntimeConfig
from tests.fixtures.models import build_tiny_llama
from tests.gateway.gateway_harness import aifeature, aimodel
from tests.polling import wait_until
from tests.runtime.servers import SubprocessServer, free_port

RUNTIME_MODEL = "tiny-llama"
GATEWAY_FEATURE = "chat"
MAX_MODEL_LEN = 128  # bounds every generation, whatever max_tokens the fuzz draws
HEALTH_BOUND_SECONDS = 2.0


@dataclass
class Server:
    name: str
    base_url: str
    model: str  # the name that reaches the engine


@dataclass
class FuzzResult:
    cases: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)  # "METHOD path status body" of each 5xx
    unsatisfiable: list[str] = field(default_factory=list)  # operation and mode with no case to draw
    generated: int = 0  # POSTs answered 200: the engine ran

    def as_json(self) -> dict[str, Any]:
        return {
            "cases": self.cases,
            "status_counts": {str(k): v for k, v in sorted(self.statuses.items())},
            "posts_served": self.generated,
            "4xx": sum(v for k, v in self.statuses.items() if 400 <= k < 500),
            "5xx": sum(v for k, v in self.statuses.items() if k >= 500),
            "server_errors": self.server_errors[:20],
            "no_cases_for": self.unsatisfiable,
        }


def runtime_config(model_dir: Path) -> RuntimeConfig:
    return RuntimeConfig(
        model_source=str(model_dir),
        served_model_name=RUNTIME_MODEL,
        engine="transformers",
        max_model_len=MAX_MODEL_LEN,
        max_in_flight=4,
        max_queue=16,
        queue_timeout_seconds=60,
    )


class GatewayProcess:
    """`python -m servlane_gateway --routes-file FILE` routing feature `chat` to one runtime."""

    def __init__(self, runtime_url: str) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._dir = tempfile.TemporaryDirectory(prefix="servlane-fuzz-gateway-")
        routes = Path(self._dir.name) / "routes.json"
        objects = [aimodel("tiny", runtime_url, served=RUNTIME_MODEL), aifeature(GATEWAY_FEATURE, [("tiny", 100)])]
        routes.write_text(json.dumps(objects))
        self._log = Path(self._dir.name) / "gateway.log"
        self._command = [sys.executable, "-m", "servlane_gateway", "--routes-file", str(routes)]
        self._command += ["--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"]
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> GatewayProcess:
        with self._log.open("wb") as log:
            self._proc = subprocess.Popen(self._command, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until("the gateway's routes", self._ready, 30)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _ready(self) -> bool:
        assert self._proc is not None
        if self._proc.poll() is not None:
            raise AssertionError(f"the gateway exited:\n{self.log()}")
        try:
            return httpx.get(self.base_url + "/ready", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def log(self) -> str:
        return self._log.read_text(errors="replace")

    def __exit__(self, *_: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(30)
        self._dir.cleanup()


@contextmanager
def servers() -> Iterator[tuple[Server, Server]]:
    """The runtime and the gateway in front of it, both ready."""
    with SubprocessServer(runtime_config(build_tiny_llama()), env={"HF_HUB_OFFLINE": "1"}) as runtime:
        runtime.wait_ready()
        with GatewayProcess(runtime.base_url) as gateway:
            yield (
                Server("runtime", runtime.base_url, RUNTIME_MODEL),
                Server("gateway", gateway.base_url, GATEWAY_FEATURE),
            )


class HealthWatch:
    """Polls each server's /health from a thread; remembers the slowest answer and anything not a 200."""

    def __init__(self, servers: tuple[Server, ...], interval: float = 0.2) -> None:
        self._urls = [s.base_url + "/health" for s in servers]
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.polls = 0
        self.slowest = 0.0
        self.failures: list[str] = []

    def _run(self) -> None:
        with httpx.Client(timeout=HEALTH_BOUND_SECONDS * 5) as client:
            while not self._stop.wait(self._interval):
                for url in self._urls:
                    started = time.monotonic()
                    try:
                        status = client.get(url).status_code
                    except httpx.HTTPError as exc:
                        self.failures.append(f"{url}: {exc!r}")
                        continue
                    self.slowest = max(self.slowest, time.monotonic() - started)
                    self.polls += 1
                    if status != 200:
                        self.failures.append(f"{url}: {status}")

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def as_json(self) -> dict[str, Any]:
        return {"polls": self.polls, "slowest_seconds": round(self.slowest, 3), "failures": self.failures[:20]}


def _describe(case: Case[Any], status: int, body: bytes) -> str:
    sent = json.dumps(case.body, default=repr)[:300] if case.body is not None else ""
    return f"{case.method} {case.path} -> {status}: {body[:300]!r} (sent {sent})"


def fuzz(server: Server, max_examples: int, seed: int = 0, timeout: float = 120) -> FuzzResult:
    """`max_examples` cases per operation and generation mode, drawn from the server's OpenAPI schema."""
    schema = schemathesis.openapi.from_url(server.base_url + "/openapi.json")
    result = FuzzResult()
    session = requests.Session()
    for found in schema.get_all_operations():
        if isinstance(found, Err):
            raise AssertionError(f"the server's OpenAPI schema is invalid: {found.err()}")
        operation = found.ok()
        for mode in GenerationMode:
            cases = st.tuples(operation.as_strategy(generation_mode=mode), st.booleans())

            @settings(
                max_examples=max_examples,
                database=None,
                deadline=None,
                derandomize=False,
                phases=[Phase.generate],  # every case counted once: no shrinking replays
                suppress_health_check=list(HealthCheck),
            )
            @given(drawn=cases)
            def send(drawn: tuple[Case[Any], bool]) -> None:
                case, real_model = drawn
                if real_model and isinstance(case.body, dict):
                    case.body["model"] = server.model
                response = case.call(base_url=server.base_url, session=session, timeout=timeout)
                result.cases += 1
                result.statuses[response.status_code] += 1
                if case.method.upper() == "POST" and response.status_code == 200:
                    result.generated += 1
                if response.status_code >= 500:
                    result.server_errors.append(_describe(case, response.status_code, response.content))

            try:
                _seeded(send, seed)()
            except Unsatisfiable:  # e.g. no invalid request exists for a GET without parameters
                result.unsatisfiable.append(f"{operation.method.upper()} {operation.path} {mode.value}")
    return result


def _seeded(test: Any, seed: int) -> Any:
    from hypothesis import seed as hypothesis_seed

    return hypothesis_seed(seed)(test)
