"""Canary rollback timing at the shipped defaults, with every real piece (control plane, operator, Prometheus,
gateway, runtimes), repeated, beside the same arithmetic for Flagger's and Argo Rollouts' documented settings.

Each round runs the rollback scenario of e2e/test_canary_full.py in its own pytest process (own operator,
Prometheus, gateway and runtimes; one local control plane for all rounds): the canary's runtime is SIGKILLed
right after the canary gets its first step's traffic and comes back broken (it exits, so the gateway answers
503 for the canary's share). Measured: the time from the first failed client request (and from the kill) to all
traffic on the stable, and the client requests failed meanwhile. The settings are the shipped ones, read from
the code rather than copied: the AIFeature rollout as the CRD defaults it (spec.rollout: {}), the operator's
analysis timer and the Prometheus scrape interval it assumes (OperatorSettings defaults). A failed round is
recorded with its exit status and the rounds go on. Writes bench/results/canary.json.

    .venv/bin/python bench/canary_bench.py [--rounds 5] [--ci-settings]
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # localcluster/ is a folder of the repository, not an installed package
RESULTS = ROOT / "bench" / "results" / "canary.json"
SCENARIO = "e2e/test_canary_full.py::test_a_canary_whose_runtime_dies_is_rolled_back"
ROUND_TIMEOUT_SECONDS = 900
MEASURES = (
    "seconds_first_failure_to_all_traffic_on_stable",
    "seconds_kill_to_all_traffic_on_stable",
    "seconds_first_failure_to_rolled_back_status",
    "seconds_step_started_to_kill",
    "failed_client_requests",
    "client_requests_between_failure_and_stable",
)

# Peers' documented settings, for the arithmetic only (nothing of theirs runs here).
FLAGGER_INTERVAL_SECONDS = 60  # "schedule interval (default 60s)"
FLAGGER_THRESHOLD = 5  # "max number of failed metric checks before rollback": the tutorials' value (10 in some)
ARGO_INTERVAL_SECONDS = 300  # the documented background-analysis example's `interval: 5m`
ARGO_FAILURE_LIMIT = 3  # and its `failureLimit: 3`
FLAGGER: dict[str, Any] = {
    "source": [
        "https://github.com/fluxcd/flagger/blob/main/docs/gitbook/usage/deployment-strategies.md",
        "https://docs.flagger.app/v/main/tutorials/skipper-progressive-delivery",
    ],
    "interval_seconds": FLAGGER_INTERVAL_SECONDS,
    "threshold": FLAGGER_THRESHOLD,
    "documented_rollback_time": "interval * threshold",
}
ARGO_ROLLOUTS: dict[str, Any] = {
    "source": [
        "https://argoproj.github.io/argo-rollouts/features/analysis/",
        "https://raw.githubusercontent.com/argoproj/argo-rollouts/v1.10.0/docs/features/analysis.md",
    ],
    "note": "no analysis unless an AnalysisTemplate is referenced (no default analysis); without `interval` a "
    "metric is measured once; the documented background-analysis example measures every 5m with failureLimit 3, "
    "which its prose says fails on three failed measurements (by failureLimit's definition, failures beyond "
    "the limit, the fourth: both given); failureLimit left at its default, 0, fails on the first",
    "interval_seconds": ARGO_INTERVAL_SECONDS,
    "failure_limit": ARGO_FAILURE_LIMIT,
}


def shipped_settings() -> dict[str, Any]:
    """What a user gets without setting anything: the operator's and the AIFeature rollout's defaults."""
    from servlane_api.aifeature import Rollout
    from servlane_core.rollout.timeutil import parse_duration
    from servlane_operator.settings import OperatorSettings

    operator = OperatorSettings()
    rollout = Rollout()
    return {
        "operator_analysis_interval_seconds": operator.analysis_interval_seconds,
        "prometheus_scrape_interval_seconds": operator.prometheus_scrape_interval_seconds,
        "rollout": rollout.model_dump(by_alias=True, mode="json"),
        "rollout_interval_seconds": parse_duration(rollout.interval),
        "feature_spec_rollout": {},  # the CRD fills every field with the same defaults
    }


def ci_settings() -> dict[str, Any]:
    """The scenario as CI runs it (3 s steps, 1 s scrapes, 0.5 s timer): for comparison only."""
    return {
        "operator_analysis_interval_seconds": 0.5,
        "prometheus_scrape_interval_seconds": 1.0,
        "rollout": None,
        "rollout_interval_seconds": 3.0,
        "feature_spec_rollout": None,  # the test's own rollout("3s")
    }


def peer_arithmetic(servlane: dict[str, Any]) -> dict[str, Any]:
    """Seconds from a canary's failure to all traffic on the stable, computed from documented settings: the
    failure lands at a uniformly random moment between two checks; a failed check counts once the metric
    window shows it. Scrape and propagation lags (seconds) are left out except where stated."""
    interval = float(servlane["rollout_interval_seconds"])
    tick = float(servlane["operator_analysis_interval_seconds"])
    scrape = float(servlane["prometheus_scrape_interval_seconds"])
    f_int, f_thr = FLAGGER_INTERVAL_SECONDS, FLAGGER_THRESHOLD
    a_int, a_lim = ARGO_INTERVAL_SECONDS, ARGO_FAILURE_LIMIT
    return {
        "servlane_shipped": {
            "model": "failureThreshold 1: the first analysis whose window shows the failure rolls back; analyses "
            "are one rollout interval apart, run on the operator's timer tick; a failure that starts just before "
            "an analysis (not yet scraped, or under maxErrorRate in that window) is caught one interval later",
            "expected_seconds": round(interval / 2 + tick / 2 + scrape, 1),
            "worst_seconds": round(interval + scrape + tick + 0.05 * interval, 1),
            "this_bench_injection_expected_seconds": round(interval + tick / 2, 1),
        },
        "flagger_defaults": {
            **FLAGGER,
            "expected_seconds": round(f_int / 2 + (f_thr - 1) * f_int, 1),
            "worst_seconds": round(f_thr * f_int, 1),
        },
        "argo_rollouts_documented_example": {
            **ARGO_ROLLOUTS,
            "expected_seconds_failure_limit_3_three_failures": round(a_int / 2 + (a_lim - 1) * a_int, 1),
            "worst_seconds_failure_limit_3_three_failures": round(a_lim * a_int, 1),
            "expected_seconds_failure_limit_3_four_failures": round(a_int / 2 + a_lim * a_int, 1),
            "worst_seconds_failure_limit_3_four_failures": round((a_lim + 1) * a_int, 1),
            "expected_seconds_failure_limit_0": round(a_int / 2, 1),
            "worst_seconds_failure_limit_0": round(a_int, 1),
        },
    }


def spread(values: list[float]) -> dict[str, float | int] | None:
    if not values:
        return None
    quartiles = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return {
        "n": len(values),
        "median": round(statistics.median(values), 3),
        "min": min(values),
        "max": max(values),
        "q1": round(quartiles[0], 3),
        "q3": round(quartiles[2], 3),
        "iqr": round(quartiles[2] - quartiles[0], 3),
    }


def versions() -> dict[str, Any]:
    found: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform()}
    for package in ("servlane", "torch", "transformers", "kopf", "kubernetes", "openai"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    prometheus = shutil.which("prometheus")
    if prometheus:
        out = subprocess.run([prometheus, "--version"], capture_output=True, text=True, check=False)
        found["prometheus"] = (out.stdout or out.stderr).splitlines()[0] if (out.stdout or out.stderr) else None
    from localcluster.cluster import binary_paths

    apiserver = binary_paths().get("kube-apiserver")
    if apiserver is not None:
        out = subprocess.run([str(apiserver), "--version"], capture_output=True, text=True, check=False)
        found["kube_apiserver"] = out.stdout.strip() or None
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    found["git_commit"] = git.stdout.strip() or None
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, check=False)
    found["git_worktree_dirty"] = bool(dirty.stdout.strip())
    return found


def run_round(index: int, settings: dict[str, Any], kubeconfig: Path | None, workdir: Path) -> dict[str, Any]:
    partial = workdir / f"round-{index}.json"
    env = {**os.environ, "CANARY_RESULTS": str(partial)}
    if settings["feature_spec_rollout"] is not None:
        env["CANARY_ROLLBACK_ROLLOUT"] = json.dumps(settings["feature_spec_rollout"])
        env["CANARY_PROMETHEUS_SCRAPE_INTERVAL_SECONDS"] = str(settings["prometheus_scrape_interval_seconds"])
        env["CANARY_ANALYSIS_INTERVAL_SECONDS"] = str(settings["operator_analysis_interval_seconds"])
        # Two intervals (one may pass before the failure shows) plus scrape, timer and slack.
        window, scrape = settings["rollout_interval_seconds"], settings["prometheus_scrape_interval_seconds"]
        env["CANARY_ROLLBACK_TIMEOUT_SECONDS"] = str(2 * window + 2 * scrape + 60)
    if kubeconfig is not None:
        env["E2E_KUBECONFIG"] = str(kubeconfig)
    load_before = os.getloadavg()
    started = time.monotonic()
    record: dict[str, Any] = {"round": index, "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    try:
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", SCENARIO],
            cwd=ROOT, env=env, check=False, timeout=ROUND_TIMEOUT_SECONDS, capture_output=True, text=True,
        )  # fmt: skip
        record["exit_status"] = run.returncode
        tail = (run.stdout + run.stderr)[-3000:]
    except subprocess.TimeoutExpired as exc:
        record["exit_status"] = "timeout"
        tail = str(exc.stdout or "")[-3000:]
    record["wall_seconds"] = round(time.monotonic() - started, 1)
    record["loadavg_before"] = [round(x, 2) for x in load_before]
    record["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    if record["exit_status"] == 0 and partial.is_file():
        record["ok"] = True
        record["measured"] = json.loads(partial.read_text())
    else:
        record["ok"] = False
        record["failure_output_tail"] = tail
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ci-settings", action="store_true", help="the CI scenario's 3 s steps instead")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    settings = ci_settings() if args.ci_settings else shipped_settings()
    workdir = Path(tempfile.mkdtemp(prefix="canary-bench-"))
    cluster = None
    kubeconfig = Path(os.environ["E2E_KUBECONFIG"]) if os.environ.get("E2E_KUBECONFIG") else None
    if kubeconfig is None:
        from localcluster.cluster import LocalCluster

        cluster = LocalCluster(workdir / "cluster")
        cluster.up()
        kubeconfig = cluster.kubeconfig
    rounds: list[dict[str, Any]] = []
    try:
        for index in range(1, args.rounds + 1):
            record = run_round(index, settings, kubeconfig, workdir)
            rounds.append(record)
            summary = {k: record.get("measured", {}).get(k) for k in MEASURES[:2] + MEASURES[4:5]}
            print(f"round {index}: ok={record['ok']} {summary} load {record['loadavg_after']}", flush=True)
            write(args.output, settings, rounds, done=False)
    finally:
        if cluster is not None:
            cluster.down()
    write(args.output, settings, rounds, done=True)
    shutil.rmtree(workdir, ignore_errors=True)
    return 0 if any(r["ok"] for r in rounds) else 1


def write(path: Path, settings: dict[str, Any], rounds: list[dict[str, Any]], done: bool) -> None:
    ok = [r["measured"] for r in rounds if r["ok"]]
    record = {
        "scenario": "canary runtime SIGKILLed right after the canary gets its first step's traffic, restarted "
        "broken (exits: the gateway answers 503 for its share); Prometheus-read analysis; two openai client "
        "threads, no client retries",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "complete": done,
        "settings": settings,
        "rounds_run": len(rounds),
        "rounds_ok": len(ok),
        "summary": {k: spread([float(m[k]) for m in ok if m.get(k) is not None]) for k in MEASURES},
        "time_to_rollback_arithmetic": peer_arithmetic(settings),
        "machine": {"cpus": os.cpu_count(), "note": "shared and loaded; see each round's loadavg"},
        "versions": versions(),
        "rounds": rounds,
    }
    path.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
