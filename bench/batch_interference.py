"""Does a running batch slow interactive requests? Interactive p50/p99 latency through the gateway, with and
without a large batch (the OpenAI Batch API) running through the same gateway to the same backend.

The backend is a stub with a fixed service time and a limited number of requests served at once (like a
model server's batch slots); waiters are served by `X-Priority` (high, normal, then low), as the runtime's
admission queue does, so what is measured is the gateway's part: batch requests go at low priority, at
most `--batch-concurrency` per feature per replica. The gateway runs as `python -m servlane_gateway` with
the Batch API on SQLite (or `--database-url`). Interactive load: `--clients` closed-loop clients sending
chat completions for `--seconds` per phase. Rounds run both phases in balanced order (ABBA...), so slow
drift of the machine's load falls on both alike; each batch phase starts a fresh batch of `--batch-size`
requests, waits until it is being worked on, measures, then cancels it and waits until it is cancelled.
Writes bench/results/batch_interference.json.
Run: `.venv/bin/python bench/batch_interference.py [--rounds 5 --seconds 10 --batch-size 20000]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import importlib.metadata
import io
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `bench` is its folder
from bench.gateway_bench import ANSWER_BYTES, routes, stop_processes, wait_ready
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
NULL = subprocess.DEVNULL
KEY = "sk-bench-batch-interference-0000"
RANKS = {"high": 0, "normal": 1, "low": 2}
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


class PrioritySlots:
    """`slots` requests served at once; waiters by priority, then arrival (the runtime's admission order)."""

    def __init__(self, slots: int) -> None:
        self.free = slots
        self.waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self.order = itertools.count()

    async def acquire(self, rank: int) -> None:
        if self.free > 0 and not self.waiters:
            self.free -= 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self.waiters, (rank, next(self.order), future))
        await future

    def release(self) -> None:
        while self.waiters:
            _, _, future = heapq.heappop(self.waiters)
            if not future.done():
                future.set_result(None)  # the slot passes straight to the next waiter
                return
        self.free += 1


def stub_app(service_seconds: float, slots: int) -> Any:
    gate = PrioritySlots(slots)
    body = ANSWER_BYTES

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        headers = dict(scope["headers"])
        rank = RANKS.get(headers.get(b"x-priority", b"normal").decode(), 1)
        if scope["path"] != "/health":
            await gate.acquire(rank)
            try:
                await asyncio.sleep(service_seconds)
            finally:
                gate.release()
        start = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
        await send(start)
        await send({"type": "http.response.body", "body": body})

    return app


