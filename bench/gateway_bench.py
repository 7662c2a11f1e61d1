"""The gateway's added latency and throughput against the backend called directly, and against a peer router.

Every target fronts the same fast stub backend (a bare ASGI app on uvicorn with uvloop + httptools,
started by this script with `--serve-stub`), so the difference to `direct` is what the router adds:
  - direct:  the stub itself
  - gateway: `python -m servlane_gateway --routes-file ...` (its default worker count: one
    process per usable CPU, 2 on the development machine; settings.gateway_workers records it)
  - litellm: LiteLLM's proxy (`litellm --config ...`, one worker), when `--litellm BIN` is given
    (install it outside the project venv: `python3.11 -m venv /tmp/litellm-venv &&
    /tmp/litellm-venv/bin/pip install 'litellm[proxy]'`).
  - vllm-router: vLLM production stack's Rust router (`vllm-router --worker-urls STUB --policy round_robin`),
    when `--vllm-router BIN` is given (`python3.11 -m venv /tmp/vllm-router-venv &&
    /tmp/vllm-router-venv/bin/pip install vllm-router==0.1.17`).
Load comes from `wrk` (C, keep-alive, one thread) with a Lua script for the POST body, or where wrk is not
installed (or with `--loadgen python`) from bench/loadgen.py (asyncio on uvloop, raw keep-alive HTTP/1.1,
its own process); on a 2-core machine either shares the CPUs with the stub and the router. For each mode
(non-streamed / streamed chat completion) and each concurrency (1, 64, 256), every round runs all targets in
a balanced random order (each round a rotation of a shuffled order, so every target runs in every position
about equally often), `--rounds` rounds; each cell keeps every round and their median, min and max. The
load generator times the whole response (for streams: until [DONE]). Writes bench/results/gateway.json.
Run: `.venv/bin/python bench/gateway_bench.py --vllm-router /tmp/vllm-router-venv/bin/vllm-router [--rounds 5]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `bench` is its folder
from bench.machine_load import cpu_times, shares, steal_summary
from servlane_api import metric_names as contract
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}
STREAM_CHUNKS = 8
NULL = subprocess.DEVNULL
API_KEY = "sk-bench-5f0c1d2e3a4b5c6d7e8f90a1b2c3d4e5"  # both routers check it (the gateway via a keys file)
_ANSWER = {
    "id": "chatcmpl-stub",
    "object": "chat.completion",
    "created": 0,
    "model": "stub",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


def _chunk(content: str, finish: str | None) -> bytes:
    delta = {"content": content} if content else {}
    event = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 0, "model": "stub"}
    event["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
    return b"data: " + json.dumps(event).encode() + b"\n\n"


ANSWER_BYTES = json.dumps(_ANSWER).encode()
STREAM_EVENTS = [_chunk("tok ", None) for _ in range(STREAM_CHUNKS)] + [_chunk("", "stop"), b"data: [DONE]\n\n"]


async def stub_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A bare ASGI OpenAI stub: a fixed answer, or a fixed stream of chunks when the body says stream."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] in ("/health", "/ready"):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})
    elif b'"stream": true' in body or b'"stream":true' in body:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for event in STREAM_EVENTS:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    else:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER_BYTES)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": ANSWER_BYTES})


def stop_processes(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each bench process, then SIGKILL what is still there after 15 s."""
    for process in processes:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()


