"""How many concurrent long token streams a router relays before it adds inter-token latency.

A stub backend (raw asyncio on uvloop, started by this script with `--serve-stub`) answers every streamed
chat completion with `--tokens` (200) SSE events, one every `--spacing-ms` (20) on a fixed schedule from the
request's arrival, each carrying its send time (`t=<CLOCK_MONOTONIC ns>` in its text), then a finish event
and `[DONE]`. Targets in front of it:
  - direct:      the stub itself (the rig's own floor: load generator, stub and loopback)
  - gateway:     `python -m servlane_gateway --routes-file ... --keys-file ...` (its default worker count: one
    process per usable CPU, 2 on the development machine; settings.gateway_workers records it)
  - vllm-router: `vllm-router --worker-urls STUB --policy round_robin` (with `--vllm-router BIN`)
For each N of a rising ladder (`--ladder`), each of `--rounds` rounds runs N concurrent streams through every
target, in a balanced random order per N (the targets run one at a time). The streams come from
`--clients` load-generator processes (bench/loadgen.py, asyncio on uvloop), started at random offsets within
`--ramp-seconds`. Per cell: every gap between two consecutive tokens of a stream minus the spacing
("added inter-token latency": p50, p99), every token's delay from the stub's send stamp to its arrival (p50,
p99), streams completed, errors, short streams, the target's CPU (utime + stime of its process from
/proc/<pid>/stat over the cell's wall time = cores used), the load generators' CPU and os.getloadavg().
A target's saturation point is the largest N of the ladder up to which (that N and every smaller one) the
median over rounds of the added inter-token p99 stays within `--threshold-ms` (5); streams per core = that
N divided by the target's cores used there. Writes bench/results/streams.json.
Run: `.venv/bin/python bench/stream_bench.py --vllm-router /tmp/vllm-router-venv/bin/vllm-router`.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import heapq
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `bench` is its folder
from bench.gateway_bench import (
    API_KEY,
    balanced_orders,
    code_version,
    cpu_seconds,
    gateway_workers,
    package_version,
    routes,
    start_vllm_router,
    stop_processes,
    wait_ready,
)
from bench.machine_load import cpu_times, steal_summary
from bench.machine_load import shares as machine_shares
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
NULL = subprocess.DEVNULL
_EVENT = (
    b'data: {"id":"chatcmpl-stub","object":"chat.completion.chunk","created":0,"model":"stub",'
    b'"choices":[{"index":0,"delta":{"content":"t=%d "},"finish_reason":null}]}\n\n'
)
_END = (
    b'data: {"id":"chatcmpl-stub","object":"chat.completion.chunk","created":0,"model":"stub",'
    b'"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
)
_STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
_OK = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok"


def _chunked(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class StreamStub:
    """Streams on a fixed schedule: one timer for all streams (a heap of due times), not one per stream, so
    the stub spends its CPU on writing tokens and can keep thousands of streams on time."""

    def __init__(self, tokens: int, spacing_ms: float) -> None:
        self.tokens = tokens
        self.spacing_ns = int(spacing_ms * 1e6)
        self.due: list[tuple[int, int, asyncio.Transport, int, int]] = []  # due, seq, transport, start, index
        self.seq = 0
        self.wake = asyncio.Event()

    def start(self, transport: asyncio.Transport) -> None:
        now = time.monotonic_ns()
        transport.write(_STREAM_HEAD + _chunked(_EVENT % now))
        self._push(transport, now, 1)

    def _push(self, transport: asyncio.Transport, start: int, index: int) -> None:
        self.seq += 1
        heapq.heappush(self.due, (start + index * self.spacing_ns, self.seq, transport, start, index))
        self.wake.set()

    async def run(self) -> None:
        while True:
            now = time.monotonic_ns()
            while self.due and self.due[0][0] <= now:
                _, _, transport, start, index = heapq.heappop(self.due)
                if transport.is_closing():
                    continue
                if index < self.tokens:
                    transport.write(_chunked(_EVENT % time.monotonic_ns()))
                    self._push(transport, start, index + 1)
                else:
                    transport.write(_chunked(_END) + b"0\r\n\r\n")
            self.wake.clear()
            # A new stream's next token is due a full spacing after now, never before the heap's earliest.
            timeout = (self.due[0][0] - time.monotonic_ns()) / 1e9 if self.due else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout)


class StubProtocol(asyncio.Protocol):
    def __init__(self, stub: StreamStub) -> None:
        self.stub = stub
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCP transport is not an asyncio.Transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end].lower()
            length = 0
            for line in head.split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            assert self.transport is not None
            if b"/health" in head.split(b"\r\n")[0] or b'"stream"' not in body:
                self.transport.write(_OK)
            else:
                self.stub.start(self.transport)


async def serve_stub(port: int, tokens: int, spacing_ms: float) -> None:
    stub = StreamStub(tokens, spacing_ms)
    server = await asyncio.get_running_loop().create_server(lambda: StubProtocol(stub), "127.0.0.1", port, backlog=4096)
    async with server:
        await stub.run()


def read_samples(path: Path) -> tuple[array.array[float], array.array[float]]:
    with path.open("rb") as source:
        counts = array.array("q")
        counts.fromfile(source, 2)
        gaps, delays = array.array("f"), array.array("f")
        gaps.fromfile(source, counts[0])
        delays.fromfile(source, counts[1])
    return gaps, delays


def percentiles(values: array.array[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return round(float(ordered[min(len(ordered) - 1, int(q * len(ordered)))]), 3)

    return {"p50": pick(0.50), "p99": pick(0.99), "max": round(float(ordered[-1]), 3)}


def run_cell(url: str, streams: int, args: argparse.Namespace, pid: int, tmp: Path) -> dict[str, Any]:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": args.tokens, "stream": True}
    shares = [streams // args.clients + (i < streams % args.clients) for i in range(args.clients)]
    loadgen = str(Path(__file__).with_name("loadgen.py"))
    procs = []
    cpu, wall, machine = cpu_seconds(pid), time.monotonic(), cpu_times()
    for i, share in enumerate(s for s in shares if s):
        command = [sys.executable, loadgen, "streams", "--url", f"{url}/v1/chat/completions", "--body",
                   json.dumps(body), "--api-key", API_KEY, "--streams", str(share), "--spacing-ms",
                   str(args.spacing_ms), "--ramp-seconds", str(args.ramp_seconds),
                   "--samples", str(tmp / f"s{i}")]  # fmt: skip
        procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
    outputs = [json.loads(p.communicate()[0]) for p in procs]
    elapsed = time.monotonic() - wall
    busy = cpu_seconds(pid) - cpu
    gaps, delays = array.array("f"), array.array("f")
    for i in range(len(procs)):
        more_gaps, more_delays = read_samples(tmp / f"s{i}")
        gaps.extend(more_gaps)
        delays.extend(more_delays)
    total = {key: sum(o[key] for o in outputs) for key in ("completed", "errors", "non_200", "tokens", "short")}
    return total | {
        "streams": streams,
        "added_gap_ms": percentiles(gaps),
        "delay_ms": percentiles(delays),
        "wall_s": round(elapsed, 2),
        "target_cpu_s": round(busy, 3),
        "target_cores": round(busy / elapsed, 3),
        "target_cpu_us_per_token": round(1e6 * busy / max(total["tokens"], 1), 1),
        "loadgen_cpu_s": round(sum(o["cpu_s"] for o in outputs), 2),
        "first_token_p50_ms": [o["first_token_p50_ms"] for o in outputs],
        "loadavg": os.getloadavg(),
        "cpu_shares": machine_shares(machine, cpu_times()),  # steal: the time the VM lost to its neighbours
    }


def _stat(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(cells: list[dict[str, Any]]) -> dict[str, Any]:
    gaps = [c["added_gap_ms"]["p99"] for c in cells if c["added_gap_ms"]]
    summary: dict[str, Any] = {
        "rounds": len(cells),
        "completed": sum(c["completed"] for c in cells),
        "errors": sum(c["errors"] + c["non_200"] for c in cells),
        "short": sum(c["short"] for c in cells),
        "target_cores": _stat([c["target_cores"] for c in cells]),
        "target_cpu_us_per_token": _stat([c["target_cpu_us_per_token"] for c in cells]),
    }
    if len(gaps) == len(cells):
        summary["added_gap_p99_ms"] = _stat(gaps)
        summary["added_gap_p50_ms"] = _stat([c["added_gap_ms"]["p50"] for c in cells])
        summary["delay_p99_ms"] = _stat([c["delay_ms"]["p99"] for c in cells])
        summary["delay_p50_ms"] = _stat([c["delay_ms"]["p50"] for c in cells])
    return summary


def saturation(by_n: dict[str, dict[str, Any]], target: str, threshold: float, spacing_ms: float) -> dict[str, Any]:
    """The largest N up to which every rung's median added inter-token p99 stayed within the threshold, and
    no stream failed or came back short; streams per core there (N over the cores the target used), and the
    streams one fully busy core would relay at the CPU per token measured there (a projection, not measured)."""
    best: dict[str, Any] = {"streams": 0}
    for n, row in sorted(by_n.items(), key=lambda item: int(item[0])):
        summary = row.get(target)
        if summary is None:
            break
        ok = (
            "added_gap_p99_ms" in summary
            and summary["added_gap_p99_ms"]["median"] <= threshold
            and not summary["errors"]
            and not summary["short"]
        )
        if not ok:
            best["first_failing_streams"] = int(n)
            break
        cores = summary["target_cores"]["median"]
        per_token_us = summary["target_cpu_us_per_token"]["median"]
        best = {
            "streams": int(n),
            "cores": cores,
            "streams_per_core": round(int(n) / cores) if cores else None,
            "cpu_us_per_token": per_token_us,
            "projected_streams_per_busy_core": round(1e6 / (per_token_us * 1000 / spacing_ms))
            if per_token_us
            else None,
        }
    return best


def past(cells: dict[str, dict[str, list[dict[str, Any]]]], target: str, limit: float) -> bool:
    """Did the target's median added inter-token p99 on the last rung it ran pass `limit` (or a stream fail)?"""
    ran = [row[target] for row in cells.values() if target in row]
    if not ran:
        return False
    last = summarize(ran[-1])
    return "added_gap_p99_ms" not in last or last["added_gap_p99_ms"]["median"] > limit or bool(last["errors"])


