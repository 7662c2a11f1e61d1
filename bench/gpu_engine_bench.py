"""Our transformers engine on one GPU (or the CPU): TTFT, single-stream decode speed, concurrent throughput.

Drives `servlane_runtime.engines.transformers_engine.TransformersEngine` directly, the way the runtime
does (`model_host.py`: construct with a RuntimeConfig and a model folder, `await load()`; `serving.py`:
`engine.generate(prompt, SamplingOptions(...), request_id)`, an async stream of `GenerationDelta`s, closed
with `aclose()`), with no HTTP server in between. Every stream is greedy with `ignore_eos`, so every
round does the same work: `--max-tokens` tokens per stream (checked).

Run from the repository root with a plain interpreter; nothing needs installing from this repository
(the script puts api/, core/, runtime/ and devtools/ on sys.path itself):

    python3 bench/gpu_engine_bench.py                      # cuda if available, else cpu
    python3 bench/gpu_engine_bench.py --device cpu --out /tmp/cpu.json
    python3 bench/gpu_engine_bench.py --model /path/to/local/hf/model --max-tokens 128

Requirements: Python 3.10+ (the project targets 3.11), torch and transformers (tokenizers and safetensors
come with transformers). The engine module imports `servlane_api.runtime_config.RuntimeConfig`, which needs
pydantic (and Python 3.11 for the rest of servlane_api); if that import fails, a stand-in config with the
same fields is registered under that module name instead (recorded as `config_class`).
Not needed, never imported: vLLM, fastapi, uvicorn, httpx, prometheus_client, kopf, kubernetes.
Nothing is downloaded: the tiny Llama is built locally (random weights, cached per temp dir), and
`--model` must be a local folder.

The device: the engine has no setting for it; it uses "cuda" whenever `torch.cuda.is_available()`, else
"cpu". `--device cpu` therefore hides the GPUs (CUDA_VISIBLE_DEVICES="" before torch is imported),
and `--device cuda` fails when no GPU is visible. The device the model's parameters actually sit on is
recorded (`device_used`). The dtype is RuntimeConfig.dtype (`--dtype`, default "auto": float32 on the
CPU, the checkpoint's dtype on a GPU).

Writes bench/results/gpu_engine.json (or --out) after every round, so a run cut short keeps its data.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("api", "core", "runtime", "devtools")
DEFAULT_OUT = REPO / "bench" / "results" / "gpu_engine.json"
PROMPT_TEXT = (
    "Servlane serves AI models on Kubernetes. The runtime answers OpenAI-compatible requests: chat "
    "completions, completions and embeddings. A canary sends a small share of traffic to a new version "
    "and watches its errors and latency. The quick brown fox jumps over the lazy dog. "
)


def _put_sources_on_path() -> None:
    for name in reversed(SOURCE_DIRS):
        path = str(REPO / name)
        if path not in sys.path:
            sys.path.insert(0, path)


@dataclass(frozen=True)
class StandInConfig:
    """The RuntimeConfig fields the transformers engine reads, for a machine without pydantic."""

    model_source: str
    served_model_name: str
    engine: str = "transformers"
    task: str = "generate"
    dtype: str = "auto"
    max_model_len: int | None = None
    max_in_flight: int = 64


def _runtime_config_class() -> tuple[Any, str]:
    """RuntimeConfig, or the stand-in registered under its module name when servlane_api cannot be imported
    (no pydantic; or Python 3.10, where typing.Self, StrEnum and datetime.UTC are missing): the engine module
    imports `servlane_api.runtime_config` at import time."""
    try:
        from servlane_api.runtime_config import RuntimeConfig

        return RuntimeConfig, "servlane_api.runtime_config.RuntimeConfig"
    except ImportError as exc:
        why = f"{type(exc).__name__}: {exc}"
        print(f"servlane_api does not import here ({why}); using a stand-in RuntimeConfig", flush=True)
    for name in [m for m in sys.modules if m == "servlane_api" or m.startswith("servlane_api.")]:
        del sys.modules[name]
    package = types.ModuleType("servlane_api")
    package.__path__ = []
    module = types.ModuleType("servlane_api.runtime_config")
    module.__dict__["RuntimeConfig"] = StandInConfig
    sys.modules["servlane_api"] = package
    sys.modules["servlane_api.runtime_config"] = module
    return StandInConfig, f"StandInConfig (servlane_api did not import: {why})"


def _choose_device(requested: str | None) -> tuple[str, str]:
    """The device to ask for, and why. Must run before torch is imported (see the module docstring)."""
    if requested == "cpu":
        if "torch" in sys.modules:
            return "cpu", "requested; torch was already imported, so the GPUs could not be hidden"
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        return "cpu", 'requested (GPUs hidden with CUDA_VISIBLE_DEVICES="": the engine has no device setting)'
    import torch

    available = torch.cuda.is_available()
    if requested == "cuda":
        if not available:
            raise SystemExit("--device cuda: torch.cuda.is_available() is False on this machine")
        return "cuda", "requested"
    return ("cuda", "default: a GPU is available") if available else ("cpu", "default: no GPU is available")


def _versions() -> dict[str, Any]:
    import torch
    import transformers

    cudnn: Any = torch.backends.cudnn  # untyped in torch's stubs
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": cudnn.version() if cudnn.is_available() else None,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
    }
    for name in ("tokenizers", "pydantic"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        info["gpu_name"] = torch.cuda.get_device_name(index)
        info["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(index)))
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        info["gpu_count"] = torch.cuda.device_count()
        info["driver"] = _nvidia_smi("driver_version")
    return info


def _nvidia_smi(query: str) -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


@dataclass
class StreamResult:
    ttft_s: float  # from submitting the request to its first streamed delta
    first_tokens: int  # tokens the first delta covers (text can be held back, e.g. a split character)
    total_s: float  # from submitting to the last delta
    tokens: int
    finish_reason: str | None


@dataclass
class Stats:
    values: list[float] = field(default_factory=list)

    def summary(self, digits: int = 2) -> dict[str, float] | None:
        if not self.values:
            return None
        return {
            "median": round(statistics.median(self.values), digits),
            "min": round(min(self.values), digits),
            "max": round(max(self.values), digits),
        }


async def _one_stream(engine: Any, prompt: str, options: Any, request_id: str, start: float) -> StreamResult:
    first: float | None = None
    first_tokens = tokens = 0
    finish: str | None = None
    stream = engine.generate(prompt, options, request_id)
    try:
        async for delta in stream:
            if first is None:
                first, first_tokens = time.perf_counter(), delta.completion_tokens
            tokens, finish = delta.completion_tokens, delta.finish_reason
    finally:
        await stream.aclose()
    end = time.perf_counter()
    return StreamResult((first or end) - start, first_tokens, end - start, tokens, finish)


async def _batch(engine: Any, prompt: str, options: Any, streams: int, tag: str) -> tuple[list[StreamResult], float]:
    start = time.perf_counter()
    results = await asyncio.gather(*(_one_stream(engine, prompt, options, f"{tag}-{i}", start) for i in range(streams)))
    return list(results), time.perf_counter() - start


def _build_prompt(engine: Any, target_tokens: int) -> str:
    words = PROMPT_TEXT.split()
    text = ""
    i = 0
    while engine.count_tokens(text) < target_tokens:
        text = f"{text} {words[i % len(words)]}".strip()
        i += 1
    return text


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def _table(data: dict[str, Any]) -> str:
    env = data["environment"]
    where = env.get("gpu_name") or f"{env['cpu_count']} CPUs"
    lines = [
        f"device used: {data['device_used']} ({where}), dtype {data['dtype_used']}, "
        f"{data['settings']['max_tokens']} tokens per stream, prompt {data['prompt_tokens']} tokens, "
        f"{data['rounds_done']} rounds",
        "| streams | TTFT ms median [min-max] | decode tok/s per stream | aggregate tok/s median [min-max] |",
        "|---:|---|---|---|",
    ]

    def fmt(s: dict[str, float] | None) -> str:
        return "-" if s is None else f"{s['median']:g} [{s['min']:g}-{s['max']:g}]"

    for key, row in data["results"].items():
        lines.append(f"| {key} | {fmt(row['ttft_ms'])} | {fmt(row['decode_tok_s'])} | {fmt(row['aggregate_tok_s'])} |")
    if not data["all_rounds_complete"]:
        lines.append(f"WARNING: incomplete streams: {data['problems'][:5]}")
    return "\n".join(lines)


async def _run(args: argparse.Namespace, device: str, device_reason: str) -> dict[str, Any]:
    started = time.perf_counter()
    load_start = _load()
    config_class, config_name = _runtime_config_class()
    import torch

    from servlane_runtime.engines.base import SamplingOptions
    from servlane_runtime.engines.transformers_engine import TransformersEngine

    print(f"device: {device} ({device_reason})", flush=True)
    tmp: str | None = None
    build_s = None
    if args.model:
        model_path = Path(args.model)
        model_name = str(model_path)
    else:
        from servlane_devtools.tiny_model import build_tiny_llama

        tmp = tempfile.mkdtemp(prefix="servlane-gpu-bench-")
        t0 = time.perf_counter()
        model_path = build_tiny_llama(Path(tmp))
        build_s = round(time.perf_counter() - t0, 2)
        model_name = "tiny-llama (servlane_devtools.tiny_model, random weights)"
    concurrency = sorted(set(args.concurrency))
    config = config_class(
        model_source=str(model_path),
        served_model_name="bench",
        engine="transformers",
        dtype=args.dtype,
        max_in_flight=max(concurrency),
    )
    engine = TransformersEngine(config, str(model_path))
    try:
        t0 = time.perf_counter()
        await engine.load()
        load_s = round(time.perf_counter() - t0, 2)
        params = next(engine._model.parameters())
        device_used = str(params.device)
        if device_used.split(":")[0] != device:
            print(f"WARNING: asked for {device}, the engine put the model on {device_used}", flush=True)
        prompt = _build_prompt(engine, args.prompt_tokens)
        prompt_tokens = engine.count_tokens(prompt)
        if prompt_tokens + args.max_tokens > engine.max_model_len:
            raise SystemExit(f"prompt {prompt_tokens} + {args.max_tokens} tokens exceed max_model_len")
        options = SamplingOptions(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
        data: dict[str, Any] = {
            "benchmark": "gpu_engine_bench",
            "engine": "transformers",
            "model": model_name,
            "model_path": str(model_path) if args.model else None,
            "device_requested": device,
            "device_reason": device_reason,
            "device_used": device_used,
            "engine_device": engine._device,
            "dtype_used": str(params.dtype).removeprefix("torch."),
            "config_class": config_name,
            "settings": {
                "rounds": args.rounds,
                "warmup_rounds": args.warmup,
                "max_tokens": args.max_tokens,
                "concurrency": concurrency,
                "prompt_tokens_target": args.prompt_tokens,
                "dtype": args.dtype,
                "sampling": "greedy, ignore_eos",
                "time_limit_s": args.time_limit,
            },
            "prompt_tokens": prompt_tokens,
            "environment": _versions(),
            "git_commit": _git_commit(),
            "load_avg": {"start": load_start},
            "tiny_model_build_s": build_s,
            "engine_load_s": load_s,
            "rounds_done": 0,
            "stopped_early": None,
            "all_rounds_complete": True,
            "problems": [],
            "results": {},
            "raw": {str(n): [] for n in concurrency},
        }
        print(
            f"loaded {model_name} in {load_s}s on {device_used} ({data['dtype_used']}); "
            f"prompt {prompt_tokens} tokens; warming up",
            flush=True,
        )
        for w in range(args.warmup):
            for n in concurrency:
                await _batch(engine, prompt, options, n, f"warmup{w}-{n}")
        if device_used.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        data["load_avg"]["after_warmup"] = _load()
        measure_start = time.perf_counter()
        ttft: dict[int, Stats] = {n: Stats() for n in concurrency}
        decode: dict[int, Stats] = {n: Stats() for n in concurrency}
        aggregate: dict[int, Stats] = {n: Stats() for n in concurrency}
        last_round_s = 0.0
        for r in range(args.rounds):
            elapsed = time.perf_counter() - measure_start
            if r and elapsed + last_round_s > args.time_limit:
                data["stopped_early"] = f"time limit {args.time_limit}s: {r} of {args.rounds} rounds"
                print(f"stopping: {data['stopped_early']}", flush=True)
                break
            round_start = time.perf_counter()
            for n in concurrency:
                results, wall = await _batch(engine, prompt, options, n, f"r{r}-{n}")
                for i, res in enumerate(results):
                    if res.tokens != args.max_tokens or res.finish_reason != "length":
                        data["all_rounds_complete"] = False
                        data["problems"].append(
                            f"round {r}, {n} streams, stream {i}: {res.tokens} tokens, finish {res.finish_reason}"
                        )
                total = sum(res.tokens for res in results)
                ttfts = [res.ttft_s for res in results]
                per_stream = [
                    (res.tokens - res.first_tokens) / (res.total_s - res.ttft_s)
                    for res in results
                    if res.total_s > res.ttft_s and res.tokens > res.first_tokens
                ]
                ttft[n].values.append(statistics.median(ttfts) * 1000)
                if per_stream:
                    decode[n].values.append(statistics.median(per_stream))
                aggregate[n].values.append(total / wall)
                data["raw"][str(n)].append(
                    {
                        "round": r,
                        "wall_s": round(wall, 4),
                        "tokens": total,
                        "ttft_ms": [round(t * 1000, 2) for t in ttfts],
                        "first_delta_tokens": [res.first_tokens for res in results],
                        "decode_tok_s": [round(x, 1) for x in per_stream],
                    }
                )
            last_round_s = time.perf_counter() - round_start
            data["rounds_done"] = r + 1
            data["results"] = {
                f"{n} stream{'s' if n > 1 else ''}": {
                    "streams": n,
                    "ttft_ms": ttft[n].summary(),
                    "decode_tok_s": decode[n].summary(1),
                    "aggregate_tok_s": aggregate[n].summary(1),
                }
                for n in concurrency
            }
            data["load_avg"]["end"] = _load()
            if device_used.startswith("cuda"):
                data["gpu_peak_memory_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
            data["measure_s"] = round(time.perf_counter() - measure_start, 2)
            data["total_s"] = round(time.perf_counter() - started, 2)
            _write(args.out, data)
            print(f"round {r + 1}/{args.rounds} done in {last_round_s:.1f}s", flush=True)
        _write(args.out, data)
        return data
    finally:
        await engine.close()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda if available")
    parser.add_argument("--model", default=None, help="a local Hugging Face model folder (default: tiny Llama)")
    parser.add_argument("--dtype", choices=("auto", "float16", "bfloat16", "float32"), default="auto")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded rounds first (default 1)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per stream (default 64)")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="prompt length, about (default 32)")
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[1, 8], help="concurrent streams per setting (default 1 8)"
    )
    parser.add_argument(
        "--time-limit", type=float, default=180, help="no new round starts past this many seconds (default 180)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.max_tokens < 2 or min(args.concurrency) < 1:
        parser.error("--rounds and --concurrency need at least 1, --max-tokens at least 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    _put_sources_on_path()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    device, reason = _choose_device(args.device)
    data = asyncio.run(_run(args, device, reason))
    print(_table(data))
    print(f"wrote {args.out}")
    return 0 if data["all_rounds_complete"] and data["rounds_done"] else 1


if __name__ == "__main__":
    sys.exit(main())
