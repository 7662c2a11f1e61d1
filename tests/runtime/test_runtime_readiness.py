"""Process life: /health at once, /ready only after load + warm-up, and a clear reason when loading fails."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from servlane_api.cold_start import STARTUP_PATH
from servlane_api.runtime_config import READY_MAX_WAIT_SECONDS, RuntimeConfig
from servlane_api.runtime_exit import MODEL_LOAD_FAILED
from servlane_runtime.app import ready_wait
from servlane_runtime.engines import create_engine
from servlane_runtime.engines.base import InferenceEngine
from servlane_runtime.model_source import ModelSourceError, resolve_model_source
from tests.support.servers import InProcessServer, SubprocessServer, tiny_config


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A loopback TCP port that accepts connections and never answers: a Hub that hangs."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_entrypoint_serves_after_load_and_warm_up(tiny_llama_dir: Path) -> None:
    with SubprocessServer(tiny_config(tiny_llama_dir)) as server:
        assert server.get("/health").status_code == 200
        server.wait_ready()
        ready = server.get("/ready")
        assert ready.status_code == 200
        assert ready.json()["status"] == "ready"
        body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert httpx.post(server.v1 + "/chat/completions", json=body, timeout=30).status_code == 200
        assert server.metric("servlane_runtime_requests_total", 'endpoint="/v1/chat/completions",code="200"') == 1


def test_not_ready_while_loading_then_exits_when_the_load_times_out(black_hole: str, tmp_path: Path) -> None:
    config = RuntimeConfig(
        model_source="hf://example-org/never-arrives@main",
        served_model_name="slow",
        engine="transformers",
        cache_dir=str(tmp_path),
        load_timeout_seconds=3,
    )
    env = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": black_hole, "HF_HUB_DISABLE_XET": "1"}
    with SubprocessServer(config, env) as server:
        assert server.get("/health").status_code == 200
        loading = server.get("/ready")
        assert loading.status_code == 503
        assert loading.json()["status"] == "loading"
        early = httpx.post(server.v1 + "/completions", json={"model": "slow", "prompt": "hi"}, timeout=30)
        assert early.status_code == 503
        assert "Retry-After" in early.headers
        assert early.json()["error"]["code"] == "service_overloaded"
        # A load that cannot finish ends the process (the kubelet restarts it) rather than leaving it unready.
        assert server.exit_code_within(30) == MODEL_LOAD_FAILED
        assert "load_timeout_seconds=3" in server.log()
        assert "load_timeout_seconds=3" in server.termination_log.read_text()


def test_offline_hub_source_resolves_from_the_cache(tiny_llama_dir: Path, tmp_path: Path) -> None:
    # The Hub cache layout that snapshot_download reads when offline.
    repo = tmp_path / "models--example-org--tiny"
    commit = "0" * 40
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in tiny_llama_dir.iterdir():
        (snapshot / f.name).symlink_to(f)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    resolved = Path(resolve_model_source("hf://example-org/tiny@main", str(tmp_path)))
    assert resolved == snapshot
    assert (resolved / "config.json").is_file()
    # One file asked for (a GGUF repository's quantization): the same snapshot, fetched narrowly when online.
    assert Path(resolve_model_source("hf://example-org/tiny@main", str(tmp_path), only_file="config.json")) == snapshot
    with pytest.raises(ModelSourceError, match="HF_HUB_OFFLINE"):
        resolve_model_source("hf://example-org/missing", str(tmp_path))


def test_bad_local_path_and_s3_fail_with_reason(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match="does not exist"):
        resolve_model_source(str(tmp_path / "nope"), str(tmp_path))
    with pytest.raises(ModelSourceError, match="s3://"):
        resolve_model_source("s3://bucket/model", str(tmp_path))


def test_ready_with_wait_answers_when_the_model_is_ready_and_a_probe_at_once(tiny_llama_dir: Path) -> None:
    """GET /ready?wait=S (what the gateway asks of a pod it holds requests for) answers the moment the model
    is ready, not S seconds later; the kubelet's plain probe, and any wait that is not a number, at once."""
    gate = threading.Event()

    def gated(config: RuntimeConfig, path: str) -> InferenceEngine:
        assert gate.wait(120)
        return create_engine(config, path)

    with InProcessServer(tiny_config(tiny_llama_dir), engine_factory=gated) as server:
        for probe in ("/ready", "/ready?wait=abc", "/ready?wait=-1", "/ready?wait=nan", "/ready?wait=0"):
            loading = server.get(probe)
            assert (loading.status_code, loading.json()["status"]) == (503, "loading"), probe
        started = time.monotonic()
        assert server.get("/ready?wait=0.3").status_code == 503  # the load is held: the wait runs out
        assert time.monotonic() - started >= 0.3
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(httpx.get, server.base_url + "/ready?wait=30", timeout=60)
            gate.set()
            answer = waiting.result(60)
        answered = time.time()
        assert (answer.status_code, answer.json()["status"]) == (200, "ready")
        assert answer.elapsed.total_seconds() < 30  # answered by the ready, not by the end of its wait
        ready_at = httpx.get(server.metrics_url.removesuffix("/metrics") + STARTUP_PATH).json()["phases"]["ready"]
        assert ready_at <= answered


def test_a_ready_wait_is_a_number_of_seconds_up_to_the_cap() -> None:
    assert ready_wait(None) == 0.0
    assert ready_wait("2.5") == 2.5
    assert ready_wait("1e9") == ready_wait("inf") == READY_MAX_WAIT_SECONDS
    assert ready_wait("nan") == ready_wait("-3") == ready_wait("") == ready_wait("soon") == 0.0
