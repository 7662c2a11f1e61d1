"""Process life: /health at once, /ready only after load + warm-up, and a clear reason when loading fails."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from servlane_api.runtime_config import RuntimeConfig
from servlane_api.runtime_exit import MODEL_LOAD_FAILED
from servlane_runtime.model_source import ModelSourceError, resolve_model_source
from tests.support.servers import SubprocessServer, tiny_config


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
    with pytest.raises(ModelSourceError, match="HF_HUB_OFFLINE"):
        resolve_model_source("hf://example-org/missing", str(tmp_path))


def test_bad_local_path_and_s3_fail_with_reason(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match="does not exist"):
        resolve_model_source(str(tmp_path / "nope"), str(tmp_path))
    with pytest.raises(ModelSourceError, match="s3://"):
        resolve_model_source("s3://bucket/model", str(tmp_path))
