"""Canary rollback timing with every real piece (control plane, operator, Prometheus, gateway, runtimes).

Runs the rollback scenario of e2e/test_canary_full.py, which kills the canary's runtime mid-canary
and measures the time from the first failed client request to all traffic on the stable, and how many
client requests failed meanwhile; writes them to bench/results/canary.json.

    .venv/bin/python bench/canary_bench.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "canary.json"
SCENARIO = "e2e/test_canary_full.py::test_a_canary_whose_runtime_dies_is_rolled_back"


def main() -> int:
    partial = RESULTS.with_suffix(".json.tmp")
    env = {**os.environ, "CANARY_RESULTS": str(partial)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", SCENARIO], cwd=ROOT, env=env, check=False)
    if run.returncode != 0 or not partial.is_file():
        print(f"the scenario failed (exit {run.returncode}); {RESULTS} left as it was", file=sys.stderr)
        return run.returncode or 1
    record = json.loads(partial.read_text())
    record["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    RESULTS.write_text(json.dumps(record, indent=2) + "\n")
    partial.unlink()
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
