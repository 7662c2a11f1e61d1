"""Our runtime's llama.cpp engine against llama-server (llama.cpp's own OpenAI server, built from the same source
by scripts/build-llamacpp.sh) on the same quantized GGUF, and our transformers engine on the unquantized model, for
the README's "which engine on a CPU" table.

The model: a Llama-shaped model big enough for CPU time to be the engine's, not the server's (hidden 768, 12 layers
of 12 heads of 64, MLP 2048, the tiny tokenizer: ~85 M parameters, random seeded weights), saved once; its GGUF at
f16, quantized to Q4_K_M by llama-quantize. Streaming chat completions of MAX_TOKENS tokens (ignore_eos, greedy) at
1 and 4 concurrent streams; one server alive at a time, rounds in alternating order (runtime_bench's
--one-at-a-time method), the same threads for both llama.cpp servers (every CPU), 4 parallel sequences each.

Needs the bench's llama.cpp tools: bash scripts/build-llamacpp.sh --tools (built once, cached).
Run: .venv/bin/python bench/llamacpp_bench.py [--rounds N] [--label TEXT]   (writes bench/results/llamacpp.json)
`--sampled`: temperature 0.7 and top_p 0.9 instead of greedy, ours against llama-server only (its top_k and min_p
off in every request, so both do the same work: temperature, then top-p, then a draw), to
bench/results/llamacpp_sampled.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import runtime_bench as rb  # noqa: E402
from servlane_api.runtime_config import RuntimeConfig  # noqa: E402
from servlane_devtools.tiny_model import (  # noqa: E402
    build_tiny_llama,
    built_once,
    cache_root,
    convert_to_gguf,
    llamacpp_build,
)
from tests.support.ports import free_port  # noqa: E402

OURS, PEER, TRANSFORMERS = "servlane-llamacpp", "llama-server", "servlane-transformers"
CONCURRENCIES = (1, 4)
PARALLEL = 4
MAX_MODEL_LEN = 512
HTTP_THREADS = 32
BENCH_SHAPE = {
    "hidden_size": 768,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
    "head_dim": 64,
    "num_hidden_layers": 12,
    "intermediate_size": 2048,
    "max_position_embeddings": 2048,
}


def bench_model() -> Path:
    """The bench's Llama (BENCH_SHAPE, the tiny tokenizer, seeded random weights), built once and cached."""
    tiny = build_tiny_llama()
    recipe = json.dumps({"shape": BENCH_SHAPE, "tokenizer": tiny.name}, sort_keys=True).encode()
    key = hashlib.sha256(recipe).hexdigest()[:16]

    def write(out: Path) -> None:
        import shutil

        import torch
        import transformers

        tf: Any = transformers  # its constructors are untyped for mypy

        for name in tiny.iterdir():
            if name.name.startswith("tokenizer") or name.name in ("special_tokens_map.json", "chat_template.jinja"):
                shutil.copy(name, out / name.name)
        base = tf.AutoConfig.from_pretrained(tiny)
        config = tf.LlamaConfig(
            vocab_size=base.vocab_size,
            bos_token_id=base.bos_token_id,
            eos_token_id=base.eos_token_id,
            pad_token_id=base.pad_token_id,
            tie_word_embeddings=False,
            **BENCH_SHAPE,
        )
        torch.manual_seed(0)
        tf.LlamaForCausalLM(config).save_pretrained(out)

    return built_once(cache_root() / f"bench-llama-{key}", "config.json", write)


def quantized(model_dir: Path) -> Path:
    """The model's GGUF at f16, then Q4_K_M by llama-quantize (cached beside the model)."""
    target = model_dir.parent / f"{model_dir.name}-gguf-q4km"

    def write(out: Path) -> None:
        f16 = convert_to_gguf(model_dir, out / "model-f16.gguf", "f16")
        quantize = llamacpp_build(tools=True) / "bin" / "llama-quantize"
        subprocess.run([str(quantize), str(f16), str(out / "model.gguf"), "Q4_K_M"], check=True, capture_output=True)
        f16.unlink()

    return built_once(target, "model.gguf", write) / "model.gguf"


def ours(name: str, source: Path, engine: str, workdir: Path) -> rb.Target:
    port = free_port()
    config = RuntimeConfig.model_validate(
        {
            "model_source": str(source),
            "served_model_name": rb.MODEL,
            "engine": engine,
            "host": "127.0.0.1",
            "port": port,
            "metrics_port": free_port(),
            "max_model_len": MAX_MODEL_LEN,
            "max_in_flight": max(CONCURRENCIES),
            "llamacpp": {"parallel": PARALLEL},
        }
    )
    path = workdir / f"{name}.json"
    path.write_text(config.to_env_value())
    command = [sys.executable, "-m", "servlane_runtime", "--config", str(path), "--log-level", "warning"]
    return rb.Target(name, command, port, "/ready")


