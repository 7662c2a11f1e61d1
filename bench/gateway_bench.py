"""The gateway's added latency and throughput, against calling the same upstream directly, in one run.

Starts the test upstream (tests/gateway/gateway_upstream.py) and the gateway (`python -m modelplane_gateway`)
as separate processes on loopback, then measures, interleaving direct and gateway calls so both see the
same machine load:
  - sequential latency of non-streamed chat completions (p50/p99), and time to the first streamed chunk;
  - throughput with concurrent clients (requests per second);
  - the gateway's self-reported added latency (its modelplane_gateway_added_latency_seconds histogram).
Writes bench/results/gateway.json. Run: `.venv/bin/python bench/gateway_bench.py [--requests 400]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from modelplane_api import metrics as contract

ROOT = Path(__file__).resolve().parent.parent
BODY = {"model": "chat", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


def routes(upstream_url: str) -> list[dict[str, Any]]:
    model = {
        "kind": "AIModel",
        "metadata": {"name": "chat-v1", "namespace": "default"},
        "spec": {"source": {"uri": "/models/x"}, "engine": "transformers"},
        "status": {"endpoint": upstream_url, "conditions": [{"type": "Ready", "status": "True", "reason": "Up"}]},
    }
    feature = {"kind": "AIFeature", "metadata": {"name": "chat", "namespace": "default"}, "spec": {"model": "chat-v1"}}
    return [model, feature]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summary_ms(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99), "mean_ms": statistics.fmean(ms)}


def sequential(urls: dict[str, str], n: int, stream: bool) -> dict[str, list[float]]:
    """Interleaved calls; for streams the time to the first chunk."""
    times: dict[str, list[float]] = {name: [] for name in urls}
    body = BODY | ({"stream": True, "messages": [{"role": "user", "content": "chunks=8"}]} if stream else {})
    with httpx.Client(timeout=30) as client:
        for i in range(n + 20):
            for name, url in urls.items():
                start = time.perf_counter()
                if stream:
                    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
                        chunks = response.iter_raw()
                        next(chunks)
                        elapsed = time.perf_counter() - start
                        for _ in chunks:  # drain the rest so the connection is reused
                            pass
                else:
                    client.post(f"{url}/v1/chat/completions", json=body).raise_for_status()
                    elapsed = time.perf_counter() - start
                if i >= 20:  # warm-up excluded
                    times[name].append(elapsed)
    return times


async def throughput(url: str, total: int, concurrency: int) -> float:
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=concurrency)) as client:
        remaining = iter(range(total))

        async def worker() -> None:
            for _ in remaining:
                (await client.post(f"{url}/v1/chat/completions", json=BODY)).raise_for_status()

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return total / (time.perf_counter() - start)


def gateway_added_latency(gateway_url: str) -> dict[str, float]:
    text = httpx.get(f"{gateway_url}/metrics").text
    for family in text_string_to_metric_families(text):
        if family.name == contract.ADDED_LATENCY:
            samples = {s.name: s.value for s in family.samples if not s.name.endswith("_bucket")}
            count = samples[f"{contract.ADDED_LATENCY}_count"]
            return {"count": count, "mean_ms": 1000 * samples[f"{contract.ADDED_LATENCY}_sum"] / max(count, 1)}
    return {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gateway.json")
    args = parser.parse_args()
    up_port, gw_port = free_port(), free_port()
    up_url, gw_url = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{gw_port}"
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "runtime")])}
    with tempfile.TemporaryDirectory() as tmp:
        routes_file = Path(tmp) / "routes.json"
        routes_file.write_text(json.dumps(routes(up_url)))
        upstream_script = str(ROOT / "tests" / "gateway" / "gateway_upstream.py")
        processes = [
            subprocess.Popen([sys.executable, upstream_script, "--port", str(up_port), "--name", "v1"], env=env),
            subprocess.Popen(
                [sys.executable, "-m", "modelplane_gateway", "--routes-file", str(routes_file), "--host", "127.0.0.1",
                 "--port", str(gw_port), "--log-level", "warning"],
                env=env,
            ),
        ]  # fmt: skip
        try:
            wait_ready(up_url)
            wait_ready(f"{gw_url}/ready")
            urls = {"direct": up_url, "gateway": gw_url}
            plain = sequential(urls, args.requests, stream=False)
            first_chunk = sequential(urls, args.requests // 2, stream=True)
            total = args.requests * 2
            rps = {name: asyncio.run(throughput(url, total, args.concurrency)) for name, url in urls.items()}
            self_reported = gateway_added_latency(gw_url)
        finally:
            for process in processes:
                process.terminate()
                process.wait(10)
    latency = {name: summary_ms(values) for name, values in plain.items()}
    ttfc = {name: summary_ms(values) for name, values in first_chunk.items()}
    result = {
        "what": "modelplane gateway vs direct upstream, loopback, non-streamed chat completions",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "requests": args.requests,
        "concurrency": args.concurrency,
        "latency": latency,
        "added_latency_ms": {
            "p50": latency["gateway"]["p50_ms"] - latency["direct"]["p50_ms"],
            "p99": latency["gateway"]["p99_ms"] - latency["direct"]["p99_ms"],
        },
        "stream_first_chunk": ttfc,
        "stream_first_chunk_added_ms": {"p50": ttfc["gateway"]["p50_ms"] - ttfc["direct"]["p50_ms"]},
        "throughput_rps": rps,
        "gateway_self_reported_added_latency": self_reported,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
