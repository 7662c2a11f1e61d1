"""A larger property-based fuzz of the runtime's and the gateway's OpenAPI schemas than CI runs.

The same harness as tests/fuzz (tests/support/schema_fuzz.py): a real runtime (the transformers or the vLLM engine,
the tiny Llama) and a real gateway in front of it, schemathesis drawing valid and invalid cases for every operation
of each server's /openapi.json, half the bodies naming the real model (their `n` and `max_tokens` capped so
that no case generates more than a bounded number of tokens), /health polled throughout.
Writes the cases tried and the status counts (4xx, 5xx) per server to bench/results/fuzz.json.

Run: .venv/bin/python bench/fuzz_servers.py [--engine transformers|vllm] [--cases-per-operation N] [--seed S]
     [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from servlane_api.runtime_config import RuntimeConfig  # noqa: E402
from tests.support.schema_fuzz import (  # noqa: E402
    CASE_TIMEOUT_SECONDS,
    ENGINES,
    MAX_LIST_ITEMS,
    MAX_MODEL_LEN,
    MAX_TOKENS_CAP,
    N_CAP,
    HealthWatch,
    fuzz,
    servers,
)


def versions() -> dict[str, str]:
    found = {}
    for dist in ("schemathesis", "hypothesis", "fastapi", "starlette", "pydantic", "transformers", "torch"):
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases-per-operation", type=int, default=250, help="per operation and generation mode")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--engine", choices=ENGINES, default="transformers")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "fuzz.json")
    args = parser.parse_args()
    limits = RuntimeConfig(model_source="-", served_model_name="-", engine="transformers")
    report: dict[str, Any] = {
        "what": "schemathesis fuzz of each server's OpenAPI schema, positive and negative cases, real processes",
        "settings": {
            "cases_per_operation_and_mode": args.cases_per_operation,
            "seed": args.seed,
            "engine": f"{args.engine} (tiny Llama, CPU, the engine's defaults)",
            "max_model_len": MAX_MODEL_LEN,
            "max_body_bytes": limits.max_body_bytes,
            "max_json_depth": limits.max_json_depth,
            "max_list_items": {"runtime": MAX_LIST_ITEMS, "gateway": limits.max_list_items},
            "real_model_bodies_capped": {"n": N_CAP, "max_tokens": MAX_TOKENS_CAP},
            "case_timeout_seconds": CASE_TIMEOUT_SECONDS,
        },
        "versions": versions(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "servers": {},
    }
    with servers(args.engine) as both, HealthWatch(both) as watch:
        for server in both:
            started = time.monotonic()
            result = fuzz(server, args.cases_per_operation, seed=args.seed)
            report["servers"][server.name] = result.as_json() | {"seconds": round(time.monotonic() - started, 1)}
            print(server.name, json.dumps(report["servers"][server.name]), flush=True)
    report["health"] = watch.as_json()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    failed = any(s["5xx"] for s in report["servers"].values()) or watch.failures
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
