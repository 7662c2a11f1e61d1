"""Where a proxied request's CPU goes: the server layer and sockets, or the gateway's own work.

Every target fronts the same stub (bench/gateway_bench.py --serve-stub) and gets the same closed-loop load
(bench/loadgen.py, `--connections` keep-alive connections). For each, the CPU time its process tree used
(user and system, from /proc) is divided by the requests it answered:
  - minimal-uvicorn: bench/minimal_proxy.py on uvicorn with the gateway's own protocol (ServlaneHttpProtocol) and
    its upstream client: the gateway's server layer with none of its features;
  - minimal-raw: the same proxy with no ASGI server at all (bench/minimal_proxy.py's RawProxyProtocol: httptools
    parses, one task per request, one write per answer): the least a Python server layer can cost;
  - minimal-granian: the same proxy on Granian's RSGI interface (its HTTP layer in Rust), when `--granian BIN`
    is given (`python3.11 -m venv /tmp/granian-venv && /tmp/granian-venv/bin/pip install granian uvloop
    httptools`); one worker, one runtime thread;
  - gateway: `python -m servlane_gateway` with a keys file and a routes file, one worker (the CPU per request
    does not depend on the worker count; throughput does, so compare CPU here, and throughput in
    bench/gateway_bench.py at the default worker count);
  - gateway-before: the gateway of another checkout (`--before DIR`, e.g. `git worktree add --detach DIR REV`),
    with that checkout's layers, for an A/B in the same rounds;
  - vllm-router: the peer, when `--vllm-router BIN` is given (as in bench/gateway_bench.py).
Rounds run every target in a rotated order. Writes bench/results/server_layer.json.
"""

from __future__ import annotations

import argparse
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.gateway_bench import API_KEY, CHAT, code_version, package_version, routes, start_vllm_router
from bench.machine_load import cpu_times, shares
from tests.support.polling import wait_until
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
TICK = os.sysconf("SC_CLK_TCK")
NULL = subprocess.DEVNULL


