"""The runtime's own start in a container shaped like the model's pod, the image's code against this tree's (#30
item 4): before/after for a change to the runtime, measured in one run without rebuilding the image.

Each round starts `ghcr.io/servlane/runtime:0.1.0-cpu` with Docker as the operator's pod runs it (1.5 CPUs, the
root filesystem read-only, /tmp and the cache as tmpfs, the tiny Llama mounted read-only, the same runtime
configuration), once with the image's own servlane_runtime (`image`) and once with this tree's runtime/ mounted
over it (`tree`, by PYTHONPATH), in alternating order; it records the time from `docker run` to the first token
of a one-token chat completion (asked every 0.1 s) and the runtime's own steps (GET /startup). Results go to
bench/results/cold_start.json under `runtime_in_a_container`.

    .venv/bin/python -m bench.cold_start_container --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.machine_load import cpu_times, shares
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "cold_start.json"
IMAGE = "ghcr.io/servlane/runtime:0.1.0-cpu"
CPUS = "1.5"
STEPS = ("imports_done", "weights_fetched", "engine_loaded", "ready", "first_token")


def first_token(base: str, started: float, deadline: float = 180) -> float:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1, "temperature": 0}
    with httpx.Client(timeout=httpx.Timeout(60, connect=1), trust_env=False) as http:
        while time.time() - started < deadline:
            try:
                if http.post(f"{base}/v1/chat/completions", json=body).status_code == 200:
                    return time.time() - started
            except httpx.TransportError:
                pass
            time.sleep(0.1)  # the client's retry period
    raise RuntimeError(f"no first token at {base} within {deadline}s")


def one_start(model: Path, variant: str) -> dict[str, Any]:
    port, metrics_port = free_port(), free_port()
    config = {
        "model_source": "/mnt/models/tiny",
        "served_model_name": "tiny",
        "engine": "transformers",
        "max_model_len": 256,
        "port": port,
        "metrics_port": metrics_port,
    }
    name = f"cold-start-{variant}-{port}"
    command = ["docker", "run", "-d", "--rm", "--name", name, "--network", "host", "--cpus", CPUS, "--read-only"]
    command += ["--tmpfs", "/tmp", "--tmpfs", "/var/cache/servlane", "-v", f"{model}:/mnt/models/tiny:ro"]
    command += ["-e", "HF_HUB_OFFLINE=1", "-e", "SERVLANE_RUNTIME_CONFIG=" + json.dumps(config)]
    if variant == "tree":
        command += ["-v", f"{ROOT / 'runtime' / 'servlane_runtime'}:/override/servlane_runtime:ro"]
        command += ["-e", "PYTHONPATH=/override"]
    before = cpu_times()
    started = time.time()
    subprocess.run([*command, IMAGE], check=True, capture_output=True)
    try:
        seconds = first_token(f"http://127.0.0.1:{port}", started)
        phases = httpx.get(f"http://127.0.0.1:{metrics_port}/startup", timeout=5).json()["phases"]
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
    at = {k: round(v - phases["process_start"], 2) for k, v in phases.items()}
    return {
        "run_to_first_token": round(seconds, 2),
        "since_process_start": at,
        "cpu_shares": shares(before, cpu_times()),
    }


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 2), "min": min(values), "max": max(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from servlane_devtools.tiny_model import build_tiny_llama

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        shutil.copytree(build_tiny_llama(), model)
        for path in [Path(tmp), model, *model.rglob("*")]:  # readable by the runtime's uid
            path.chmod(0o755 if path.is_dir() else 0o644)
        runs: dict[str, list[dict[str, Any]]] = {"image": [], "tree": []}
        for i in range(args.rounds):
            order = ["image", "tree"] if i % 2 == 0 else ["tree", "image"]
            for variant in order:
                run = one_start(model, variant)
                print(variant, json.dumps(run), flush=True)
                runs[variant].append({"round": i, **run})
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    image_id = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", IMAGE], capture_output=True, text=True
    )
    result: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "method": __doc__.split("\n\n")[1].replace("\n", " ") if __doc__ else "",
        "image": IMAGE,
        "image_id": image_id.stdout.strip(),
        "commit": commit.stdout.strip(),
        "cpus": CPUS,
        "machine_cpus": os.cpu_count(),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        "rounds": args.rounds,
        "variants": {
            variant: {
                "run_to_first_token_seconds": summary([r["run_to_first_token"] for r in done]),
                "since_process_start_seconds": {
                    step: summary([r["since_process_start"][step] for r in done]) for step in STEPS
                },
                "runs": done,
            }
            for variant, done in runs.items()
        },
    }
    for variant, got in result["variants"].items():
        print(variant, got["run_to_first_token_seconds"], got["since_process_start_seconds"]["engine_loaded"])
    stored = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    stored["runtime_in_a_container"] = result
    RESULTS.write_text(json.dumps(stored, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
