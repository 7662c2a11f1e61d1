"""Our runtime (vllm and transformers engines) against vLLM's own OpenAI server, side by side.

All three serve the same tiny Llama (tests/support/models.py) on loopback and stay up for the whole run.
Each measurement is a batch of streaming chat completions (MAX_TOKENS tokens each, ignore_eos)
at 1, 8 or 32 concurrent streams. Batches are interleaved: every round runs each concurrency on
every target, rotating the target order per round, so background load on a shared machine falls on
all of them alike. Our vllm engine's numbers are reported as ratios to `vllm serve` (the goal is
parity or better). Writes bench/results/runtime.json.

`--one-at-a-time` (writes bench/results/runtime_alone.json): one server alive at a time, as a
user runs one: each round starts each target in turn (order alternating between rounds), warms it,
runs every concurrency, and stops it, so no idle server's threads share the CPUs with the one measured.
Every request's time to first token is kept per round, so a bimodal distribution shows.

Run: .venv/bin/python bench/runtime_bench.py [--rounds N] [--one-at-a-time] [--label TEXT] [--out FILE]
Table: .venv/bin/python bench/runtime_bench.py --table bench/results/runtime.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from servlane_api.runtime_config import RuntimeConfig  # noqa: E402
from tests.support.models import build_tiny_llama  # noqa: E402
from tests.support.polling import wait_until  # noqa: E402
from tests.support.ports import free_port  # noqa: E402
from tests.support.sse import asse_lines  # noqa: E402

MODEL = "tiny-llama"
MAX_TOKENS = 32
MAX_MODEL_LEN = 256
CONCURRENCIES: tuple[int, ...] = (1, 8, 32)
REQUESTS_PER_BATCH = {1: 8, 8: 32, 32: 64}
ENV = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
OURS_VLLM, VLLM_SERVE, OURS_TRANSFORMERS = "servlane-vllm", "vllm-serve", "servlane-transformers"
AA_TWIN = "vllm-serve-twin"  # --aa: the second vllm serve, in our runtime's place
COLD_STREAMS = 8  # one at a time: the first batch of a fresh server
# Reuse connections between requests (a bench may turn it off for a server that drops reused ones).
KEEP_ALIVE = True


@dataclass
class Target:
    name: str
    command: list[str]
    port: int
    ready_path: str
    env: dict[str, str] = field(default_factory=lambda: ENV)
    proc: subprocess.Popen[bytes] | None = None
    ready_seconds: float = 0.0
    # Per concurrency: every request's (latency, ttft, completion tokens) and every batch's wall time.
    samples: dict[int, list[tuple[float, float, int]]] = field(default_factory=dict)
    walls: dict[int, list[float]] = field(default_factory=dict)
    batch_ttft_p50: dict[int, list[float]] = field(default_factory=dict)
    batch_ttfts: dict[int, list[list[float]]] = field(default_factory=dict)  # every request's, per batch
    cold: list[list[float]] = field(default_factory=list)  # one at a time: each fresh server's first batch's TTFTs

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def our_target(name: str, model_dir: Path, engine: str, workdir: Path, shipped: bool = False) -> Target:
    """`shipped`: the runtime's defaults (dtype auto; on CPU eager, compile off and the KV cache sized from
    memory by the runtime itself), else bfloat16 and --enforce-eager with the bench's 1 GiB KV cache."""
    port = free_port()
    extra: dict[str, Any] = {"dtype": "bfloat16", "extra_args": ["--enforce-eager"]} if engine == "vllm" else {}
    if shipped:
        extra = {}
    config = RuntimeConfig.model_validate(
        {
            "model_source": str(model_dir),
            "served_model_name": MODEL,
            "engine": engine,
            "host": "127.0.0.1",
            "port": port,
            "metrics_port": free_port(),  # /metrics on a port of its own, free here (9090 may be taken)
            "max_model_len": MAX_MODEL_LEN,
            "max_in_flight": max(CONCURRENCIES),  # admission must not be what limits the load
            **extra,
        }
    )
    path = workdir / f"{name}.json"
    path.write_text(config.to_env_value())
    command = [sys.executable, "-m", "servlane_runtime", "--config", str(path), "--log-level", "warning"]
    env = {k: v for k, v in ENV.items() if k != "VLLM_CPU_KVCACHE_SPACE"} if shipped else ENV
    return Target(name, command, port, "/ready", env)


