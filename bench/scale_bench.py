"""Scale benchmark: N AIModels applied at once on KWOK nodes against the real local control plane.

Measures (results as JSON in bench/results/scale.json):
- seconds until every AIModel is reconciled (status.observedGeneration == generation) and until Ready;
- reconcile latency for a single spec change under that load (p50/p99 over several changes): time from
  the PATCH until the Deployment carries the change and status.observedGeneration has caught up;
- the operator's memory (peak and final RSS).
No timed assertions: this reports numbers. Usage: python bench/scale_bench.py [--models 500] [--changes 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from e2e.harness import (  # noqa: E402
    GROUP,
    VERSION,
    Kube,
    OperatorProcess,
    install_crds,
    json_object,
    namespace_body,
    operator_rbac,
    pod_spec,
    present,
    service_account_kubeconfig,
)
from localcluster.cluster import LocalCluster  # noqa: E402

NAMESPACE = "scale"
SPEC: dict[str, Any] = {"source": {"uri": "/models/tiny"}, "engine": "transformers", "resources": {"cpu": "10m"}}


def rss_kib(pid: int) -> tuple[int, int]:
    """(peak, current) resident memory of a process in KiB, from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmHWM"].split()[0]), int(fields["VmRSS"].split()[0])


def all_models(kube: Kube) -> list[dict[str, Any]]:
    listing = kube.custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "aimodels")
    return list(json_object(listing, "the AIModel list")["items"])


def count(models: list[dict[str, Any]], ready: bool) -> int:
    def ok(m: dict[str, Any]) -> bool:
        status = m.get("status") or {}
        caught_up = status.get("observedGeneration") == m["metadata"]["generation"]
        return caught_up and (not ready or status.get("phase") == "Ready")

    return sum(1 for m in models if ok(m))


def wait_all(kube: Kube, n: int, ready: bool, started: float, timeout: float) -> float | None:
    while time.monotonic() - started < timeout:
        if count(all_models(kube), ready) >= n:
            return time.monotonic() - started
        time.sleep(0.5)  # polling interval of a deadline-bounded wait
    return None


def change_latency(kube: Kube, name: str, round_: int, timeout: float = 300) -> float:
    served = f"changed-{round_}"
    started = time.monotonic()
    kube.patch_model(NAMESPACE, name, {"spec": {"servedModelName": served}})
    while time.monotonic() - started < timeout:
        dep = kube.apps.read_namespaced_deployment(f"model-{name}", NAMESPACE)
        env = {e.name: e.value for e in present(pod_spec(dep).containers[0].env, "the runtime container's env")}
        model = kube.get_model(NAMESPACE, name)
        caught_up = (model.get("status") or {}).get("observedGeneration") == model["metadata"]["generation"]
        if served in present(env["SERVLANE_RUNTIME_CONFIG"], "SERVLANE_RUNTIME_CONFIG's value") and caught_up:
            return time.monotonic() - started
        time.sleep(0.02)  # polling interval of a deadline-bounded wait
    raise TimeoutError(f"change {round_} of {name} not reconciled in {timeout}s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", type=int, default=500)
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/scale.json")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="servlane-scale-") as tmp:
        # 110 pods per KWOK node: enough CPU nodes for one pod per model.
        cluster = LocalCluster(Path(tmp), extra_cpu_nodes=args.models // 100 + 1)
        cluster.up()
        operator = None
        try:
            kube = Kube(cluster.kubeconfig)
            install_crds(kube)
            operator_rbac(kube)
            kube.core.create_namespace(namespace_body(NAMESPACE))
            sa_config = service_account_kubeconfig(kube, Path(tmp) / "sa.kubeconfig")
            operator = OperatorProcess(sa_config, Path(tmp) / "operator.log", resync_seconds=300)
            operator.start()
            assert operator.proc is not None

            started = time.monotonic()
            with ThreadPoolExecutor(max_workers=16) as pool:
                list(pool.map(lambda i: kube.create_model(NAMESPACE, f"m{i:04d}", SPEC), range(args.models)))
            applied = time.monotonic() - started
            reconciled = wait_all(kube, args.models, ready=False, started=started, timeout=1800)
            ready = wait_all(kube, args.models, ready=True, started=started, timeout=1800)
            peak_load, _ = rss_kib(operator.proc.pid)

            latencies = [change_latency(kube, f"m{(i * 37) % args.models:04d}", i) for i in range(args.changes)]
            peak, current = rss_kib(operator.proc.pid)
        finally:
            if operator is not None:
                operator.stop()
            cluster.down()

    q = statistics.quantiles(latencies, n=100, method="inclusive") if len(latencies) > 1 else latencies * 99
    result = {
        "benchmark": "scale",
        "models": args.models,
        "create_requests_seconds": round(applied, 2),
        "all_reconciled_seconds": None if reconciled is None else round(reconciled, 2),
        "all_ready_seconds": None if ready is None else round(ready, 2),
        "single_change_latency_seconds": {
            "samples": len(latencies),
            "p50": round(statistics.median(latencies), 3),
            "p99": round(q[98], 3),
            "max": round(max(latencies), 3),
        },
        "operator_rss_mib": {
            "peak_during_apply": round(peak_load / 1024, 1),
            "peak": round(peak / 1024, 1),
            "final": round(current / 1024, 1),
        },
        "machine": {"cpus": 2, "note": "control plane, KWOK and operator share the same 2 cores"},
        "peers": "none run: no other operator can be built and run here in the same session",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
