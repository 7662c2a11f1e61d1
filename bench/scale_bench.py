"""Scale benchmark: N AIModels applied at once on KWOK nodes against the real local control plane.

Measures (results as JSON in bench/results/scale.json):
- seconds until every AIModel is reconciled (status.observedGeneration == generation) and until Ready;
- reconcile latency for a single spec change under that load (p50/p99 over several changes): time from
  the PATCH until the Deployment carries the change and status.observedGeneration has caught up;
- the operator's memory (peak and final RSS) and CPU seconds;
- optionally with K unrelated pods (not the operator's: no managed-by label) Running on KWOK nodes before
  the operator starts, as in a busy shared cluster (`--unrelated-pods`).
Each round is a fresh local control plane. `--operator-src DIR` runs the operator from another source tree
(e.g. `git archive` of an older commit) for before/after comparisons in the same session.
No timed assertions: this reports numbers.
Usage: python bench/scale_bench.py [--models 1000] [--changes 20] [--rounds 3] [--unrelated-pods 5000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubernetes import client, watch  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from localcluster.cluster import LocalCluster  # noqa: E402
from tests.support.cluster_harness import (  # noqa: E402
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
    wait_until,
)

NAMESPACE = "scale"
UNRELATED_NAMESPACE = "unrelated"
SPEC: dict[str, Any] = {"source": {"uri": "/models/tiny"}, "engine": "transformers", "resources": {"cpu": "10m"}}
PODS_PER_NODE = 100  # KWOK nodes admit 110; leave the scheduler some room on the nodes it shares
RESYNC_SECONDS = 300
PROBES = 10  # models created (and reconciled) before the burst, whose changes are timed during it
# The top-level fields of the JSON: the headline configuration's medians, in the layout of the first
# version of this file (readers of the old layout keep working).
HEADLINE_KEYS = (
    "models",
    "create_requests_seconds",
    "all_reconciled_seconds",
    "all_ready_seconds",
    "single_change_latency_seconds",
    "operator_rss_mib",
)


def rss_kib(pid: int) -> tuple[int, int]:
    """(peak, current) resident memory of a process in KiB, from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmHWM"].split()[0]), int(fields["VmRSS"].split()[0])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    after_name = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces; fields follow ")"
    utime, stime = int(after_name[11]), int(after_name[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def all_models(kube: Kube) -> list[dict[str, Any]]:
    listing = kube.custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "aimodels")
    return list(json_object(listing, "the AIModel list")["items"])


def count(models: list[dict[str, Any]], ready: bool) -> int:
    def ok(m: dict[str, Any]) -> bool:
        status = m.get("status") or {}
        caught_up = status.get("observedGeneration") == m["metadata"]["generation"]
        return caught_up and (not ready or status.get("phase") == "Ready")

    return sum(1 for m in models if ok(m))


def unless_overloaded(read: Callable[[], T]) -> T | None:
    """`read()`, or None (recorded in POLL_ERRORS) when the API server sheds load (429) or times out (5xx):
    the bench's own poll then tries again later. The operator's requests meet the same answers and retry on
    their own; they are part of the result."""
    try:
        return read()
    except ApiException as exc:
        if exc.status is None or not (exc.status == 429 or exc.status >= 500):
            raise
        POLL_ERRORS.append(f"{type(exc).__name__} {exc.status}")
        return None


# Each poll lists every AIModel (megabytes of JSON at N=1000) on the same 2 cores as the control plane and
# the operator: polling twice as often would cost more CPU than the resolution it buys on a ~100 s result.
POLL_SECONDS = 2.0
T = TypeVar("T")


def wait_all(kube: Kube, n: int, ready: bool, started: float, timeout: float) -> float | None:
    while time.monotonic() - started < timeout:
        models = unless_overloaded(lambda: all_models(kube))
        if models is not None and count(models, ready) >= n:
            return time.monotonic() - started
        time.sleep(POLL_SECONDS)  # polling interval of a deadline-bounded wait
    return None


POLL_ERRORS: list[str] = []  # the bench's own polls answered 429/5xx in this round (a sign of overload)


def retried(call: Callable[[], T], timeout: float = 120) -> T:
    """`call()`, again after a pause while the API server sheds load (429/5xx), until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        result = unless_overloaded(call)
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"the API server shed load for {timeout}s")
        time.sleep(POLL_SECONDS)  # back-off of a deadline-bounded retry


def change_latency(kube: Kube, name: str, tag: str, timeout: float = 300) -> float:
    """Seconds from a spec PATCH until the AIModel's status.observedGeneration reaches the new generation,
    seen on a watch of that one object (no polling load during a burst). The reconciler applies the
    Deployment before it writes observedGeneration, so the Deployment is then checked once: it must carry
    the change."""
    served = f"changed-{tag}"
    started = time.monotonic()
    patched = retried(lambda: kube.patch_model(NAMESPACE, name, {"spec": {"servedModelName": served}}))
    generation, version = patched["metadata"]["generation"], patched["metadata"]["resourceVersion"]
    stream = watch.Watch()
    elapsed = None
    for event in stream.stream(
        kube.custom.list_namespaced_custom_object,
        GROUP,
        VERSION,
        NAMESPACE,
        "aimodels",
        field_selector=f"metadata.name={name}",
        resource_version=version,
        timeout_seconds=int(timeout),
    ):
        model = event["object"]
        if ((model.get("status") or {}).get("observedGeneration") or 0) >= generation:
            elapsed = time.monotonic() - started
            stream.stop()
    if elapsed is None:
        raise TimeoutError(f"change {tag} of {name} not reconciled in {timeout}s")
    dep = retried(lambda: kube.apps.read_namespaced_deployment(f"model-{name}", NAMESPACE))
    env = {e.name: e.value for e in present(pod_spec(dep).containers[0].env, "the runtime container's env")}
    if served not in present(env["SERVLANE_RUNTIME_CONFIG"], "SERVLANE_RUNTIME_CONFIG's value"):
        raise AssertionError(f"{name}: observedGeneration caught up but the Deployment lacks change {tag}")
    return elapsed


@dataclass
class BurstProbe:
    """Changes, one at a time, to models reconciled before the burst, while the burst's models are being
    reconciled: the latency a team sees for its one edit while someone else applies a thousand models.
    A sample counts as "during the burst" when it ended before every burst model was reconciled."""

    kube: Kube
    probes: list[str]
    changes: int
    during: list[float] = field(default_factory=list)
    after: list[float] = field(default_factory=list)
    burst_done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def run(self) -> None:
        try:
            for i in range(self.changes):
                latency = change_latency(self.kube, self.probes[i % len(self.probes)], f"burst-{i}")
                (self.after if self.burst_done.is_set() else self.during).append(latency)
                if self.burst_done.wait(PROBE_SPACING_SECONDS):
                    return  # pacing between changes; the burst has ended: stop sampling
        except BaseException as exc:  # reported by the caller
            self.error = exc


# One change every few seconds: a team editing its model, not a second load generator.
PROBE_SPACING_SECONDS = 2.0


def unrelated_pod(i: int, node: str) -> client.V1Pod:
    """A pod of someone else's app: bound to a KWOK node directly (no scheduler round trip), a typical
    handful of labels and env vars, none of ours."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=f"other-{i:05d}",
            labels={"app.kubernetes.io/name": "other-app", "app.kubernetes.io/instance": f"other-{i % 50}"},
        ),
        spec=client.V1PodSpec(
            node_name=node,
            containers=[
                client.V1Container(
                    name="app",
                    image="registry.example/other-app:1.0",
                    env=[client.V1EnvVar(name=f"SETTING_{k}", value=f"value-{k}") for k in range(5)],
                    resources=client.V1ResourceRequirements(requests={"cpu": "1m", "memory": "1Mi"}),
                )
            ],
        ),
    )


