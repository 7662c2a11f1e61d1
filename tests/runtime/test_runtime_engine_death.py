"""A vLLM runtime whose engine core process dies: 503s with Retry-After (never a hang), then a non-zero exit.

As `vllm serve` does, so that the kubelet restarts the pod and a canary's analysis sees the errors.
Its own server, since it is killed (vLLM takes 20-40 s to start here).
"""

from __future__ import annotations

import json
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from servlane_api.runtime_exit import ENGINE_DIED
from tests.support.polling import wait_until
from tests.support.sse import sse_lines
from tests.support.stopped import freeze
from tests.support.vllm import MODEL, vllm_config, vllm_runtime

pytestmark = pytest.mark.slow

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 32, "ignore_eos": True}


def engine_core_pid(runtime_pid: int) -> int | None:
    """The runtime's child process that vLLM titles `VLLM::EngineCore` (its setproctitle)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            title = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # a process that ended meanwhile
        if parent == runtime_pid and b"EngineCore" in title:
            return int(stat.parent.name)
    return None


def stream_events(url: str, body: dict[str, object]) -> list[dict[str, object]]:
    events = []
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as response:
        assert response.status_code == 200
        for line in sse_lines(response):
            if line.startswith("data: {"):
                events.append(json.loads(line.removeprefix("data: ")))
    return events


def test_a_dead_engine_core_fails_requests_with_503_and_ends_the_process(tiny_llama_dir: Path) -> None:
    with vllm_runtime(vllm_config(tiny_llama_dir), start_seconds=300) as server, ThreadPoolExecutor(2) as pool:
        core = wait_until("vLLM's engine core process", lambda: engine_core_pid(server.pid), 30)
        # Frozen first, so that two requests are surely in flight (waiting on the engine) when it dies.
        freeze(core)
        plain = pool.submit(httpx.post, server.v1 + "/chat/completions", json=CHAT, timeout=60)
        streamed = pool.submit(stream_events, server.v1 + "/chat/completions", CHAT)
        wait_until("two requests in flight", lambda: server.metric("servlane_runtime_in_flight") == 2, 30)
        os.kill(core, signal.SIGKILL)

        def health_says_failed() -> httpx.Response | None:
            response = server.get("/health")
            return response if response.status_code == 503 else None

        health = wait_until("/health to fail", health_says_failed, 15, interval=0.02)
        assert health.json()["status"] == "failed"
        assert "engine" in health.json()["reason"]
        after = httpx.post(server.v1 + "/chat/completions", json=CHAT, timeout=10)
        in_flight = plain.result(timeout=30)
        events = streamed.result(timeout=30)
        code = server.exit_code_within(30)
        log, termination = server.log(), server.termination_log.read_text()

    for response in (after, in_flight):
        assert response.status_code == 503, response.text
        assert int(response.headers["Retry-After"]) >= 1
        assert response.json()["error"]["code"] == "service_overloaded"
        assert "engine" in response.json()["error"]["message"]
    errors = [e["error"] for e in events if "error" in e]
    assert len(errors) == 1, events
    assert isinstance(errors[0], dict)
    assert errors[0]["code"] == "service_overloaded"
    assert code == ENGINE_DIED, log
    assert termination.startswith("the engine died: vLLM's engine core process is gone")