def tree_cpu(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of `pid` and its descendants (their threads included)."""
    user = system = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        user += int(fields[11]) / TICK
        system += int(fields[12]) / TICK
        pending += [int(c) for c in children]
    return user, system


def wait_answering(url: str, deadline_s: float = 60) -> None:
    wait_until(
        f"{url} to answer",
        lambda: httpx.get(url, timeout=1).status_code,
        timeout=deadline_s,
        interval=0.1,
        tolerate=lambda exc: isinstance(exc, httpx.HTTPError),
    )


def layers(root: Path) -> str:
    return os.pathsep.join(str(root / layer) for layer in ("api", "core", "web", "gateway"))


def gateway_command(tmp: Path, port: int) -> list[str]:
    return [sys.executable, "-m", "servlane_gateway", "--routes-file", str(tmp / "routes.json"), "--keys-file",
            str(tmp / "keys"), "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(free_port()),
            "--log-level", "warning", "--workers", "1"]  # fmt: skip


def start_targets(
    tmp: Path, stub: str, granian: str | None, router: str | None, before: Path | None = None
) -> dict[str, tuple[int, Any]]:
    env = os.environ | {"PYTHONPATH": f"{BENCH}{os.pathsep}{layers(ROOT)}", "MINIMAL_PROXY_UPSTREAM": stub}
    targets: dict[str, tuple[int, Any]] = {}
    port = free_port()
    command = [sys.executable, str(BENCH / "minimal_proxy.py"), "uvicorn", str(port)]
    targets["minimal-uvicorn"] = (port, subprocess.Popen(command, env=env, stdout=NULL, stderr=NULL))
    port = free_port()
    command = [sys.executable, str(BENCH / "minimal_proxy.py"), "raw", str(port)]
    targets["minimal-raw"] = (port, subprocess.Popen(command, env=env, stdout=NULL, stderr=NULL))
    if granian:
        port = free_port()
        command = [granian, "--interface", "rsgi", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                   "--runtime-threads", "1", "--loop", "uvloop", "--log-level", "warning", "--no-ws",
                   "minimal_proxy:rsgi_app"]  # fmt: skip
        targets["minimal-granian"] = (port, subprocess.Popen(command, env=env, cwd=BENCH, stdout=NULL, stderr=NULL))
    (tmp / "routes.json").write_text(json.dumps(routes(stub)))
    (tmp / "keys").write_text(f"bench: {API_KEY}\n")
    port = free_port()
    targets["gateway"] = (port, subprocess.Popen(gateway_command(tmp, port), env=env, stdout=NULL, stderr=NULL))
    if before is not None:
        port = free_port()
        before_env = env | {"PYTHONPATH": layers(before)}
        process = subprocess.Popen(gateway_command(tmp, port), env=before_env, stdout=NULL, stderr=NULL)
        targets["gateway-before"] = (port, process)
    if router:
        port = free_port()
        targets["vllm-router"] = (port, start_vllm_router(router, stub, port, tmp / "vllm-router.log"))
    for name, (port, _) in targets.items():
        path = "/health" if name.startswith("gateway") else "/"
        wait_answering(f"http://127.0.0.1:{port}{path}")
    return targets


def measure(name: str, port: int, pid: int, connections: int, seconds: float) -> dict[str, Any]:
    user0, sys0 = tree_cpu(pid)
    machine0 = cpu_times()
    command = [sys.executable, str(BENCH / "loadgen.py"), "closed", "--url",
               f"http://127.0.0.1:{port}/v1/chat/completions", "--body", json.dumps(CHAT), "--api-key", API_KEY,
               "--connections", str(connections), "--seconds", str(seconds)]  # fmt: skip
    out = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    user1, sys1 = tree_cpu(pid)
    requests = max(int(out["requests"]), 1)
    return {
        "rps": round(out["rps"], 1),
        "requests": requests,
        "non_2xx": out["non_2xx"],
        "socket_errors": out["socket_errors"],
        "body_bytes": out["body_bytes"],
        "cpu_us_per_request": round((user1 - user0 + sys1 - sys0) / requests * 1e6, 1),
        "user_us_per_request": round((user1 - user0) / requests * 1e6, 1),
        "system_us_per_request": round((sys1 - sys0) / requests * 1e6, 1),
        "p50_ms": round(out["p50_ms"], 3),
        "cpu_shares": shares(machine0, cpu_times()),
    }


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {"rounds": rounds}
    for key in ("rps", "cpu_us_per_request", "user_us_per_request", "system_us_per_request"):
        values = [r[key] for r in rounds]
        summary[key] = {"median": round(statistics.median(values), 1), "min": min(values), "max": max(values)}
    return summary


def ratios(runs: dict[str, list[dict[str, Any]]], peer: str) -> dict[str, Any]:
    """Per round, each target's CPU per request and requests/s over the peer's in the same round."""
    out: dict[str, Any] = {}
    for name, rounds in runs.items():
        if name == peer:
            continue
        cpu = [r["cpu_us_per_request"] / p["cpu_us_per_request"] for r, p in zip(rounds, runs[peer], strict=True)]
        rps = [r["rps"] / p["rps"] for r, p in zip(rounds, runs[peer], strict=True)]
        out[name] = {
            "cpu_per_request": {"median": round(statistics.median(cpu), 2), "min": round(min(cpu), 2),
                                "max": round(max(cpu), 2)},
            "rps": {"median": round(statistics.median(rps), 2), "min": round(min(rps), 2), "max": round(max(rps), 2)},
        }  # fmt: skip
    return out


def before_commit(checkout: Path) -> str:
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or str(checkout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--granian", help="path of the `granian` CLI (a venv outside the project)")
    parser.add_argument("--vllm-router", help="path of the `vllm-router` CLI (a venv outside the project)")
    parser.add_argument("--before", type=Path, help="another checkout whose gateway runs beside (gateway-before)")
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "server_layer.json")
    args = parser.parse_args()
    stub_port = free_port()
    stub = f"http://127.0.0.1:{stub_port}"
    serve_stub = [sys.executable, str(BENCH / "gateway_bench.py"), "--serve-stub", str(stub_port)]
    processes = [subprocess.Popen(serve_stub, stdout=NULL, stderr=NULL)]
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            wait_answering(stub + "/")
            targets = start_targets(Path(tmp), stub, args.granian, args.vllm_router, args.before)
            processes += [proc for _, proc in targets.values()]
            names = list(targets)
            for round_no in range(args.rounds):
                shift = round_no % len(names)
                for name in names[shift:] + names[:shift]:
                    port, proc = targets[name]
                    result = measure(name, port, proc.pid, args.connections, args.seconds)
                    runs.setdefault(name, []).append({"round": round_no, **result})
                print(f"bench: round {round_no + 1}/{args.rounds} done", flush=True)
        finally:
            for proc in processes:
                proc.terminate()
    versions = {"python": platform.python_version()}
    if args.granian:
        versions["granian"] = package_version(args.granian, "granian")
    if args.vllm_router:
        versions["vllm-router"] = package_version(args.vllm_router, "vllm-router")
    report = {
        "what": "CPU per proxied chat request (user + system of each server's processes) and requests/s, same load",
        "label": args.label,
        "code": code_version(),
        "before": before_commit(args.before) if args.before else None,
        "settings": {
            "connections": args.connections,
            "seconds": args.seconds,
            "rounds": args.rounds,
            "order": "each round runs every target, order rotated",
            "gateway_workers": 1,
            "loadgen": "bench/loadgen.py (one asyncio/uvloop process)",
        },
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "versions": versions},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "targets": {name: summarise(rounds) for name, rounds in runs.items()},
    }
    if "vllm-router" in runs:
        report["over_vllm_router"] = ratios(runs, "vllm-router")
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for name, summary in report["targets"].items():
        print(f"{name:16} {summary['rps']} req/s, {summary['cpu_us_per_request']} us CPU per request")
    print(f"bench: wrote {args.out}")


if __name__ == "__main__":
    main()