def default_account(kube: Kube) -> bool:
    accounts = kube.core.list_namespaced_service_account(UNRELATED_NAMESPACE, field_selector="metadata.name=default")
    return bool(accounts.items)


def create_unrelated_pods(kube: Kube, n: int, nodes: list[str], timeout: float = 900) -> dict[str, float]:
    """Creates n unrelated pods spread over `nodes` and waits until KWOK reports them Running."""
    kube.core.create_namespace(namespace_body(UNRELATED_NAMESPACE))
    # Pods without a serviceAccountName are refused until the controller-manager has made "default".
    wait_until("the unrelated namespace's default ServiceAccount", lambda: default_account(kube), timeout=60)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(
            pool.map(
                lambda i: kube.core.create_namespaced_pod(UNRELATED_NAMESPACE, unrelated_pod(i, nodes[i % len(nodes)])),
                range(n),
            )
        )
    created = time.monotonic() - started
    while time.monotonic() - started < timeout:
        running = unless_overloaded(
            lambda: kube.core.list_namespaced_pod(UNRELATED_NAMESPACE, field_selector="status.phase=Running")
        )
        if running is None:
            time.sleep(POLL_SECONDS)  # polling interval of a deadline-bounded wait
            continue
        if len(running.items) >= n:
            return {"create_seconds": round(created, 1), "running_seconds": round(time.monotonic() - started, 1)}
        del running
        time.sleep(5)  # polling interval of a deadline-bounded wait (each poll lists thousands of pods)
    raise TimeoutError(f"{n} unrelated pods not Running in {timeout}s")