async def interactive(url: str, clients: int, seconds: float) -> tuple[list[float], dict[int, int]]:
    """Latencies (ms) of closed-loop clients' 200s over `seconds`, and the count of every other status."""
    latencies: list[float] = []
    failures: dict[int, int] = {}
    deadline = time.monotonic() + seconds
    headers = {"authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=url, timeout=60, headers=headers) as client:

        async def one_client() -> None:
            while time.monotonic() < deadline:
                started = time.perf_counter()
                response = await client.post("/v1/chat/completions", json=CHAT)
                if response.status_code == 200:
                    latencies.append((time.perf_counter() - started) * 1000)
                else:
                    failures[response.status_code] = failures.get(response.status_code, 0) + 1

        await asyncio.gather(*(one_client() for _ in range(clients)))
    return latencies, failures


def batch_input(size: int) -> bytes:
    line = {"method": "POST", "url": "/v1/chat/completions", "body": CHAT}
    return b"\n".join(json.dumps(line | {"custom_id": f"r{i}"}).encode() for i in range(size))


def completed(client: openai.OpenAI, batch_id: str) -> tuple[str, int]:
    batch = client.batches.retrieve(batch_id)
    return batch.status, batch.request_counts.completed if batch.request_counts else 0


def until(what: str, check: Any, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def summary(values: list[float]) -> dict[str, float]:
    return {
        "requests": len(values),
        "p50_ms": round(statistics.median(values), 2) if values else float("nan"),
        "p99_ms": round(percentile(values, 0.99), 2),
    }


def phase(
    url: str, client: openai.OpenAI, with_batch: bool, args: argparse.Namespace, upload_id: str
) -> dict[str, Any]:
    batch_id = None
    done_before = 0
    if with_batch:
        batch_id = client.batches.create(
            input_file_id=upload_id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id
        done_before = until("the batch to be worked on", lambda: (n := completed(client, batch_id)[1]) > 0 and n)
    load_before = os.getloadavg()
    started = time.monotonic()
    latencies, failures = asyncio.run(interactive(url, args.clients, args.seconds))
    elapsed = time.monotonic() - started
    record: dict[str, Any] = {"batch": with_batch, **summary(latencies), "loadavg": [round(x, 2) for x in load_before]}
    record["non_200"] = {str(code): n for code, n in sorted(failures.items())}  # both sides must have none
    if batch_id is not None:
        status, done_after = completed(client, batch_id)
        record["batch_requests_per_second"] = round((done_after - done_before) / elapsed, 1)
        record["batch_status_at_end"] = status
        if status == "in_progress":
            client.batches.cancel(batch_id)
        until("the batch to stop", lambda: completed(client, batch_id)[0] in ("cancelled", "completed"))
    return record


def versions() -> dict[str, str]:
    found = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("servlane", "openai", "sqlalchemy", "fastapi", "uvicorn", "httpx"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[dist] = importlib.metadata.version(dist)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve-stub", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=10.0, help="interactive load per phase")
    parser.add_argument("--clients", type=int, default=4, help="closed-loop interactive clients")
    parser.add_argument("--service-ms", type=float, default=20.0, help="the stub's fixed service time")
    parser.add_argument("--slots", type=int, default=8, help="requests the stub serves at once")
    parser.add_argument("--batch-size", type=int, default=20000)
    parser.add_argument("--batch-concurrency", type=int, default=4, help="the gateway's per-feature batch cap")
    parser.add_argument("--database-url", help="default: SQLite in a temp dir")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "batch_interference.json")
    args = parser.parse_args()
    if args.serve_stub:
        import uvicorn

        app = stub_app(args.service_ms / 1000, args.slots)
        uvicorn.run(app, host="127.0.0.1", port=args.serve_stub, log_level="warning", access_log=False)
        return
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        stub_port, gateway_port = free_port(), free_port()
        stub = [sys.executable, __file__, "--serve-stub", str(stub_port), "--service-ms", str(args.service_ms)]
        stub += ["--slots", str(args.slots)]
        (tmp / "routes.json").write_text(json.dumps(routes(f"http://127.0.0.1:{stub_port}")))
        (tmp / "keys").write_text(f"bench: {KEY}\n")
        database = args.database_url or f"sqlite:///{tmp / 'batch.db'}"
        gateway = [sys.executable, "-m", "servlane_gateway", "--routes-file", str(tmp / "routes.json")]
        gateway += ["--keys-file", str(tmp / "keys"), "--host", "127.0.0.1", "--port", str(gateway_port)]
        gateway += ["--log-level", "warning", "--batch-concurrency-per-feature", str(args.batch_concurrency)]
        gateway += ["--batch-poll-seconds", "0.2"]
        env = os.environ | {"SERVLANE_GATEWAY_BATCH_DATABASE_URL": database}
        processes = [
            subprocess.Popen(stub, stdout=NULL, stderr=NULL),
            subprocess.Popen(gateway, env=env, stdout=NULL, stderr=NULL),
        ]
        url = f"http://127.0.0.1:{gateway_port}"
        try:
            wait_ready(f"http://127.0.0.1:{stub_port}/health")
            wait_ready(f"{url}/ready")
            client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=2, timeout=60)
            upload = client.files.create(file=("in.jsonl", io.BytesIO(batch_input(args.batch_size))), purpose="batch")
            asyncio.run(interactive(url, args.clients, 1.0))  # warm-up
            rounds = []
            for index in range(args.rounds):
                order = [False, True] if index % 2 == 0 else [True, False]
                records = [phase(url, client, with_batch, args, upload.id) for with_batch in order]
                rounds.append(records)
                print(f"round {index}: " + "; ".join(json.dumps(r) for r in records), flush=True)
        finally:
            stop_processes(processes)
    pooled = {}
    for with_batch, name in ((False, "without_batch"), (True, "with_batch")):
        rows = [r for records in rounds for r in records if r["batch"] is with_batch]
        pooled[name] = {
            "p50_ms_median_of_rounds": round(statistics.median(r["p50_ms"] for r in rows), 2),
            "p99_ms_median_of_rounds": round(statistics.median(r["p99_ms"] for r in rows), 2),
            "requests": sum(r["requests"] for r in rows),
        }
    ratios = [
        next(r for r in records if r["batch"])["p50_ms"] / next(r for r in records if not r["batch"])["p50_ms"]
        for records in rounds
    ]
    result = {
        "what": "interactive chat latency through the gateway, with and without a batch running (Batch API)",
        "settings": {k: v for k, v in vars(args).items() if k not in ("serve_stub", "out", "database_url")}
        | {"database": "sqlite" if args.database_url is None else "given"},
        "machine": {"cpus": os.cpu_count(), "loadavg_at_end": [round(x, 2) for x in os.getloadavg()]},
        "versions": versions(),
        "rounds": rounds,
        "summary": pooled | {"p50_ratio_with_to_without_per_round": [round(r, 3) for r in ratios]},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