def wait_ready(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def routes(stub_url: str) -> list[dict[str, Any]]:
    model = {
        "kind": "AIModel",
        "metadata": {"name": "chat-v1", "namespace": "default"},
        "spec": {"source": {"uri": "/models/x"}, "engine": "transformers", "servedModelName": "stub"},
        "status": {"endpoint": stub_url, "conditions": [{"type": "Ready", "status": "True", "reason": "Up"}]},
    }
    feature = {"kind": "AIFeature", "metadata": {"name": "chat", "namespace": "default"}, "spec": {"model": "chat-v1"}}
    return [model, feature]


def litellm_config(stub_url: str) -> str:
    return (
        "model_list:\n"
        "  - model_name: chat\n"
        "    litellm_params:\n"
        "      model: openai/stub\n"
        f"      api_base: {stub_url}/v1\n"
        "      api_key: unused\n"
        "general_settings:\n"
        f"  master_key: {API_KEY}\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "  drop_params: true\n"
    )


def wrk_script(body: dict[str, Any]) -> str:
    return (
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(json.dumps(body))}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {API_KEY}"\n'
    )


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def _ms(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
    return float(number) * _UNITS[unit]


def parse_wrk(output: str) -> dict[str, float]:
    result: dict[str, float] = {}
    for pct in ("50", "99"):
        found = re.search(rf"^\s+{pct}(?:\.000)?%\s+(\S+)", output, re.MULTILINE)
        if found:
            result[f"p{pct}_ms"] = _ms(found.group(1))
    rps = re.search(r"Requests/sec:\s+([\d.]+)", output)
    result["rps"] = float(rps.group(1)) if rps else 0.0
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    result["non_2xx"] = float(non2xx.group(1)) if non2xx else 0.0
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    result["socket_errors"] = float(sum(int(g) for g in errors.groups())) if errors else 0.0
    total = re.search(r"(\d+) requests in", output)
    result["requests"] = float(total.group(1)) if total else 0.0
    if result["requests"] == 0:  # nothing finished within the run: wrk prints 0 latencies, which are not
        result.pop("p50_ms", None)
        result.pop("p99_ms", None)
    return result


def settle(url: str, stream: bool) -> None:
    """One request through the target before a run: a router still working off the previous run's backlog
    (requests wrk gave up on) answers it only after that backlog, so the next run starts on an idle target."""
    body = CHAT | {"stream": True} if stream else CHAT
    headers = {"authorization": f"Bearer {API_KEY}"}
    httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=300).raise_for_status()


def run_wrk(url: str, script: Path, connections: int, seconds: float) -> dict[str, float]:
    command = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "10s", "--latency", "-s", str(script)]
    done = subprocess.run([*command, f"{url}/v1/chat/completions"], capture_output=True, text=True, check=True)
    return parse_wrk(done.stdout)


