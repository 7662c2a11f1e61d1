"""Throughput and latency of our runtime (transformers and vllm engines) vs vLLM's own OpenAI server.

All three serve the same tiny Llama (tests/fixtures) on loopback; each gets the same bounded load:
REQUESTS streaming chat completions of MAX_TOKENS tokens (ignore_eos), CONCURRENCY at a time.
Writes bench/results/runtime.json. Run: .venv/bin/python bench/runtime_bench.py
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fixtures.models import build_tiny_llama  # noqa: E402
from tests.runtime.servers import free_port, poll  # noqa: E402

from modelplane_api.runtime_config import RuntimeConfig  # noqa: E402

REQUESTS = 32
CONCURRENCY = 4
MAX_TOKENS = 32
MODEL = "tiny-llama"
ENV = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}


def our_command(model_dir: Path, engine: Literal["vllm", "transformers"], port: int, workdir: Path) -> list[str]:
    extra: dict[str, Any] = (
        {"dtype": "bfloat16", "max_model_len": 256, "extra_args": ["--enforce-eager"]} if engine == "vllm" else {}
    )
    config = RuntimeConfig(
        model_source=str(model_dir),
        served_model_name=MODEL,
        engine=engine,
        host="127.0.0.1",
        port=port,
        max_in_flight=CONCURRENCY,
        **extra,
    )
    path = workdir / f"{engine}.json"
    path.write_text(config.to_env_value())
    return [sys.executable, "-m", "modelplane_runtime", "--config", str(path), "--log-level", "warning"]


def vllm_command(model_dir: Path, port: int) -> list[str]:
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "256", "--enforce-eager", "--dtype", "bfloat16",
    ]  # fmt: skip


async def one_request(client: httpx.AsyncClient, url: str) -> tuple[float, float, int]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about Kubernetes."}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft = 0.0
    tokens = 0
    async with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if not ttft and any(c["delta"].get("content") for c in chunk.get("choices", [])):
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return time.perf_counter() - start, ttft, tokens


async def load(base: str) -> dict[str, Any]:
    url = base + "/v1/chat/completions"
    sem = asyncio.Semaphore(CONCURRENCY)
    async with httpx.AsyncClient(timeout=120) as client:
        await one_request(client, url)  # warm the path once

        async def bounded() -> tuple[float, float, int]:
            async with sem:
                return await one_request(client, url)

        start = time.perf_counter()
        results = await asyncio.gather(*(bounded() for _ in range(REQUESTS)))
        wall = time.perf_counter() - start
    latencies = sorted(r[0] for r in results)
    ttfts = sorted(r[1] for r in results)
    tokens = sum(r[2] for r in results)
    return {
        "requests": REQUESTS,
        "completion_tokens": tokens,
        "wall_seconds": round(wall, 3),
        "tokens_per_second": round(tokens / wall, 1),
        "requests_per_second": round(REQUESTS / wall, 2),
        "latency_p50_s": round(statistics.median(latencies), 4),
        "latency_p95_s": round(latencies[int(0.95 * (len(latencies) - 1))], 4),
        "ttft_p50_s": round(statistics.median(ttfts), 4),
    }


def run_target(name: str, command: list[str], port: int, ready_path: str, workdir: Path) -> dict[str, Any]:
    log = (workdir / f"{name}.log").open("wb")
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=ENV)
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited: {(workdir / f'{name}.log').read_text()[-3000:]}")
        try:
            return httpx.get(base + ready_path, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        poll(ready, 600, f"{name} to be ready", interval=0.5)
        ready_seconds = time.perf_counter() - started
        result = asyncio.run(load(base))
        result["ready_seconds"] = round(ready_seconds, 1)
        return result
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def main() -> None:
    model_dir = build_tiny_llama()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        targets: list[tuple[str, Callable[[int], list[str]], str]] = [
            ("modelplane-transformers", lambda p: our_command(model_dir, "transformers", p, workdir), "/ready"),
            ("modelplane-vllm", lambda p: our_command(model_dir, "vllm", p, workdir), "/ready"),
            ("vllm-openai-server", lambda p: vllm_command(model_dir, p), "/v1/models"),
        ]
        for name, command, ready_path in targets:
            port = free_port()
            print(f"bench: {name}", flush=True)
            try:
                results[name] = run_target(name, command(port), port, ready_path, workdir)
            except Exception as exc:  # one broken target must not hide the others' numbers
                results[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            print(f"bench: {name}: {results[name]}", flush=True)
    report = {
        "benchmark": "runtime",
        "model": "tiny-llama (hidden 128, 2 layers, random weights)",
        "load": {"requests": REQUESTS, "concurrency": CONCURRENCY, "max_tokens": MAX_TOKENS, "stream": True},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": results,
    }
    out = REPO / "bench" / "results" / "runtime.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"bench: wrote {out}")


if __name__ == "__main__":
    main()