def apiserver_requests(kube: Kube) -> dict[str, dict[str, float]]:
    """The API server's own count and summed duration of requests by verb and resource since it started
    (apiserver_request_total, apiserver_request_duration_seconds_sum; the bench's polls included): where
    the control plane's time went. Only mutating verbs and the operator's kinds are kept."""
    method, url, headers, _, _ = kube.api.param_serialize(
        "GET", "/metrics", header_params={"Accept": "text/plain"}, auth_settings=["BearerToken"]
    )
    response = kube.api.call_api(method, url, header_params=headers)
    response.read()
    if response.status >= 400:
        raise ApiException(http_resp=response)
    text = bytes(response.data or b"").decode()
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in ("apiserver_request", "apiserver_request_duration_seconds"):
            continue
        for sample in family.samples:
            if sample.name not in ("apiserver_request_total", "apiserver_request_duration_seconds_sum"):
                continue
            verb, resource = sample.labels.get("verb", ""), sample.labels.get("resource", "")
            if verb not in ("POST", "PUT", "PATCH", "APPLY", "DELETE", "CREATE", "UPDATE"):
                continue
            key = f"{verb} {resource}/{sample.labels.get('subresource', '')}".rstrip("/")
            entry = out.setdefault(key, {"requests": 0.0, "seconds": 0.0})
            entry["requests" if sample.name.endswith("_total") else "seconds"] += sample.value
    return {k: {"requests": int(v["requests"]), "seconds": round(v["seconds"], 1)} for k, v in sorted(out.items())}