def vllm_serve_target(model_dir: Path, shipped: bool = False, name: str = VLLM_SERVE) -> Target:
    """`shipped`: what our runtime's defaults give vLLM on CPU (eager, torch.compile off, dtype auto, the 1 GiB
    KV cache ours sizes for this model), else bfloat16 and --enforce-eager."""
    port = free_port()
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager", "--uvicorn-log-level", "warning",
    ]  # fmt: skip
    if not shipped:
        command += ["--dtype", "bfloat16"]
    env = ENV | {"TORCH_COMPILE_DISABLE": "1"} if shipped else ENV
    return Target(name, command, port, "/v1/models", env)


@contextlib.contextmanager
def running(targets: list[Target], workdir: Path) -> Iterator[None]:
    """Start every target at once (startup is the slow part) and stop them all at the end."""
    try:
        started = time.perf_counter()
        for t in targets:
            log = (workdir / f"{t.name}.log").open("wb")
            t.proc = subprocess.Popen(t.command, stdout=log, stderr=subprocess.STDOUT, env=t.env)
        for t in targets:
            wait_until(f"{t.name} to be ready", partial(_ready, t, workdir), 900, interval=0.5)
            t.ready_seconds = round(time.perf_counter() - started, 1)
            print(f"bench: {t.name} ready after {t.ready_seconds}s", flush=True)
        yield
    finally:
        for t in targets:
            if t.proc is not None and t.proc.poll() is None:
                t.proc.terminate()
        for t in targets:
            if t.proc is None:
                continue
            try:
                t.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                t.proc.kill()
                t.proc.wait()


