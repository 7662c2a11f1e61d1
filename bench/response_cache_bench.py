"""The gateway's response cache on a repeated deterministic workload: hit rate, and the latency it saves.

Backend: a real runtime (`python -m servlane_runtime --config FILE`, transformers engine, the tiny Llama of
`servlane_devtools.tiny_model`), so a miss costs real generation. In front of it, one gateway process
(`python -m servlane_gateway --routes-file ...`) serving two AIFeatures of the same AIModel: `chat` with
`spec.responseCache.enabled` and `chat-nocache` without, so both sides run on the same processes and see the
same machine. With `redis-server` on the machine a second gateway keeps its cache in a Redis of the bench's
own (free port, no persistence), measured the same way as a second configuration.

Workload: `--prompts` distinct prompts drawn with a Zipf-like skew (`--zipf`, seeded), each request streamed
or not (`--stream-share`), `--requests` per phase from `--clients` concurrent clients; every request is a
chat completion at temperature 0 of exactly `--max-tokens` tokens (`ignore_eos`). Both features get the same
request sequence. Each round runs both phases in balanced order (ABBA...) with fresh prompt texts (a
round-specific prefix), so the first occurrence of a prompt in the cached phase is a true miss. Per phase:
hit/miss from the `x-servlane-cache` header, checked against the gateway's cache counters; requests and
completion tokens that reached the runtime (its /metrics); latency of hits, misses and uncached requests;
wall time. Every cached answer must equal the uncached answer to the same request (content, finish reason,
tokens). Writes bench/results/response_cache.json.
Run: `.venv/bin/python bench/response_cache_bench.py [--rounds 5 --requests 96]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import os
import platform
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `bench` is its folder
from bench.batch_interference import percentile
from bench.gateway_bench import stop_processes, wait_ready
from tests.support.ports import free_port
from tests.support.sse import asse_lines

ROOT = Path(__file__).resolve().parent.parent
NULL = subprocess.DEVNULL
CACHED, UNCACHED = "chat", "chat-nocache"
SERVED = "tiny-llama"
CHAT_PATH = "/v1/chat/completions"
TOPICS = ("rivers", "bridges", "tea", "clocks", "owls", "glass", "maps", "bees", "salt", "kites")


@dataclass(frozen=True)
class Answer:
    content: str
    finish_reason: str | None
    completion_tokens: int | None


@dataclass(frozen=True)
class Outcome:
    prompt: int
    stream: bool
    status: int
    cache: str  # the x-servlane-cache header: hit, miss, or "" when the cache did not look
    latency_ms: float
    answer: Answer


def prompt_text(prefix: str, index: int) -> str:
    return f"{prefix} Question {index}: say something short about {TOPICS[index % len(TOPICS)]}."


def workload(args: argparse.Namespace) -> list[tuple[int, bool]]:
    """The request sequence (prompt index, streamed), the same for every round and both features."""
    rng = random.Random(args.seed)
    weights = [1 / (rank + 1) ** args.zipf for rank in range(args.prompts)]
    drawn = rng.choices(range(args.prompts), weights=weights, k=args.requests)
    return [(index, rng.random() < args.stream_share) for index in drawn]


def chat_body(feature: str, text: str, stream: bool, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": feature,
        "messages": [{"role": "user", "content": text}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "ignore_eos": True,  # every answer is max_tokens long, so misses all cost the same generation
    }
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


async def one_request(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[int, str, Answer]:
    if not body.get("stream"):
        response = await client.post(CHAT_PATH, json=body)
        cache = response.headers.get("x-servlane-cache", "")
        if response.status_code != 200:
            return response.status_code, cache, Answer(response.text[:200], None, None)
        data = response.json()
        choice = data["choices"][0]
        tokens = (data.get("usage") or {}).get("completion_tokens")
        return 200, cache, Answer(choice["message"]["content"] or "", choice["finish_reason"], tokens)
    parts: list[str] = []
    finish, tokens = None, None
    async with client.stream("POST", CHAT_PATH, json=body) as response:
        cache = response.headers.get("x-servlane-cache", "")
        if response.status_code != 200:
            return response.status_code, cache, Answer((await response.aread()).decode()[:200], None, None)
        async for line in asse_lines(response):
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            event = json.loads(line[5:])
            for choice in event.get("choices") or []:
                parts.append((choice.get("delta") or {}).get("content") or "")
                finish = choice.get("finish_reason") or finish
            if event.get("usage"):
                tokens = event["usage"].get("completion_tokens")
    return 200, cache, Answer("".join(parts), finish, tokens)


async def run_phase(
    url: str, feature: str, prefix: str, sequence: list[tuple[int, bool]], args: argparse.Namespace
) -> list[Outcome]:
    """`args.clients` closed-loop clients working through the sequence in order."""
    outcomes: list[Outcome] = []
    queue = iter(sequence)
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def worker() -> None:
            for index, stream in queue:
                body = chat_body(feature, prompt_text(prefix, index), stream, args.max_tokens)
                started = time.perf_counter()
                status, cache, answer = await one_request(client, body)
                latency = (time.perf_counter() - started) * 1000
                outcomes.append(Outcome(index, stream, status, cache, round(latency, 2), answer))

        await asyncio.gather(*(worker() for _ in range(args.clients)))
    return outcomes


def metric_sum(url: str, sample: str, **labels: str) -> float:
    """The sum of a /metrics sample's values over the series whose labels include `labels`."""
    total = 0.0
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def until(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def counters(runtime: str, gateway: str, feature: str) -> dict[str, float]:
    # The runtime counts a request when its handler returns, just after the last byte went out: wait until
    # nothing is in flight there, so the last requests of a phase are in.
    scraped = RUNTIME_METRICS[runtime]
    until("the runtime to be idle", lambda: metric_sum(scraped, "servlane_runtime_in_flight") == 0)
    return {
        "runtime_requests": metric_sum(scraped, "servlane_runtime_requests_total", endpoint=CHAT_PATH),
        "runtime_completion_tokens": metric_sum(scraped, "servlane_runtime_tokens_total", kind="completion"),
        "gateway_hits": metric_sum(
            GATEWAY_METRICS[gateway], "servlane_gateway_response_cache_hits_total", feature=feature
        ),
        "gateway_misses": metric_sum(
            GATEWAY_METRICS[gateway], "servlane_gateway_response_cache_misses_total", feature=feature
        ),
    }


def latency_summary(outcomes: list[Outcome]) -> dict[str, Any]:
    values = [o.latency_ms for o in outcomes]
    if not values:
        return {"requests": 0}
    return {"requests": len(values), "p50_ms": round(statistics.median(values), 2), "p99_ms": percentile(values, 0.99)}


def by_mode(outcomes: list[Outcome]) -> dict[str, Any]:
    return {
        "all": latency_summary(outcomes),
        "json": latency_summary([o for o in outcomes if not o.stream]),
        "stream": latency_summary([o for o in outcomes if o.stream]),
    }


def phase(
    urls: dict[str, str], feature: str, prefix: str, sequence: list[tuple[int, bool]], args: argparse.Namespace
) -> tuple[dict[str, Any], list[Outcome]]:
    before = counters(urls["runtime"], urls["gateway"], feature)
    load_start = os.getloadavg()
    started = time.perf_counter()
    outcomes = asyncio.run(run_phase(urls["gateway"], feature, prefix, sequence, args))
    wall = time.perf_counter() - started
    load_end = os.getloadavg()
    after = counters(urls["runtime"], urls["gateway"], feature)
    delta = {k: after[k] - before[k] for k in after}
    ok = [o for o in outcomes if o.status == 200]
    record: dict[str, Any] = {
        "feature": feature,
        "wall_s": round(wall, 3),
        "requests": len(outcomes),
        "failed": len(outcomes) - len(ok),
        "loadavg_start": [round(x, 2) for x in load_start],
        "loadavg_end": [round(x, 2) for x in load_end],
        **{k: int(v) for k, v in delta.items()},
        "wrong_length": sum(1 for o in ok if o.answer.completion_tokens != args.max_tokens),
    }
    if feature == CACHED:
        hits, misses = [o for o in ok if o.cache == "hit"], [o for o in ok if o.cache == "miss"]
        # Identical non-streamed requests that came while the first was in flight and took its answer.
        coalesced = [o for o in ok if o.cache == "coalesced"]
        distinct = len({(o.prompt, o.stream) for o in outcomes})
        record |= {
            "hits": len(hits),
            "misses": len(misses),
            "coalesced": len(coalesced),
            "hit_rate": round(len(hits) / max(len(ok), 1), 4),
            # What the cache spared the backend: hits and coalesced requests.
            "without_backend_rate": round((len(hits) + len(coalesced)) / max(len(ok), 1), 4),
            "distinct_requests": distinct,  # first occurrences: the misses no cache could avoid
            "best_hit_rate": round(1 - distinct / max(len(outcomes), 1), 4),
            # A repeat that came while its first was still being generated (or just before its answer
            # was kept, which happens after it is sent) is a miss too.
            "misses_beyond_first": len(misses) - distinct,
            # The gateway counts a coalesced request as a miss too (it missed before it waited).
            "gateway_metrics_agree": [len(hits), len(misses) + len(coalesced)]
            == [delta["gateway_hits"], delta["gateway_misses"]],
            "runtime_saw_only_misses": delta["runtime_requests"] == len(misses),
            "hit_latency": by_mode(hits),
            "miss_latency": by_mode(misses),
        }
    else:
        record |= {
            "uncached_header_absent": all(o.cache == "" for o in outcomes),
            "runtime_saw_every_request": delta["runtime_requests"] == len(outcomes),
        }
    record["latency"] = by_mode(ok)
    return record, outcomes


def compare(cached: list[Outcome], uncached: list[Outcome]) -> dict[str, int]:
    """Every cached answer against the uncached answer to the same request; also the uncached answers
    among themselves (the engine's own determinism) and each prompt's JSON against its streamed answer."""
    reference: dict[tuple[int, bool], Answer] = {}
    self_mismatches = 0
    for o in uncached:
        if o.status == 200:
            first = reference.setdefault((o.prompt, o.stream), o.answer)
            self_mismatches += first != o.answer
    mismatches = unmatched = 0
    for o in cached:
        if o.status != 200:
            continue
        expected = reference.get((o.prompt, o.stream))
        if expected is None:
            unmatched += 1
        else:
            mismatches += expected != o.answer
    texts: dict[int, set[str]] = {}
    for (prompt, _), answer in reference.items():
        texts.setdefault(prompt, set()).add(answer.content)
    return {
        "cached_vs_uncached_mismatches": mismatches,
        "cached_without_uncached_reference": unmatched,
        "uncached_repeat_mismatches": self_mismatches,
        "json_vs_stream_text_mismatches": sum(1 for t in texts.values() if len(t) > 1),
    }


def p50(part: dict[str, Any], kind: str = "latency") -> float:
    return float(part[kind]["all"]["p50_ms"])


def ratio(a: float, b: float) -> float:
    return round(a / b, 4)


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": min(values), "max": max(values), "n": len(values)}


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def pick(path: Callable[[dict[str, Any], dict[str, Any]], float | None]) -> dict[str, float] | None:
        values = [v for r in rounds if (v := path(r[CACHED], r[UNCACHED])) is not None]
        return spread(values) if values else None

    summary: dict[str, Any] = {
        "hit_rate": pick(lambda c, u: c["hit_rate"]),
        "without_backend_rate": pick(lambda c, u: c["without_backend_rate"]),
        "coalesced": pick(lambda c, u: c["coalesced"]),
        "best_hit_rate": pick(lambda c, u: c["best_hit_rate"]),
        "misses_beyond_first": pick(lambda c, u: c["misses_beyond_first"]),
        "runtime_requests_cached": pick(lambda c, u: c["runtime_requests"]),
        "runtime_requests_uncached": pick(lambda c, u: u["runtime_requests"]),
        "cached_to_uncached_p50_ratio": pick(lambda c, u: ratio(p50(c), p50(u))),
        "hit_to_uncached_p50_ratio": pick(lambda c, u: ratio(p50(c, "hit_latency"), p50(u)) if c["hits"] else None),
        "cached_to_uncached_wall_ratio": pick(lambda c, u: ratio(c["wall_s"], u["wall_s"])),
        "wall_s_cached": pick(lambda c, u: c["wall_s"]),
        "wall_s_uncached": pick(lambda c, u: u["wall_s"]),
    }  # fmt: skip
    latencies = (("hit", CACHED, "hit_latency"), ("miss", CACHED, "miss_latency"), ("uncached", UNCACHED, "latency"))
    for mode in ("all", "json", "stream"):
        for q in ("p50_ms", "p99_ms"):
            for name, side, kind in latencies:
                values = [v for r in rounds if (v := r[side][kind][mode].get(q)) is not None]
                summary[f"{name}_{mode}_{q}"] = spread(values) if values else None
    checks = ("gateway_metrics_agree", "runtime_saw_only_misses")
    summary["checks"] = {
        **{name: all(r[CACHED][name] for r in rounds) for name in checks},
        "runtime_saw_every_request": all(r[UNCACHED]["runtime_saw_every_request"] for r in rounds),
        "uncached_header_absent": all(r[UNCACHED]["uncached_header_absent"] for r in rounds),
        "failed_requests": sum(r[f]["failed"] for r in rounds for f in (CACHED, UNCACHED)),
        "wrong_length_answers": sum(r[f]["wrong_length"] for r in rounds for f in (CACHED, UNCACHED)),
        **{k: sum(r["answers"][k] for r in rounds) for k in rounds[0]["answers"]},
    }
    return summary


def routes(runtime_url: str) -> list[dict[str, Any]]:
    ready = [{"type": "Ready", "status": "True", "reason": "Up"}]
    model = {
        "kind": "AIModel",
        "metadata": {"name": "tiny-v1", "namespace": "default"},
        "spec": {"source": {"uri": "/models/tiny"}, "engine": "transformers", "servedModelName": SERVED},
        "status": {"endpoint": runtime_url, "conditions": ready},
    }
    cached = {"model": "tiny-v1", "responseCache": {"enabled": True}}
    return [
        model,
        {"kind": "AIFeature", "metadata": {"name": CACHED, "namespace": "default"}, "spec": cached},
        {"kind": "AIFeature", "metadata": {"name": UNCACHED, "namespace": "default"}, "spec": {"model": "tiny-v1"}},
    ]


class Processes:
    """The bench's own child processes, ended in reverse order of start."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], env: dict[str, str] | None = None, log: Path | None = None) -> None:
        out = log.open("wb") if log else NULL
        self.started.append(subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT))

    def stop(self) -> None:
        stop_processes(list(reversed(self.started)))


def start_redis(tmp: Path, procs: Processes) -> str | None:
    """A redis-server of the bench's own, like tests/gateway's: loopback, no persistence, a password."""
    debian = Path("/usr/bin/redis-server")
    binary = shutil.which("redis-server") or (str(debian) if debian.exists() else None)
    if binary is None:
        return None
    port, password = free_port(), secrets.token_hex(8)
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp)]
    procs.start([*argv, "--save", "", "--appendonly", "no", "--requirepass", password])
    client = redis.Redis(host="127.0.0.1", port=port, password=password, socket_timeout=1)

    def answers() -> bool:
        with contextlib.suppress(redis.ConnectionError):
            return bool(client.ping())
        return False

    try:
        until("redis-server to answer PING", answers, 20)
    finally:
        client.close()
    return f"redis://:{password}@127.0.0.1:{port}/0"


GATEWAY_METRICS: dict[str, str] = {}  # gateway URL -> the base URL of its metrics port
RUNTIME_METRICS: dict[str, str] = {}  # runtime URL -> the base URL of its metrics port


def start_gateway(tmp: Path, procs: Processes, name: str, redis_url: str | None) -> str:
    port, metrics_port = free_port(), free_port()
    argv = [sys.executable, "-m", "servlane_gateway", "--routes-file", str(tmp / "routes.json"), "--host"]
    argv += ["127.0.0.1", "--port", str(port), "--log-level", "warning", "--metrics-port", str(metrics_port)]
    GATEWAY_METRICS[f"http://127.0.0.1:{port}"] = f"http://127.0.0.1:{metrics_port}"
    env = dict(os.environ)
    if redis_url:  # by environment, so the password is not on a command line
        env |= {"SERVLANE_GATEWAY_REDIS_URL": redis_url, "SERVLANE_GATEWAY_REDIS_KEY_PREFIX": "bench"}
    procs.start(argv, env=env, log=tmp / f"gateway-{name}.log")
    return f"http://127.0.0.1:{port}"


def start_runtime(tmp: Path, procs: Processes, model_dir: Path, max_in_flight: int) -> str:
    from servlane_api.runtime_config import RuntimeConfig

    port, metrics_port = free_port(), free_port()
    config = RuntimeConfig(
        model_source=str(model_dir), served_model_name=SERVED, engine="transformers", host="127.0.0.1", port=port,
        metrics_port=metrics_port, max_in_flight=max_in_flight,
    )  # fmt: skip
    (tmp / "runtime.json").write_text(config.to_env_value())
    env = os.environ | {"HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, "-m", "servlane_runtime", "--config", str(tmp / "runtime.json")]
    procs.start(argv, env=env, log=tmp / "runtime.log")
    RUNTIME_METRICS[f"http://127.0.0.1:{port}"] = f"http://127.0.0.1:{metrics_port}"
    return f"http://127.0.0.1:{port}"


def versions() -> dict[str, str]:
    found = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("servlane", "torch", "transformers", "httpx", "uvicorn", "redis"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[dist] = importlib.metadata.version(dist)
    if binary := shutil.which("redis-server"):
        found["redis-server"] = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    return found


def balanced(rounds: int) -> Iterator[tuple[int, list[str]]]:
    """ABBA...: which feature goes first alternates, so drift in the machine's load falls on both."""
    for index in range(rounds):
        yield index, [CACHED, UNCACHED] if index % 2 == 0 else [UNCACHED, CACHED]


def measure(config: str, urls: dict[str, str], sequence: list[tuple[int, bool]], args: argparse.Namespace) -> Any:
    for feature in (CACHED, UNCACHED):  # warm-up: connections, first-call paths, the cache's store
        asyncio.run(run_phase(urls["gateway"], feature, f"[warm-up {config}]", sequence[: args.clients * 2], args))
    rounds = []
    for index, order in balanced(args.rounds):
        prefix = f"[{config} round {index}]"
        record: dict[str, Any] = {"round": index, "order": order}
        outcomes: dict[str, list[Outcome]] = {}
        for feature in order:
            record[feature], outcomes[feature] = phase(urls, feature, prefix, sequence, args)
        record["answers"] = compare(outcomes[CACHED], outcomes[UNCACHED])
        c, u = record[CACHED], record[UNCACHED]
        print(
            f"{config} round {index}: hit rate {c['hit_rate']:.2f} (best {c['best_hit_rate']:.2f}), runtime saw "
            f"{c['runtime_requests']} vs {u['runtime_requests']}, p50 {c['latency']['all']['p50_ms']} vs "
            f"{u['latency']['all']['p50_ms']} ms, wall {c['wall_s']} vs {u['wall_s']} s, {record['answers']}",
            flush=True,
        )
        rounds.append(record)
    return {"rounds": rounds, "summary": summarize(rounds)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=96, help="requests per phase")
    parser.add_argument("--clients", type=int, default=4, help="concurrent closed-loop clients")
    parser.add_argument("--prompts", type=int, default=40, help="distinct prompts")
    parser.add_argument("--zipf", type=float, default=1.1, help="skew: prompt k is drawn with weight 1/k^s")
    parser.add_argument("--stream-share", type=float, default=0.5, help="share of requests streamed")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--max-in-flight", type=int, default=8, help="the runtime's admission limit")
    parser.add_argument("--no-redis", action="store_true", help="skip the shared Redis configuration")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "response_cache.json")
    args = parser.parse_args()
    from servlane_devtools.tiny_model import build_tiny_llama

    sequence = workload(args)
    started = time.monotonic()
    load_at_start = os.getloadavg()
    procs = Processes()
    configurations: dict[str, Any] = {}
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        try:
            runtime = start_runtime(tmp, procs, build_tiny_llama(), args.max_in_flight)
            (tmp / "routes.json").write_text(json.dumps(routes(runtime)))
            gateways = {"memory": start_gateway(tmp, procs, "memory", None)}
            redis_url = None if args.no_redis else start_redis(tmp, procs)
            if redis_url:
                gateways["redis"] = start_gateway(tmp, procs, "redis", redis_url)
            else:
                notes.append("redis: skipped (" + ("--no-redis" if args.no_redis else "no redis-server here") + ")")
            wait_ready(f"{runtime}/ready", timeout=300)
            for gateway in gateways.values():
                wait_ready(f"{gateway}/ready")
            ready_s = round(time.monotonic() - started, 1)
            for config, gateway in gateways.items():
                configurations[config] = measure(config, {"runtime": runtime, "gateway": gateway}, sequence, args)
        except BaseException:
            for log in sorted(tmp.glob("*.log")):
                print(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            raise
        finally:
            procs.stop()
    result = {
        "what": "gateway response cache: a cached feature vs an uncached one of the same AIModel, one gateway "
        "process in front of a real runtime (tiny Llama, transformers engine, CPU), loopback",
        "settings": {k: v for k, v in vars(args).items() if k != "out"}
        | {"distinct_requests_in_sequence": len(set(sequence)), "stream_requests": sum(s for _, s in sequence)},
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_at_start": [round(x, 2) for x in load_at_start],
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
            "note": "2 cores shared with other work (loadavg per phase in each round)",
        },
        "versions": versions(),
        "startup_s": ready_s,
        "total_s": round(time.monotonic() - started, 1),
        "notes": notes,
        "configurations": configurations,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({name: c["summary"] for name, c in configurations.items()}, indent=2))


if __name__ == "__main__":
    main()