def start_targets(tmp: Path, args: argparse.Namespace) -> tuple[dict[str, str], list[subprocess.Popen[bytes]]]:
    env = os.environ | {"PYTHONPATH": os.pathsep.join(str(ROOT / layer) for layer in ("api", "core", "gateway"))}
    stub_port, gw_port = free_port(), free_port()
    urls = {"direct": f"http://127.0.0.1:{stub_port}", "gateway": f"http://127.0.0.1:{gw_port}"}
    (tmp / "routes.json").write_text(json.dumps(routes(urls["direct"])))
    (tmp / "keys").write_text(f"bench: {API_KEY}\n")
    processes = [
        subprocess.Popen([sys.executable, __file__, "--serve-stub", str(stub_port), "--tokens", str(args.tokens),
                          "--spacing-ms", str(args.spacing_ms)], env=env, stdout=NULL, stderr=NULL),
        subprocess.Popen(
            [sys.executable, "-m", "servlane_gateway", "--routes-file", str(tmp / "routes.json"),
             "--keys-file", str(tmp / "keys"), "--host", "127.0.0.1", "--port", str(gw_port), "--log-level", "warning"],
            env=env, stdout=NULL, stderr=NULL,
        ),
    ]  # fmt: skip
    if args.vllm_router:
        port = free_port()
        urls["vllm-router"] = f"http://127.0.0.1:{port}"
        processes.append(start_vllm_router(args.vllm_router, urls["direct"], port, tmp / "vllm-router.log"))
    return urls, processes