def llama_server(gguf: Path) -> rb.Target:
    """llama-server with the same sequences and context per sequence as ours, its GGUF's own template (--jinja)."""
    port = free_port()
    server = llamacpp_build(tools=True) / "bin" / "llama-server"
    command = [
        str(server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
        "--alias", rb.MODEL, "--parallel", str(PARALLEL), "--ctx-size", str(PARALLEL * MAX_MODEL_LEN),
        "--threads", str(len(os.sched_getaffinity(0))), "--jinja", "--no-webui", "--log-disable",
        # Its default HTTP pool (parallel + 4 = 8 threads) holds closed keep-alive connections for a while and
        # then drops new ones unanswered ("Server disconnected"): more threads, so connections are not measured.
        "--threads-http", str(HTTP_THREADS),
    ]  # fmt: skip
    return rb.Target(PEER, command, port, "/health")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--sampled", action="store_true", help="temperature 0.7, top_p 0.9; no transformers side")
    args = parser.parse_args()
    out = args.out or REPO / "bench" / "results" / ("llamacpp_sampled.json" if args.sampled else "llamacpp.json")
    if args.sampled:
        # llama-server's default chain also has top_k 40 and min_p 0.05: off, so its draw is over the same set.
        rb.SAMPLING = {"temperature": 0.7, "top_p": 0.9, "top_k": 0, "min_p": 0.0}
    rb.CONCURRENCIES = CONCURRENCIES
    # llama-server now and then drops a reused keep-alive connection unanswered ("Server disconnected without
    # sending a response", seen in round 2 of the first run): every request on a connection of its own, both sides.
    rb.KEEP_ALIVE = False
    # 8 requests at one stream made a batch of about a second: rounds ranged 0.75-1.00 on an idle machine.
    rb.REQUESTS_PER_BATCH = {1: 24, 4: 48, rb.COLD_STREAMS: rb.COLD_STREAMS}
    facts = rb.machine()
    model_dir = bench_model()
    gguf = quantized(model_dir)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        targets = [ours(OURS, gguf.parent, "llamacpp", workdir), llama_server(gguf)]
        if not args.sampled:
            targets.append(ours(TRANSFORMERS, model_dir, "transformers", workdir))
        rb.measure_one_at_a_time(targets, args.rounds, workdir)
    facts["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results: dict[str, Any] = {}
    for concurrency in CONCURRENCIES:
        row: dict[str, Any] = {t.name: rb.summary(t, concurrency) for t in targets}
        row[f"{OURS}_vs_{PEER}_paired"] = rb.paired_ratios(targets[0], targets[1], concurrency)
        if len(targets) > 2:
            row[f"{OURS}_vs_{TRANSFORMERS}_paired"] = rb.paired_ratios(targets[0], targets[2], concurrency)
        row["same_work"] = rb.same_work(row, [t.name for t in targets])
        row["ttft_shape"] = {t.name: rb.ttft_shape(t, concurrency) for t in targets}
        results[str(concurrency)] = row
    report = {
        "benchmark": "llamacpp",
        "label": args.label,
        "model": f"Llama {BENCH_SHAPE}, tiny tokenizer, random weights; llama.cpp: Q4_K_M GGUF "
        f"({gguf.stat().st_size / 2**20:.0f} MiB); transformers: the same model unquantized (dtype auto: fp32)",
        "load": {
            "endpoint": "/v1/chat/completions",
            "stream": True,
            "max_tokens": rb.MAX_TOKENS,
            "ignore_eos": True,
            "sampling": rb.SAMPLING,
            "concurrencies": list(CONCURRENCIES),
            "requests_per_batch": rb.REQUESTS_PER_BATCH,
            "rounds": args.rounds,
            "order": "one server alive at a time, order alternating between rounds; a fresh server's first batch "
            "kept apart",
            "settings": f"ours at its defaults but {PARALLEL} sequences (its default too) and maxModelLen "
            f"{MAX_MODEL_LEN}; llama-server --parallel {PARALLEL} --ctx-size {PARALLEL * MAX_MODEL_LEN} --threads "
            f"<every CPU> --jinja --threads-http {HTTP_THREADS} (not its default 8: see llama_server()); every "
            "request on a new connection (no keep-alive) for both; prompt caches in host memory at their defaults "
            "(llama-server --cache-ram 8192 MiB, ours 1024 MiB): the batches repeat their prompts",
        },
        "machine": facts,
        "llamacpp_build": {
            part: json.loads((llamacpp_build(tools=part == "tools") / "build.json").read_text())
            for part in ("engine", "tools")
        },
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results_by_concurrency": results,
        "first_batch_of_a_fresh_server": {t.name: rb.cold_summary(t) for t in targets},
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({c: {k: v for k, v in r.items() if k != "ttft_shape"} for c, r in results.items()}, indent=1))
    print(f"bench: wrote {out}")


if __name__ == "__main__":
    main()