def _ready(t: Target, workdir: Path) -> bool:
    assert t.proc is not None
    if t.proc.poll() is not None:
        raise RuntimeError(f"{t.name} exited: {(workdir / f'{t.name}.log').read_text()[-3000:]}")
    try:
        return httpx.get(t.base + t.ready_path, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


# Sampling fields every request carries (a bench may sample instead of decoding greedily).
SAMPLING: dict[str, Any] = {"temperature": 0}


def request_body(i: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Tell me about Kubernetes, part {i}."}],
        "max_tokens": MAX_TOKENS,
        **SAMPLING,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def one_request(client: httpx.AsyncClient, url: str, i: int) -> tuple[float, float, int]:
    """(latency, time to the first content token, completion tokens from the usage chunk)."""
    start = time.perf_counter()
    ttft = 0.0
    tokens = 0
    async with client.stream("POST", url, json=request_body(i)) as response:
        response.raise_for_status()
        async for line in asse_lines(response):
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if not ttft and any(c["delta"].get("content") for c in chunk.get("choices", [])):
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return time.perf_counter() - start, ttft, tokens


async def batch(target: Target, concurrency: int, warm_connections: bool = True) -> None:
    """REQUESTS_PER_BATCH[concurrency] streams, `concurrency` at a time; first (unless `warm_connections` is
    off) one unmeasured request per connection, so connections are open when the measured batch starts."""
    url = target.base + "/v1/chat/completions"
    count = REQUESTS_PER_BATCH[concurrency]
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency if KEEP_ALIVE else 0)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        if warm_connections:
            await asyncio.gather(*(one_request(client, url, -i) for i in range(concurrency)))

        async def bounded(i: int) -> tuple[float, float, int]:
            async with sem:
                return await one_request(client, url, i)

        start = time.perf_counter()
        results = await asyncio.gather(*(bounded(i) for i in range(count)))
        wall = time.perf_counter() - start
    target.samples.setdefault(concurrency, []).extend(results)
    target.walls.setdefault(concurrency, []).append(wall)
    target.batch_ttft_p50.setdefault(concurrency, []).append(statistics.median(r[1] for r in results))
    target.batch_ttfts.setdefault(concurrency, []).append([round(r[1], 4) for r in results])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(target: Target, concurrency: int) -> dict[str, Any]:
    samples = target.samples[concurrency]
    wall = sum(target.walls[concurrency])
    tokens = sum(s[2] for s in samples)
    ttfts = [s[1] for s in samples]
    return {
        "requests": len(samples),
        "completion_tokens": tokens,
        "wall_seconds": round(wall, 3),
        "requests_per_second": round(len(samples) / wall, 2),
        "output_tokens_per_second": round(tokens / wall, 1),
        "ttft_p50_s": round(statistics.median(ttfts), 4),
        "ttft_p99_s": round(percentile(ttfts, 0.99), 4),
        "latency_p50_s": round(statistics.median(s[0] for s in samples), 4),
    }


def ratios(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float]:
    """Ours / vllm serve over all batches: above 1 is better for throughput, below 1 for TTFT."""
    keys = ("requests_per_second", "output_tokens_per_second", "ttft_p50_s", "ttft_p99_s")
    return {k: round(ours[k] / theirs[k], 3) for k in keys if theirs[k]}


def spread(values: list[float]) -> dict[str, Any]:
    """Median, quartiles and range of per-round values (the claim is the median, never the best round)."""
    ordered = sorted(values)
    quartiles = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else ordered * 3
    return {
        "median": round(statistics.median(ordered), 3),
        "q1": round(quartiles[0], 3),
        "q3": round(quartiles[2], 3),
        "min": round(ordered[0], 3),
        "max": round(ordered[-1], 3),
        "per_round": [round(v, 3) for v in values],
    }


def paired_ratios(ours: Target, theirs: Target, concurrency: int) -> dict[str, Any]:
    """Per-round ratios, ours to theirs: each pair of batches ran back to back, so under the same background
    load. Throughput above 1 and TTFT below 1 favour ours."""
    throughput = [t / o for o, t in zip(ours.walls[concurrency], theirs.walls[concurrency], strict=True)]
    ttft = [o / t for o, t in zip(ours.batch_ttft_p50[concurrency], theirs.batch_ttft_p50[concurrency], strict=True)]
    return {"requests_per_second": spread(throughput), "ttft_p50_s": spread(ttft)}


def same_work(row: dict[str, Any], names: list[str]) -> bool:
    """Every target answered every request (a failed one aborts the run) with the same completion tokens."""
    return len({(row[n]["requests"], row[n]["completion_tokens"]) for n in names}) == 1


def machine() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line), platform.processor())
    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if "MemTotal" in line)
    versions = {}
    for dist in ("vllm-cpu", "torch", "transformers", "fastapi", "uvicorn"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[dist] = importlib.metadata.version(dist)
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(mem_kb / 2**20, 1),
        "gpu": None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


_COLUMNS = (  # (key, scale, decimals)
    ("requests_per_second", 1, 1),
    ("output_tokens_per_second", 1, 0),
    ("ttft_p50_s", 1000, 0),
    ("ttft_p99_s", 1000, 0),
)


def markdown_table(report: dict[str, Any]) -> str:
    """The README table: each target's numbers per concurrency, ours-vs-vllm-serve ratios in brackets."""
    lines = [
        "| streams | server | req/s | output tok/s | TTFT p50 (ms) | TTFT p99 (ms) | per-round ratio: req/s, TTFT p50 "
        "(median, range) |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    for concurrency, row in report["results_by_concurrency"].items():
        ratio = row[f"{OURS_VLLM}_vs_{VLLM_SERVE}"]
        for name in (OURS_VLLM, VLLM_SERVE, OURS_TRANSFORMERS):
            if name not in row:  # one at a time: no transformers target
                continue
            cells = [str(concurrency), name]
            for key, scale, decimals in _COLUMNS:
                cell = f"{row[name][key] * scale:.{decimals}f}"
                if name == OURS_VLLM and key in ratio:
                    cell += f" (x{ratio[key]:.2f})"
                cells.append(cell)
            paired = row.get(f"{OURS_VLLM}_vs_{VLLM_SERVE}_paired", {})
            if name == OURS_VLLM and paired:
                rps, ttft = paired["requests_per_second"], paired["ttft_p50_s"]
                cells.append(
                    f"x{rps['median']:.2f} ({rps['min']:.2f}-{rps['max']:.2f}), "
                    f"x{ttft['median']:.2f} ({ttft['min']:.2f}-{ttft['max']:.2f})"
                )
            else:
                cells.append("")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def measure_side_by_side(targets: list[Target], rounds: int, workdir: Path) -> None:
    with running(targets, workdir):
        for round_no in range(rounds):
            for concurrency in CONCURRENCIES:
                shift = round_no % len(targets)
                for target in targets[shift:] + targets[:shift]:  # rotate who goes first
                    asyncio.run(batch(target, concurrency))
            print(f"bench: round {round_no + 1}/{rounds} done", flush=True)


def measure_one_at_a_time(targets: list[Target], rounds: int, workdir: Path) -> None:
    """Each round starts, measures and stops each target in turn; the order alternates between rounds. The
    first batch a fresh server gets (COLD_STREAMS at once, as a pod just scaled up gets them) is kept apart
    (`cold`); the concurrencies are measured after it."""
    for round_no in range(rounds):
        shift = round_no % len(targets)
        for target in targets[shift:] + targets[:shift]:
            with running([target], workdir):
                asyncio.run(batch(target, COLD_STREAMS, warm_connections=False))
                target.cold.append(_take_last_batch(target, COLD_STREAMS))
                for concurrency in CONCURRENCIES:
                    asyncio.run(batch(target, concurrency))
        print(f"bench: round {round_no + 1}/{rounds} done", flush=True)


def _take_last_batch(target: Target, concurrency: int) -> list[float]:
    """Removes the last batch at `concurrency` from the target's samples; returns its TTFTs."""
    count = REQUESTS_PER_BATCH[concurrency]
    del target.samples[concurrency][-count:]
    target.walls[concurrency].pop()
    target.batch_ttft_p50[concurrency].pop()
    return target.batch_ttfts[concurrency].pop()


def ttft_shape(target: Target, concurrency: int) -> dict[str, Any]:
    """Every request's TTFT in ms per round (quartiles of each round), to see a bimodal distribution."""
    rounds = []
    for ttfts in target.batch_ttfts.get(concurrency, []):
        q = statistics.quantiles(ttfts, n=4, method="inclusive") if len(ttfts) > 1 else ttfts * 3
        rounds.append([round(q[0] * 1000, 1), round(q[1] * 1000, 1), round(q[2] * 1000, 1)])
    return {"per_round_q1_median_q3_ms": rounds, "per_request_s": target.batch_ttfts.get(concurrency, [])}


def cold_summary(target: Target) -> dict[str, Any]:
    """The first batch of each fresh server: its TTFT median per round and every request's."""
    medians = [statistics.median(ttfts) for ttfts in target.cold]
    return {"streams": COLD_STREAMS, "ttft_p50_s": spread(medians), "per_request_s": target.cold}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--label", default="", help="a note stored with the results (e.g. the change measured)")
    parser.add_argument("--out", type=Path, help="default bench/results/runtime.json (runtime_alone.json alone)")
    parser.add_argument("--table", type=Path, metavar="RESULTS", help="only print RESULTS as a markdown table")
    parser.add_argument(
        "--one-at-a-time", action="store_true", help="one server alive at a time (our vLLM engine, vllm serve)"
    )
    parser.add_argument(
        "--batch-scale",
        type=int,
        default=1,
        help="requests per batch times this (longer batches: less of a round's ratio is one stall's luck)",
    )
    parser.add_argument(
        "--aa",
        action="store_true",
        help="with --one-at-a-time: vllm serve against itself (an A/A run: the rig's own spread between rounds)",
    )
    args = parser.parse_args()
    for concurrency in REQUESTS_PER_BATCH:
        REQUESTS_PER_BATCH[concurrency] *= args.batch_scale
    if args.table is not None:
        print(markdown_table(json.loads(args.table.read_text())))
        return
    alone = args.one_at_a_time
    if args.aa and not alone:
        parser.error("--aa needs --one-at-a-time")
    default_out = ("runtime_alone_aa.json" if args.aa else "runtime_alone.json") if alone else "runtime.json"
    out = args.out or REPO / "bench" / "results" / default_out
    facts = machine()
    model_dir = build_tiny_llama()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        first = (
            vllm_serve_target(model_dir, shipped=True, name=AA_TWIN)
            if args.aa
            else our_target(OURS_VLLM, model_dir, "vllm", workdir, shipped=alone)
        )
        targets = [first, vllm_serve_target(model_dir, shipped=alone)]
        if alone:
            measure_one_at_a_time(targets, args.rounds, workdir)
        else:
            targets.append(our_target(OURS_TRANSFORMERS, model_dir, "transformers", workdir))
            measure_side_by_side(targets, args.rounds, workdir)
    facts["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results: dict[str, Any] = {}
    for concurrency in CONCURRENCIES:
        row: dict[str, Any] = {t.name: summary(t, concurrency) for t in targets}
        pair = f"{targets[0].name}_vs_{VLLM_SERVE}"
        row[pair] = ratios(row[targets[0].name], row[VLLM_SERVE])
        row[f"{pair}_paired"] = paired_ratios(targets[0], targets[1], concurrency)
        row["same_work"] = same_work(row, [t.name for t in targets])
        row["ttft_shape"] = {t.name: ttft_shape(t, concurrency) for t in targets}
        results[str(concurrency)] = row
    order = (
        "one server alive at a time: each round starts, warms (one unmeasured batch), measures and stops each "
        "target in turn, order alternating between rounds"
        if alone
        else "interleaved: each round runs every concurrency on every target, target order rotated"
    )
    report = {
        "benchmark": ("runtime_alone_aa" if args.aa else "runtime_alone") if alone else "runtime",
        "label": args.label,
        "model": "tiny-llama (hidden 128, 2 layers, 2 heads of 64, random weights; vLLM bf16, transformers fp32)",
        "load": {
            "endpoint": "/v1/chat/completions",
            "stream": True,
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
            "concurrencies": list(CONCURRENCIES),
            "requests_per_batch": REQUESTS_PER_BATCH,
            "batch_scale": args.batch_scale,
            "rounds": args.rounds,
            "order": order,
            "settings": "shipped defaults (ours: dtype auto, eager and torch.compile off and the KV cache sized by "
            "the runtime; vllm serve: the same, given as --enforce-eager, TORCH_COMPILE_DISABLE=1, "
            "VLLM_CPU_KVCACHE_SPACE=1)"
            if alone
            else "both bfloat16, --enforce-eager, VLLM_CPU_KVCACHE_SPACE=1",
        },
        "machine": facts,
        "ready_seconds": {t.name: t.ready_seconds for t in targets},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results_by_concurrency": results,
    }
    if alone:
        report["first_batch_of_a_fresh_server"] = {t.name: cold_summary(t) for t in targets}
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({c: {k: v for k, v in r.items() if k != "ttft_shape"} for c, r in results.items()}, indent=1))
    print(f"bench: wrote {out}")


if __name__ == "__main__":
    main()