def render_table(result: dict[str, Any]) -> str:
    """Markdown: per N and target, added inter-token p99 (median, min-max over rounds) and cores used."""
    targets = list(result["saturation"])
    lines = ["| streams | " + " | ".join(targets) + " |", "|---:|" + "---|" * len(targets)]
    for n, row in result["summary"].items():
        cells = []
        for target in targets:
            s = row.get(target)
            if not s or "added_gap_p99_ms" not in s:
                cells.append("—")
                continue
            p99 = s["added_gap_p99_ms"]
            cores = s["target_cores"]["median"]
            cell = f"{p99['median']:.1f} ({p99['min']:.1f}-{p99['max']:.1f}) ms, {cores:.2f} cores"
            if s["errors"] or s["short"]:
                cell += f", {s['errors']} failed, {s['short']} short"
            cells.append(cell)
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    runs = [run for by_target in result.get("cells", {}).values() for rounds in by_target.values() for run in rounds]
    if (steal := steal_summary(runs)) is not None:
        lines.append("\n" + steal)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve-stub", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--table", type=Path, help="print a result file as a markdown table, and exit")
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--spacing-ms", type=float, default=20)
    parser.add_argument("--ladder", default="50,100,200,400,800")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=2, help="load-generator processes")
    parser.add_argument("--ramp-seconds", type=float, default=1.0)
    parser.add_argument("--threshold-ms", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-above-ms", type=float, default=20.0,
                        help="skip a router on the next rungs once its median added p99 passed this")  # fmt: skip
    parser.add_argument("--vllm-router", help="path of the `vllm-router` CLI (a venv outside the project)")
    parser.add_argument("--targets", default="", help="comma-separated subset of the targets (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "streams.json")
    args = parser.parse_args()
    if args.table:
        print(render_table(json.loads(args.table.read_text())))
        return
    if args.serve_stub:
        import uvloop

        uvloop.run(serve_stub(args.serve_stub, args.tokens, args.spacing_ms))
        return
    ladder = [int(n) for n in args.ladder.split(",")]
    rng = random.Random(args.seed)
    started = time.time()
    code = code_version()
    cells: dict[str, dict[str, list[dict[str, Any]]]] = {}
    skipped: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        urls, processes = start_targets(tmp, args)
        pids = {name: process.pid for name, process in zip(urls, processes, strict=True)}
        if args.targets:
            urls = {name: url for name, url in urls.items() if name in args.targets.split(",")}
        try:
            wait_ready(f"{urls['direct']}/health")
            if "gateway" in urls:
                wait_ready(f"{urls['gateway']}/ready")
            if "vllm-router" in urls:
                wait_ready(f"{urls['vllm-router']}/health")
            for name, url in urls.items():  # warm-up: connections, imports, first-call paths
                run_cell(url, 10, args, pids[name], tmp)
            for n in ladder:
                # A router already far past the threshold on the rung below is not run further up (it would
                # only take long); the rig's floor (direct) always runs.
                active = [name for name in urls if name == "direct" or not past(cells, name, args.skip_above_ms)]
                skipped[str(n)] = [name for name in urls if name not in active]
                for number, order in enumerate(balanced_orders(active, args.rounds, rng)):
                    for name in order:
                        cell = run_cell(urls[name], n, args, pids[name], tmp)
                        cell |= {"round": number, "position": order.index(name)}
                        cells.setdefault(str(n), {}).setdefault(name, []).append(cell)
                        print(n, number, name, cell["added_gap_ms"], cell["delay_ms"], cell["completed"],
                              cell["errors"], cell["target_cores"], cell["loadavg"], flush=True)  # fmt: skip
        finally:
            stop_processes(processes)
    summary = {n: {name: summarize(rounds) for name, rounds in row.items()} for n, row in cells.items()}
    result = {
        "what": "concurrent long SSE streams through each router to a stub on a fixed token schedule, loopback; "
        "added_gap = gap between consecutive tokens of a stream minus the spacing; delay = stub send stamp "
        "to arrival at the client; per N and target: median, min, max over rounds of each cell's p50/p99",
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_at_end": os.getloadavg(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "shared": "yes: other engineers' jobs ran on the same 2 cores; os.getloadavg() per cell in cells",
        },
        "settings": {
            "gateway_workers": gateway_workers(),
            "tokens": args.tokens,
            "spacing_ms": args.spacing_ms,
            "ladder": ladder,
            "rounds": args.rounds,
            "clients": args.clients,
            "ramp_seconds": args.ramp_seconds,
            "threshold_ms": args.threshold_ms,
            "skip_above_ms": args.skip_above_ms,
            "skipped": skipped,
            "order": f"balanced random per N (rotations of a shuffled order), seed {args.seed}; one target at a time",
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "wall_seconds": round(time.time() - started, 1),
        },
        "code": code,
        "versions": {"vllm-router": package_version(args.vllm_router, "vllm-router")} if args.vllm_router else {},
        "saturation": {name: saturation(summary, name, args.threshold_ms, args.spacing_ms) for name in urls},
        "summary": summary,
        "cells": cells,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(render_table(result))
    print(json.dumps(result["saturation"], indent=2))


if __name__ == "__main__":
    main()
