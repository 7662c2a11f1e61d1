"""The runtime's own start, phase by phase (#30 item 3): GET /startup on the metrics port and its gauges,
from which the operator explains a pod's cold start."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from servlane_api.cold_start import RUNTIME_PHASES, STARTUP_PATH, RuntimeStartup
from servlane_api.runtime_config import RuntimeConfig
from servlane_runtime.startup import FirstRequestStamp, StartupClock, process_start_time
from tests.support.servers import InProcessServer, SubprocessServer, tiny_config


def startup_of(server: InProcessServer | SubprocessServer) -> RuntimeStartup:
    answer = httpx.get(server.metrics_url.removesuffix("/metrics") + STARTUP_PATH, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    return RuntimeStartup.model_validate_json(answer.content)


def test_a_runtime_process_reports_each_phase_of_its_start_in_order(tiny_llama_dir: Path) -> None:
    spawned = time.time()
    with SubprocessServer(tiny_config(tiny_llama_dir)) as server:
        server.wait_ready()
        # The model list and the probes are not requests the model served: no first request, no first token.
        assert server.get("/v1/models").status_code == 200
        before_traffic = startup_of(server).phases
        assert list(before_traffic) == list(RUNTIME_PHASES[:-2]), before_traffic
        times = [before_traffic[phase] for phase in RUNTIME_PHASES[:-2]]
        assert times == sorted(times), before_traffic
        # The process's start from the kernel's record: after the parent spawned it, before our imports ended.
        assert spawned - 0.05 <= before_traffic["process_start"] < before_traffic["imports_done"]
        assert before_traffic["ready"] <= time.time()

        chat = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert httpx.post(server.v1 + "/chat/completions", json=chat, timeout=60).status_code == 200
        first = startup_of(server).phases
        assert first["ready"] <= first["first_request"] <= first["first_token"], first
        assert {k: v for k, v in first.items() if k not in ("first_request", "first_token")} == before_traffic

        # Stamped once: a second request leaves the first token where it was.
        assert httpx.post(server.v1 + "/chat/completions", json=chat, timeout=60).status_code == 200
        assert startup_of(server).phases == first

        # The same as gauges beside /metrics, and never on the API port.
        ready_at = server.metric("servlane_runtime_startup_phase_timestamp_seconds", 'phase="ready"')
        assert ready_at == first["ready"]
        since_start = server.metric("servlane_runtime_startup_seconds", 'phase="first_token"')
        assert abs(since_start - (first["first_token"] - first["process_start"])) < 1e-6
        assert server.get(STARTUP_PATH).status_code == 404


def test_the_embedding_models_first_answer_is_its_first_token(minilm_model_dir: Path) -> None:
    config = RuntimeConfig(
        model_source=str(minilm_model_dir), served_model_name="minilm", engine="transformers", task="embed"
    )
    with InProcessServer(config) as server:
        server.wait_ready()
        assert "first_token" not in startup_of(server).phases
        body = {"model": "minilm", "input": "hello"}
        assert httpx.post(server.v1 + "/embeddings", json=body, timeout=60).status_code == 200
        phases = startup_of(server).phases
        assert phases["first_token"] >= phases["ready"]


def test_the_clock_stamps_each_phase_once_and_tells_listeners_of_the_past_too() -> None:
    now = iter([10.0, 11.0, 12.0, 13.0])
    clock = StartupClock(process_start=5.0, clock=lambda: next(now))
    clock.mark("imports_done")
    heard: list[tuple[str, float]] = []
    clock.subscribe(lambda phase, at: heard.append((phase, at)))
    clock.mark("imports_done")  # again: ignored
    clock.mark("ready")
    assert heard == [("process_start", 5.0), ("imports_done", 10.0), ("ready", 11.0)]
    assert clock.snapshot().phases == {"process_start": 5.0, "imports_done": 10.0, "ready": 11.0}


def test_the_first_request_is_the_first_inference_post_after_ready() -> None:
    """Stamped as the request arrives (the gateway's part of a wake from zero ends there), once: not for a
    request turned away while loading, not for GETs, and not for what the metrics port answers."""
    clock = StartupClock(process_start=1.0, clock=lambda: 2.0)
    passed: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        passed.append(scope["path"])

    stamp = FirstRequestStamp(app, clock)

    def arrive(method: str, path: str) -> None:
        asyncio.run(stamp({"type": "http", "method": method, "path": path}, None, None))

    arrive("POST", "/v1/chat/completions")  # still loading: the runtime answers 503, not a served request
    assert not clock.reached("first_request")
    clock.mark("ready")
    arrive("GET", "/v1/models")
    arrive("POST", "/tokenize")
    assert not clock.reached("first_request")
    arrive("POST", "/v1/completions")
    assert clock.snapshot().phases["first_request"] == 2.0
    assert passed == ["/v1/chat/completions", "/v1/models", "/tokenize", "/v1/completions"]  # all passed on


def test_the_process_start_is_the_kernels_record_not_the_time_of_asking() -> None:
    """A process that sleeps before it asks still reports when it was started."""
    code = "import time; time.sleep(1.5); from servlane_runtime.startup import process_start_time as p; print(p())"
    spawned = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    asked = time.time()
    reported = float(out.stdout)
    assert spawned - 0.05 <= reported <= asked - 1.4, (spawned, reported, asked)
    assert process_start_time() <= time.time()


def test_a_startup_reply_that_is_not_times_is_refused() -> None:
    for bad in ('{"phases": {"ready": -1}}', '{"phases": {"ready": "NaN"}}', '{"phases": {"ready": 1e999}}'):
        try:
            RuntimeStartup.model_validate_json(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad}")
    unknown = RuntimeStartup.model_validate_json('{"phases": {"ready": 5}, "secret": "x"}')
    assert unknown.phases == {"ready": 5.0}
    # A phase of a newer runtime is dropped, not the whole start: an operator still tells the rest of it.
    newer = RuntimeStartup.model_validate_json('{"phases": {"ready": 5, "kv_cache_warm": 6}}')
    assert newer.phases == {"ready": 5.0}


def test_the_runtime_process_imports_its_engine_at_once_and_never_scikit_learn() -> None:
    """The entrypoint starts the engine's imports in a thread before the server's own (#30 item 4), so they
    overlap the server's start and the fetching of the files, and keeps scikit-learn out: transformers imports
    it (and SciPy) whenever it is installed, for nothing the runtime runs."""
    code = (
        "import importlib.util, sys\n"
        "from servlane_runtime.__main__ import start_engine_import\n"
        "thread = start_engine_import('transformers')\n"
        "started_first = 'fastapi' not in sys.modules and 'uvicorn' not in sys.modules\n"
        "thread.join(timeout=240)\n"
        "print(started_first, 'servlane_runtime.engines.transformers_engine' in sys.modules, 'torch' in sys.modules,\n"
        "      sorted(m for m in sys.modules if m.startswith(('sklearn.', 'scipy.stats'))),\n"
        "      importlib.util.find_spec('sklearn') is None)\n"
    )
    assert importlib.util.find_spec("sklearn") is not None  # installed here, as in the CPU image
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.split("\n")[0] == "True True True [] True", out.stdout + out.stderr