def run_python_loadgen(url: str, body: dict[str, Any], connections: int, seconds: float) -> dict[str, Any]:
    """bench/loadgen.py in its own process: wrk's fields, plus status counts, body bytes and SSE events."""
    command = [sys.executable, str(Path(__file__).with_name("loadgen.py")), "closed", "--url",
               f"{url}/v1/chat/completions", "--body", json.dumps(body), "--api-key", API_KEY,
               "--connections", str(connections), "--seconds", str(seconds)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process and its live children (all their threads) from /proc/<pid>/stat: a
    target with worker processes (the gateway's, vllm-router's none) is counted whole."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat(int(entry.name))
        except (OSError, ValueError):
            continue  # gone meanwhile
        if int(entry.name) == pid or int(fields[1]) == pid:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def gateway_workers() -> str:
    """How many processes the gateway serves from here, at its default (--workers 0)."""
    from servlane_gateway.settings import GatewaySettings
    from servlane_gateway.workers import read_cpu_limit, usable_cpus, worker_count

    count, why = worker_count(GatewaySettings(routes_file=Path("routes.json")), read_cpu_limit(), usable_cpus())
    return f"{count} (the default: {why})"


def balanced_orders(names: list[str], rounds: int, rng: random.Random) -> list[list[str]]:
    """One order per round: rotations of a shuffled order (reversed every other cycle), shuffled over rounds,
    so each target runs first, middle and last about equally often and no target is always next to the same one."""
    base = names[:]
    rng.shuffle(base)
    orders = []
    for r in range(rounds):
        shift = r % len(base)
        order = base[shift:] + base[:shift]
        orders.append(order[::-1] if (r // len(base)) % 2 else order)
    rng.shuffle(orders)
    return orders


SUMMARY_KEYS = ("p50_ms", "p99_ms", "rps", "requests", "non_2xx", "socket_errors", "target_cores",
                "target_cpu_ms_per_request")  # fmt: skip


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over rounds of each field (the cell's headline), with min and max, and every round."""
    summary: dict[str, Any] = {}
    for key in SUMMARY_KEYS:
        values = [r[key] for r in rounds if key in r]
        if values and (key not in ("p50_ms", "p99_ms") or len(values) == len(rounds)):
            summary[key] = statistics.median(values)
            summary[f"{key}_range"] = [min(values), max(values)]
    summary["rounds"] = rounds
    return summary


def same_work(row: dict[str, Any]) -> dict[str, Any]:
    """Did every target answer only 200s, with the same body bytes and SSE events per request as direct's?"""
    check: dict[str, Any] = {}
    for name, cell in row.items():
        done = [r for r in cell["rounds"] if r.get("requests")]
        if not done or "statuses" not in done[0]:
            continue
        requests = sum(r["requests"] for r in done)
        check[name] = {
            "only_200": all(set(r["statuses"]) == {"200"} and not r["socket_errors"] for r in done),
            "body_bytes_per_request": round(sum(r["body_bytes"] for r in done) / requests, 1),
            "events_per_request": round(sum(r["events"] for r in done) / requests, 2),
        }
    return check


def self_reported_added_latency(metrics_url: str) -> dict[str, float]:
    text = httpx.get(metrics_url).text
    for family in text_string_to_metric_families(text):
        if family.name == contract.ADDED_LATENCY:
            samples = {s.name: s.value for s in family.samples if not s.name.endswith("_bucket")}
            count = samples[f"{contract.ADDED_LATENCY}_count"]
            return {"count": count, "mean_ms": 1000 * samples[f"{contract.ADDED_LATENCY}_sum"] / max(count, 1)}
    return {}


GATEWAY_METRICS: dict[str, str] = {}  # gateway URL -> its /metrics URL (on the metrics port)


def start_processes(
    tmp: Path, litellm: str | None, gateway_src: Path | None, vllm_router: str | None = None
) -> tuple[dict[str, str], list[subprocess.Popen[bytes]]]:
    paths = [str(ROOT / layer) for layer in ("api", "core", "gateway")]
    env = os.environ | {"PYTHONPATH": os.pathsep.join(paths)}
    # Another version of the gateway package (e.g. `git archive` of an older commit) for before/after runs.
    gw_env = env | {"PYTHONPATH": os.pathsep.join([str(gateway_src), *paths])} if gateway_src else env
    stub_port, gw_port, gw_metrics_port = free_port(), free_port(), free_port()
    urls = {"direct": f"http://127.0.0.1:{stub_port}", "gateway": f"http://127.0.0.1:{gw_port}"}
    GATEWAY_METRICS[urls["gateway"]] = f"http://127.0.0.1:{gw_metrics_port}/metrics"  # a port of its own
    (tmp / "routes.json").write_text(json.dumps(routes(urls["direct"])))
    (tmp / "keys").write_text(f"bench: {API_KEY}\n")
    processes = [
        subprocess.Popen([sys.executable, __file__, "--serve-stub", str(stub_port)], env=env, stdout=NULL, stderr=NULL),
        subprocess.Popen(
            [sys.executable, "-m", "servlane_gateway", "--routes-file", str(tmp / "routes.json"),
             "--keys-file", str(tmp / "keys"), "--host", "127.0.0.1", "--port", str(gw_port), "--log-level", "warning",
             "--metrics-port", str(gw_metrics_port)],
            env=gw_env, stdout=NULL, stderr=NULL,
        ),
    ]  # fmt: skip
    if litellm:
        lite_port = free_port()
        urls["litellm"] = f"http://127.0.0.1:{lite_port}"
        (tmp / "litellm.yaml").write_text(litellm_config(urls["direct"]))
        lite_env = os.environ | {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
        processes.append(
            subprocess.Popen(
                [litellm, "--config", str(tmp / "litellm.yaml"), "--host", "127.0.0.1", "--port", str(lite_port),
                 "--num_workers", "1"],
                env=lite_env, stdout=open(tmp / "litellm.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
            )
        )  # fmt: skip
    if vllm_router:
        router_port = free_port()
        urls["vllm-router"] = f"http://127.0.0.1:{router_port}"
        processes.append(start_vllm_router(vllm_router, urls["direct"], router_port, tmp / "vllm-router.log"))
    return urls, processes


def start_vllm_router(binary: str, worker_url: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    """vllm-router in front of the one stub, at its defaults but the log level (its info log writes a line per
    request). It forwards the client's Authorization header to the worker and checks no key of its own."""
    return subprocess.Popen(
        [binary, "--worker-urls", worker_url, "--policy", "round_robin", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning"],
        stdout=open(log, "wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip


def package_version(binary: str, package: str) -> str:
    python = Path(binary).parent / "python"
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True).stdout.strip()


def code_version() -> dict[str, Any]:
    """The commit, and the files of the layers the gateway runs from that differ from it (others may be
    editing the tree while a benchmark runs: the numbers belong to the tree as it was)."""
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    status = subprocess.run([*git, "status", "--porcelain", "api", "core", "gateway"], capture_output=True, text=True)
    return {"commit": commit, "uncommitted": status.stdout.splitlines()}


def litellm_version(litellm: str) -> str:
    return package_version(litellm, "litellm")


def added_latency(runs: dict[str, Any]) -> dict[str, Any]:
    """Each router's p50/p99 minus the direct call's, per mode and concurrency (where both finished)."""
    added: dict[str, Any] = {}
    for mode, by_conc in runs.items():
        for conc, row in by_conc.items():
            cell = added.setdefault(mode, {}).setdefault(conc, {})
            for name, measured in row.items():
                for q in ("p50_ms", "p99_ms"):
                    if name != "direct" and measured.get("requests") and q in measured and q in row["direct"]:
                        cell[f"{name}_{q}"] = measured[q] - row["direct"][q]
    return added


def _span(row: dict[str, Any], key: str, fmt: str) -> str:
    low, high = row[f"{key}_range"]
    return f"{row[key]:{fmt}} ({low:{fmt}}-{high:{fmt}})"


def _cell(row: dict[str, Any] | None) -> str:
    if not row:
        return "—"
    if "p50_ms" not in row or not row.get("requests"):
        return f"none finished in the run ({row['rps']:.0f} req/s)"
    if "p50_ms_range" in row:  # several rounds: median (min-max)
        return f"{_span(row, 'p50_ms', '.2f')} / {_span(row, 'p99_ms', '.1f')} / {_span(row, 'rps', '.0f')}"
    return f"{row['p50_ms']:.2f} / {row['p99_ms']:.1f} / {row['rps']:.0f}"


def ratio_per_round(row: dict[str, Any], target: str, peer: str) -> list[float]:
    """`target`'s requests/s over `peer`'s, round by round (the same round ran both, in balanced order)."""
    by_round = {r["round"]: r["rps"] for r in row[peer]["rounds"]}
    return [r["rps"] / by_round[r["round"]] for r in row[target]["rounds"] if by_round.get(r["round"])]


def render_table(result: dict[str, Any]) -> str:
    """Markdown: p50 ms / p99 ms / requests per second per target (median over rounds, min-max), the
    gateway's requests/s over vllm-router's per round when it ran, the earlier gateway if embedded, and the
    CPU time the VM lost to its neighbours (steal) over the rounds when it was recorded."""
    targets = list(next(iter(next(iter(result["runs"].values())).values())))
    before = result.get("before", {}).get("runs", {})
    peer = "vllm-router" if "vllm-router" in targets else None
    header = ["mode", "clients", *targets]
    header += ["gateway ÷ vllm-router req/s, per round"] if peer else []
    header += ["gateway before"] if before else []
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for mode, by_conc in result["runs"].items():
        for conc, row in by_conc.items():
            cells = [mode, conc, *(_cell(row.get(t)) for t in targets)]
            if peer:
                ratios = ratio_per_round(row, "gateway", peer)
                cells.append(f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
            if before:
                cells.append(_cell(before.get(mode, {}).get(conc, {}).get("gateway")))
            lines.append("| " + " | ".join(cells) + " |")
    runs = [run for by_conc in result["runs"].values() for row in by_conc.values() for t in targets
            for run in row[t]["rounds"]]  # fmt: skip
    if (steal := steal_summary(runs)) is not None:
        lines.append("\n" + steal)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve-stub", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--table", type=Path, help="print a result file as a markdown table, and exit")
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="seed of the balanced random order")
    parser.add_argument("--loadgen", choices=["auto", "wrk", "python"], default="auto",
                        help="auto: wrk if installed, else bench/loadgen.py")  # fmt: skip
    parser.add_argument("--concurrency", default="1,64,256")
    parser.add_argument("--litellm", help="path of the `litellm` CLI (a venv outside the project)")
    parser.add_argument("--vllm-router", help="path of the `vllm-router` CLI (a venv outside the project)")
    parser.add_argument("--gateway-src", type=Path, help="a folder holding another servlane_gateway package")
    parser.add_argument("--before", type=Path, help="an earlier result (e.g. with --gateway-src) to embed")
    parser.add_argument("--label", default="", help="free text stored with the results (e.g. the code version)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gateway.json")
    args = parser.parse_args()
    if args.table:
        print(render_table(json.loads(args.table.read_text())))
        return
    if args.serve_stub:
        import uvicorn

        uvicorn.run(stub_app, host="127.0.0.1", port=args.serve_stub, loop="uvloop", http="httptools",
                    log_level="warning", access_log=False)  # fmt: skip
        return
    use_wrk = args.loadgen == "wrk" or (args.loadgen == "auto" and shutil.which("wrk") is not None)
    if use_wrk and shutil.which("wrk") is None:
        sys.exit("wrk not found: apt-get install wrk (or --loadgen python)")
    levels = [int(c) for c in args.concurrency.split(",")]
    rng = random.Random(args.seed)
    started = time.time()
    code = code_version()
    loadavg: list[dict[str, Any]] = []
    same: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        urls, processes = start_processes(tmp, args.litellm, args.gateway_src, args.vllm_router)
        pids = {name: process.pid for name, process in zip(urls, processes, strict=True)}  # started in this order
        try:
            wait_ready(f"{urls['direct']}/health")
            wait_ready(f"{urls['gateway']}/ready")
            if "litellm" in urls:
                wait_ready(f"{urls['litellm']}/health/liveliness")
            if "vllm-router" in urls:
                wait_ready(f"{urls['vllm-router']}/health")
            bodies = {"plain": CHAT, "stream": CHAT | {"stream": True}}
            scripts = {"plain": tmp / "plain.lua", "stream": tmp / "stream.lua"}
            for mode, body in bodies.items():
                scripts[mode].write_text(wrk_script(body))

            def load(url: str, mode: str, connections: int, seconds: float) -> dict[str, Any]:
                if use_wrk:
                    return run_wrk(url, scripts[mode], connections, seconds)
                return run_python_loadgen(url, bodies[mode], connections, seconds)

            for url in urls.values():  # warm-up: connections, imports, first-call paths
                for mode in bodies:
                    load(url, mode, 4, 1)
            runs: dict[str, dict[str, dict[str, Any]]] = {}
            for mode in bodies:
                for connections in levels:
                    cell_rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in urls}
                    for number, order in enumerate(balanced_orders(list(urls), args.rounds, rng)):
                        for name in order:
                            settle(urls[name], mode == "stream")
                            cpu = cpu_seconds(pids[name])  # the target idles while the load generator starts
                            machine = cpu_times()
                            measured = load(urls[name], mode, connections, args.seconds)
                            busy = cpu_seconds(pids[name]) - cpu
                            measured |= {
                                "target_cores": busy / args.seconds,
                                "target_cpu_ms_per_request": 1000 * busy / max(measured["requests"], 1),
                                "cpu_shares": shares(machine, cpu_times()),  # steal: the VM's neighbours
                            }
                            measured |= {"round": number, "position": order.index(name), "loadavg": os.getloadavg()}
                            cell_rounds[name].append(measured)
                            print(mode, connections, number, name, {k: measured.get(k) for k in SUMMARY_KEYS},
                                  flush=True)  # fmt: skip
                        loadavg.append({"mode": mode, "clients": connections, "round": number,
                                        "loadavg": os.getloadavg()})  # fmt: skip
                    row = runs.setdefault(mode, {})[str(connections)] = {
                        name: summarize(measured) for name, measured in cell_rounds.items()
                    }
                    same.setdefault(mode, {})[str(connections)] = same_work(row)
            self_reported = self_reported_added_latency(GATEWAY_METRICS[urls["gateway"]])
        finally:
            stop_processes(processes)
    added = added_latency(runs)
    peer = {"litellm": litellm_version(args.litellm)} if args.litellm else {}
    if args.vllm_router:
        peer["vllm-router"] = package_version(args.vllm_router, "vllm-router")
    loadgen = "wrk -t1" if use_wrk else "bench/loadgen.py (one asyncio/uvloop process, raw HTTP/1.1 keep-alive)"
    result = {
        "what": f"router vs direct stub backend, loopback, chat completions, {loadgen} (whole response timed); "
        "each cell: the median over rounds, [min, max] in *_range, every round under rounds",
        "label": args.label,
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_at_end": os.getloadavg(),
            "loadavg_per_round": loadavg,
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "settings": {
            "gateway_workers": gateway_workers(),
            "seconds_per_run": args.seconds,
            "rounds": args.rounds,
            "order": "balanced random (rotations of a shuffled order per cell), seed " + str(args.seed),
            "loadgen": loadgen,
            "concurrency": levels,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "wall_seconds": round(time.time() - started, 1),
        },
        "code": code,
        "seconds_per_run": args.seconds,
        "peer": peer,
        "runs": runs,
        "same_work": same,
        "added_ms": added,
        "gateway_self_reported_added_latency": self_reported,
    }
    if args.before:
        earlier = json.loads(args.before.read_text())
        result["before"] = {key: earlier[key] for key in ("label", "machine", "runs")}
        result["before"]["added_ms"] = added_latency(earlier["runs"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(added, indent=2))


if __name__ == "__main__":
    main()