def start_profiler(out: Path | None, pid: int) -> subprocess.Popen[bytes] | None:
    """py-spy (not a project dependency: `pip install py-spy` anywhere, it must be on PATH) sampling the
    operator from the burst until all models are reconciled; collapsed stacks, for flame graphs."""
    if out is None:
        return None
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("--profile needs py-spy on PATH")
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [spy, "record", "--pid", str(pid), "--rate", "50", "--format", "raw", "--output", str(out)]
    return subprocess.Popen([*command, "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_profiler(profiler: subprocess.Popen[bytes] | None) -> None:
    if profiler is not None:
        profiler.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        profiler.wait(timeout=60)


def quantiles(latencies: list[float]) -> dict[str, Any]:
    q = statistics.quantiles(latencies, n=100, method="inclusive") if len(latencies) > 1 else latencies * 99
    return {
        "samples": len(latencies),
        "p50": round(statistics.median(latencies), 3),
        "p99": round(q[98], 3),
        "max": round(max(latencies), 3),
    }


def one_round(args: argparse.Namespace) -> dict[str, Any]:
    load_start = load()
    POLL_ERRORS.clear()
    with tempfile.TemporaryDirectory(prefix="servlane-scale-") as tmp:
        model_nodes = args.models // PODS_PER_NODE + 1
        other_nodes = -(-args.unrelated_pods // PODS_PER_NODE) if args.unrelated_pods else 0
        cluster = LocalCluster(Path(tmp), extra_cpu_nodes=model_nodes + other_nodes)
        cluster.up(timeout=300)
        operator = None
        unrelated: dict[str, float] = {}
        try:
            kube = Kube(cluster.kubeconfig)
            install_crds(kube)
            operator_rbac(kube)
            kube.core.create_namespace(namespace_body(NAMESPACE))
            if args.unrelated_pods:
                # localcluster's extra CPU nodes are cpu-node-2, -3, ...: the unrelated pods get the last ones.
                first = 2 + model_nodes
                nodes = [f"cpu-node-{i}" for i in range(first, first + other_nodes)]
                unrelated = create_unrelated_pods(kube, args.unrelated_pods, nodes)
            sa_config = service_account_kubeconfig(kube, Path(tmp) / "sa.kubeconfig")
            extra_env = {"PYTHONPATH": str(args.operator_src)} if args.operator_src else {}
            extra_env.update(item.split("=", 1) for item in args.operator_env)
            operator = OperatorProcess(
                sa_config, Path(tmp) / "operator.log", resync_seconds=RESYNC_SECONDS, extra_env=extra_env
            )
            operator.start()
            assert operator.proc is not None
            pid = operator.proc.pid
            idle_peak, idle_rss = rss_kib(pid)  # as soon as kopf answers liveness, before any model exists
            idle_cpu = cpu_seconds(pid)

            # The probes: models reconciled before the burst, changed one at a time during it.
            probes = [f"m{i:04d}" for i in range(min(PROBES, args.models))]
            for name in probes:
                kube.create_model(NAMESPACE, name, SPEC)
            wait_all(kube, len(probes), ready=False, started=time.monotonic(), timeout=300)
            probe = BurstProbe(kube, probes, args.changes)
            prober = threading.Thread(target=probe.run, name="burst-probe")

            profiler = start_profiler(args.profile, pid)
            started = time.monotonic()
            prober.start()
            with ThreadPoolExecutor(max_workers=16) as pool:
                list(
                    pool.map(lambda i: kube.create_model(NAMESPACE, f"m{i:04d}", SPEC), range(len(probes), args.models))
                )
            applied = time.monotonic() - started
            reconciled = wait_all(kube, args.models, ready=False, started=started, timeout=1800)
            probe.burst_done.set()
            cpu_reconciled = cpu_seconds(pid)
            writes_until_reconciled = unless_overloaded(lambda: apiserver_requests(kube))
            stop_profiler(profiler)
            prober.join()
            if probe.error is not None:
                raise probe.error
            ready = wait_all(kube, args.models, ready=True, started=started, timeout=1800)
            peak_load, _ = rss_kib(pid)
            load_burst = load()

            latencies = [
                change_latency(kube, f"m{(i * 37) % args.models:04d}", f"after-{i}") for i in range(args.changes)
            ]
            peak, current = rss_kib(pid)
            cpu_end = cpu_seconds(pid)
        finally:
            if operator is not None:
                operator.stop()
            cluster.down()

    return {
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "create_requests_seconds": round(applied, 2),
        "all_reconciled_seconds": None if reconciled is None else round(reconciled, 2),
        "all_ready_seconds": None if ready is None else round(ready, 2),
        "single_change_latency_seconds": quantiles(latencies),
        "single_change_during_burst_seconds": quantiles(probe.during) if probe.during else None,
        "probe_changes_after_burst": len(probe.after),
        "apiserver_writes_until_all_reconciled": writes_until_reconciled,
        "operator_rss_mib": {
            "at_liveness": round(idle_rss / 1024, 1),
            "peak_at_liveness": round(idle_peak / 1024, 1),
            "peak_during_apply": round(peak_load / 1024, 1),
            "peak": round(peak / 1024, 1),
            "final": round(current / 1024, 1),
        },
        "operator_cpu_seconds": {
            "start": round(idle_cpu, 1),
            "until_all_reconciled": round(cpu_reconciled, 1),
            "total": round(cpu_end, 1),
        },
        "unrelated_pods_setup": unrelated or None,
        "loadavg": {"start": load_start, "after_all_ready": load_burst, "end": load()},
        "bench_poll_errors": len(POLL_ERRORS),
        "poll_seconds": POLL_SECONDS,
    }


def spread(values: list[float | None]) -> dict[str, Any]:
    xs = [v for v in values if v is not None]
    if not xs:
        return {"median": None, "n": 0}
    return {"median": round(statistics.median(xs), 3), "min": min(xs), "max": max(xs), "n": len(xs)}


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def pick(*path: str) -> list[float | None]:
        out: list[float | None] = []
        for r in rounds:
            value: Any = r
            for key in path:
                value = None if value is None else value.get(key)
            out.append(value)
        return out

    return {
        "all_reconciled_seconds": spread(pick("all_reconciled_seconds")),
        "all_ready_seconds": spread(pick("all_ready_seconds")),
        "single_change_p50_seconds": spread(pick("single_change_latency_seconds", "p50")),
        "single_change_p99_seconds": spread(pick("single_change_latency_seconds", "p99")),
        "burst_change_p50_seconds": spread(pick("single_change_during_burst_seconds", "p50")),
        "burst_change_p99_seconds": spread(pick("single_change_during_burst_seconds", "p99")),
        "operator_rss_peak_mib": spread(pick("operator_rss_mib", "peak")),
        "operator_rss_at_liveness_mib": spread(pick("operator_rss_mib", "at_liveness")),
        "operator_cpu_seconds_total": spread(pick("operator_cpu_seconds", "total")),
        "loadavg_1min_start": spread([r["loadavg"]["start"][0] for r in rounds]),
    }


def versions() -> dict[str, Any]:
    env = dict(
        line.split("=", 1)
        for line in (ROOT / "localcluster/versions.env").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    return {
        "python": platform.python_version(),
        "kopf": metadata.version("kopf"),
        "kubernetes_client": metadata.version("kubernetes"),
        "kubernetes": env.get("K8S_VERSION"),
        "etcd": env.get("ETCD_VERSION"),
        "kwok": env.get("KWOK_VERSION"),
    }


def headline(config: dict[str, Any]) -> dict[str, Any]:
    """The old top-level layout, from the round with the median time to all-reconciled."""
    rounds = sorted(config["rounds"], key=lambda r: r["all_reconciled_seconds"] or float("inf"))
    median_round = rounds[(len(rounds) - 1) // 2]
    return {"models": config["settings"]["models"], **{k: median_round[k] for k in HEADLINE_KEYS if k in median_round}}


def table(results: dict[str, Any]) -> str:
    """The README's table: one row per configuration, medians (and min to max when there are several rounds)."""

    def cell(stat: dict[str, Any], unit: str) -> str:
        if stat.get("median") is None:
            return "none"
        text = f"{stat['median']:g}{unit}"
        return text if stat["n"] == 1 else f"{text} ({stat['min']:g} to {stat['max']:g}, n={stat['n']})"

    rows = [
        "| configuration | models | unrelated pods | all reconciled | all Ready | one change during the burst "
        "p50 / p99 | one change after it p50 / p99 | operator RSS peak | operator CPU | load at start |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, config in sorted(results.get("configurations", {}).items(), key=lambda kv: _order(kv[1])):
        s, summary = config["settings"], config["summary"]
        change = (
            f"{cell(summary['single_change_p50_seconds'], ' s')} / {cell(summary['single_change_p99_seconds'], ' s')}"
        )
        during = (
            f"{cell(summary.get('burst_change_p50_seconds', {}), ' s')} / "
            f"{cell(summary.get('burst_change_p99_seconds', {}), ' s')}"
        )
        rows.append(
            f"| {label.split('-')[0]} | {s['models']} | {s['unrelated_pods']} "
            f"| {cell(summary['all_reconciled_seconds'], ' s')} | {cell(summary['all_ready_seconds'], ' s')} "
            f"| {during} | {change} | {cell(summary['operator_rss_peak_mib'], ' MiB')} "
            f"| {cell(summary['operator_cpu_seconds_total'], ' s')} | {cell(summary['loadavg_1min_start'], '')} |"
        )
    return "\n".join(rows)


def _order(config: dict[str, Any]) -> tuple[int, int, str]:
    s = config["settings"]
    return (s["models"], s["unrelated_pods"], "0" if s["operator_src"].endswith("scale-before/operator") else "1")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1, help="fresh control plane each round")
    parser.add_argument("--unrelated-pods", type=int, default=0, help="other pods Running before the operator")
    parser.add_argument("--operator-src", type=Path, default=None, help="run servlane_operator from this tree")
    parser.add_argument("--label", default=None, help="configuration name in the JSON (default: from settings)")
    parser.add_argument("--note", default="", help="free text stored with the configuration")
    parser.add_argument(
        "--headline", action="store_true", help="also write this configuration's median round as the top-level fields"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/scale.json")
    parser.add_argument(
        "--profile", type=Path, default=None, help="py-spy collapsed stacks of the operator during the burst"
    )
    parser.add_argument(
        "--operator-env", action="append", default=[], help="KEY=VALUE for the operator process (repeatable)"
    )
    parser.add_argument(
        "--table", type=Path, default=None, help="print the README table of a results file, run nothing"
    )
    args = parser.parse_args()
    if args.table is not None:
        print(table(json.loads(args.table.read_text())))
        return 0
    if args.operator_src is not None:
        args.operator_src = args.operator_src.resolve()
        if not (args.operator_src / "servlane_operator").is_dir():
            parser.error(f"--operator-src {args.operator_src}: no servlane_operator package there")
    label = args.label or (
        f"{'before' if args.operator_src else 'current'}-models{args.models}-unrelated{args.unrelated_pods}"
    )

    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {"benchmark": "scale"}
    config: dict[str, Any] = results.setdefault("configurations", {}).get(label) or {"rounds": []}
    config["settings"] = {
        "models": args.models,
        "changes": args.changes,
        "unrelated_pods": args.unrelated_pods,
        "operator_src": str(args.operator_src) if args.operator_src else "this tree",
        "resync_seconds": RESYNC_SECONDS,
        "create_threads": 16,
        "operator_env": args.operator_env,
        "note": args.note or config.get("settings", {}).get("note", ""),
    }
    config["versions"] = versions()
    for i in range(args.rounds):
        print(f"[{label}] round {i + 1}/{args.rounds}, loadavg {load()}", flush=True)
        result = one_round(args)
        print(json.dumps(result, indent=2), flush=True)
        config["rounds"].append(result)
        config["summary"] = summarise(config["rounds"])
        results["configurations"][label] = config
        if args.headline:
            results.update(headline(config))
            results["headline_configuration"] = label
        results["machine"] = {
            "cpus": os.cpu_count(),
            "note": "control plane, KWOK, the operator and other engineers' work share the same cores; "
            "see each round's loadavg",
        }
        results.setdefault("peers", "none run: no other operator can be built and run here in the same session")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")  # after every round: partial runs keep data
    print(json.dumps(config["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
