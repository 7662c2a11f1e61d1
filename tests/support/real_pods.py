"""Helpers for e2e tests whose pods really run (the real node, e2e/conftest.py `real_cluster`): models on a
local PersistentVolume, what a failing pod shows (status, events, the runtime's log), and the milestones of an
AIModel's rollout (scheduled, container started, ready)."""

from __future__ import annotations

import json
import shutil
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from openai.types.chat import ChatCompletion

from localcluster.cluster import LocalCluster
from servlane_api.cold_start import STARTUP_PATH, RuntimeStartup
from servlane_api.runtime_config import DEFAULT_METRICS_PORT
from tests.support.cluster_harness import (
    RUNTIME_CPU_IMAGE,
    Kube,
    OperatorProcess,
    install_crds,
    operator_rbac,
    service_account_kubeconfig,
)
from tests.support.pod_netns import get_in_pod, netns_of
from tests.support.polling import wait_until

NODE = "real-node-1"
NODE_SELECTOR = {"servlane.dev/real-node": "true"}
LOG_TAIL_LINES = 60


def model_on_the_real_node(claim: str, folder: str, resources: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """An AIModel spec serving `folder` of the `pvc://` claim with the transformers engine on the real node,
    offline (the weights are on the claim; nothing downloads)."""
    return {
        "source": {"uri": f"pvc://{claim}/{folder}"},
        "engine": "transformers",
        "engineOptions": {"maxModelLen": 256},
        "resources": {"gpus": 0, **resources},
        "scheduling": {"nodeSelector": NODE_SELECTOR},
        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
        **extra,
    }


def ensure_namespace(c: LocalCluster, namespace: str) -> None:
    try:
        c.api("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    except urllib.error.HTTPError as exc:
        if exc.code != 409:
            raise


def local_model_claim(c: LocalCluster, namespace: str, claim: str, models: dict[str, Path]) -> None:
    """A PersistentVolumeClaim `claim` holding each model folder under its key: a static `local` PV on the real
    node over a host folder, bound to the claim by name, so AIModels use `pvc://<claim>/<key>`."""
    root = c.workdir / "pv" / namespace / claim
    for name, source in models.items():
        shutil.copytree(source, root / name, symlinks=False)
    for path in [root, *root.rglob("*")]:  # readable by the runtime's non-root uid
        path.chmod(0o755 if path.is_dir() else 0o644)
    pv_name = f"{namespace}-{claim}"
    terms = [{"matchExpressions": [{"key": k, "operator": "In", "values": [v]}]} for k, v in NODE_SELECTOR.items()]
    pv = {
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "local": {"path": str(root)},
            "nodeAffinity": {"required": {"nodeSelectorTerms": terms}},
        },
    }
    c.api("POST", "/api/v1/persistentvolumes", pv)
    pvc = {
        "metadata": {"name": claim},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    c.api("POST", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", pvc)

    def bound() -> bool:
        got = c.api("GET", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
        return bool(got.get("status", {}).get("phase") == "Bound")

    wait_until(f"PVC {claim} Bound to {pv_name}", bound, timeout=60, interval=0.5)


def delete_local_claim(c: LocalCluster, namespace: str, claim: str) -> None:
    for path in (
        f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}",
        f"/api/v1/persistentvolumes/{namespace}-{claim}",
    ):
        try:
            c.api("DELETE", path)
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise


# --- what a failure shows: pods (describe-like), their events, the runtime's log, the AIModel's status ---
def _ssl(c: LocalCluster) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(c.pki_dir / "ca.crt"))
    ctx.load_cert_chain(str(c.pki_dir / "admin.crt"), str(c.pki_dir / "admin.key"))
    return ctx


def pod_log(c: LocalCluster, namespace: str, pod: str, container: str = "runtime", previous: bool = False) -> str:
    """A container's log through the API server's pod log endpoint (API server -> kubelet)."""
    query = urllib.parse.urlencode({"container": container, "tailLines": LOG_TAIL_LINES, "previous": previous})
    url = f"{c.server}/api/v1/namespaces/{namespace}/pods/{pod}/log?{query}"
    try:
        with urllib.request.urlopen(url, context=_ssl(c), timeout=30) as r:
            return str(r.read().decode(errors="replace"))
    except urllib.error.HTTPError as exc:
        return f"(no log: HTTP {exc.code} {exc.read().decode(errors='replace')[:300]})"
    except OSError as exc:
        return f"(no log: {exc})"


def _state(state: dict[str, Any] | None) -> str:
    if not state:
        return "-"
    ((kind, detail),) = state.items()
    keys = ("reason", "exitCode", "message", "startedAt", "finishedAt")
    return f"{kind} " + " ".join(f"{k}={detail[k]!r}" for k in keys if detail.get(k) is not None)


def pods(c: LocalCluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    query = urllib.parse.quote(selector)
    items: list[dict[str, Any]] = c.api("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector={query}")["items"]
    return items


def describe_pods(c: LocalCluster, namespace: str, selector: str) -> str:
    """Pods as `kubectl describe` would summarise them, their events and each container's log (and the previous
    container's, after a restart)."""
    out: list[str] = []
    found = pods(c, namespace, selector)
    if not found:
        out.append(f"no pods with {selector} in {namespace}")
    for pod in found:
        name, status = pod["metadata"]["name"], pod.get("status", {})
        out.append(f"--- pod {name}: phase={status.get('phase')} node={pod['spec'].get('nodeName')}")
        for cond in status.get("conditions", []):
            reason, message = cond.get("reason", ""), cond.get("message", "")
            out.append(f"  condition {cond['type']}={cond['status']} {reason} {message}")
        for cs in status.get("containerStatuses", []):
            out.append(
                f"  container {cs['name']}: ready={cs.get('ready')} started={cs.get('started')} "
                f"restarts={cs.get('restartCount')} image={cs.get('image')}\n"
                f"    state: {_state(cs.get('state'))}\n    last: {_state(cs.get('lastState'))}"
            )
        field_selector = urllib.parse.quote(f"involvedObject.name={name}")
        events = c.api("GET", f"/api/v1/namespaces/{namespace}/events?fieldSelector={field_selector}")["items"]
        for e in events:
            out.append(f"  event {e.get('type')} {e.get('reason')} x{e.get('count', 1)}: {e.get('message')}")
        for container in pod["spec"]["containers"]:
            log = pod_log(c, namespace, name, container["name"])
            out.append(f"  --- {container['name']} log (last {LOG_TAIL_LINES} lines) ---\n{log}")
        for cs in status.get("containerStatuses", []):
            if cs.get("restartCount"):
                previous = pod_log(c, namespace, name, cs["name"], previous=True)
                out.append(f"  --- previous {cs['name']} log ---\n{previous}")
    return "\n".join(out)


def describe_model(c: LocalCluster, namespace: str, model: str) -> str:
    """The AIModel's status, then its pods (describe_pods)."""
    try:
        got = c.api("GET", f"/apis/servlane.dev/v1alpha1/namespaces/{namespace}/aimodels/{model}")
        head = f"AIModel {model} status: {json.dumps(got.get('status'), indent=1)}"
    except (OSError, ValueError) as exc:
        head = f"AIModel {model}: {exc}"
    return head + "\n" + describe_pods(c, namespace, f"servlane.dev/model={model}")


def crashing(pod: dict[str, Any]) -> str | None:
    """Why a container of the pod is not going to become ready, if it has failed already."""
    for cs in pod.get("status", {}).get("containerStatuses", []):
        waiting = cs.get("state", {}).get("waiting") or {}
        if waiting.get("reason") in (
            "CrashLoopBackOff",
            "CreateContainerError",
            "CreateContainerConfigError",
            "ErrImageNeverPull",
            "ErrImagePull",
            "ImagePullBackOff",
            "InvalidImageName",
        ):
            return f"{cs['name']} {waiting['reason']}: {waiting.get('message', '')}"
        terminated = (cs.get("state", {}).get("terminated") or cs.get("lastState", {}).get("terminated")) or {}
        if terminated:
            return f"{cs['name']} terminated: {terminated.get('reason')} exit {terminated.get('exitCode')}"
    return None


@dataclass
class ModelRollout:
    """apply -> pod scheduled -> container started -> container ready -> AIModel Ready, as a test observes them;
    a crashing runtime fails at once with the pods' story (describe_model)."""

    cluster: LocalCluster
    kube: Kube
    namespace: str
    model: str
    applied: float = field(default_factory=time.monotonic)
    seen: dict[str, float] = field(default_factory=dict)
    pod: dict[str, Any] = field(default_factory=dict)

    def _mark(self, milestone: str) -> None:
        self.seen.setdefault(milestone, time.monotonic() - self.applied)

    def check(self) -> dict[str, Any] | None:
        for pod in pods(self.cluster, self.namespace, f"servlane.dev/model={self.model}"):
            self.pod = pod
            if pod["spec"].get("nodeName"):
                self._mark("scheduled")
            statuses = pod.get("status", {}).get("containerStatuses", [])
            if any("running" in cs.get("state", {}) for cs in statuses):
                self._mark("container started")
            if any(cs.get("ready") for cs in statuses):
                self._mark("container ready")
            crash = crashing(pod)
            if crash is not None:
                story = describe_model(self.cluster, self.namespace, self.model)
                raise AssertionError(f"the runtime pod failed: {crash}\n{story}")
        got = self.kube.get_model(self.namespace, self.model)
        status = got.get("status") or {}
        if status.get("phase") == "Ready" and status.get("observedGeneration") == got["metadata"]["generation"]:
            self._mark("AIModel Ready")
            return got
        return None

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        try:
            return wait_until(f"AIModel {self.model} Ready", self.check, timeout=timeout, interval=0.5)
        except AssertionError as exc:
            if "the runtime pod failed" in str(exc):
                raise
            story = describe_model(self.cluster, self.namespace, self.model)
            raise AssertionError(f"{exc}\n{story}") from None

    def timings(self) -> str:
        return ", ".join(f"{k} +{v:.1f}s" for k, v in self.seen.items())


def gone(c: LocalCluster, path: str) -> bool:
    try:
        c.api("GET", path)
    except urllib.error.HTTPError as exc:
        return exc.code == 404
    return False


def answers_200(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as r:
        return bool(r.status == 200)


def service_base_url(c: LocalCluster, namespace: str, model: str) -> str:
    """The model's OpenAI base URL at its Service's ClusterIP (through kube-proxy), once /models answers."""
    service = c.api("GET", f"/api/v1/namespaces/{namespace}/services/model-{model}")
    base = f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}/v1"
    wait_until(
        f"GET {base}/models through the ClusterIP",
        lambda: answers_200(f"{base}/models"),
        timeout=60,
        interval=0.5,
        tolerate=lambda exc: isinstance(exc, OSError),
    )
    return base


def chat_through_gateway(base: str, feature: str) -> ChatCompletion:
    """The `openai` client at a gateway's OpenAI base URL (watching_gateway's URL + /v1): once the gateway lists
    `feature`, one short chat completion asked of it; returns the reply."""
    http = openai.DefaultHttpxClient(trust_env=False, timeout=120)  # local addresses: never through a proxy
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, http_client=http)
    try:
        wait_until(
            f"the gateway lists {feature}",
            lambda: feature in {m.id for m in client.models.list().data},
            timeout=120,
            interval=1,
            tolerate=lambda exc: isinstance(exc, (openai.APIError, OSError)),
        )
        return client.chat.completions.create(
            model=feature, messages=[{"role": "user", "content": "Hello!"}], max_tokens=8, temperature=0
        )
    finally:
        client.close()


def real_node_kube(c: LocalCluster, namespace: str) -> Kube:
    """A client of the real cluster with our CRDs installed and `namespace` there: a module's first step."""
    kube = Kube(c.kubeconfig)
    install_crds(kube)
    ensure_namespace(c, namespace)
    return kube


@contextmanager
def operator_process(c: LocalCluster, kube: Kube, name: str) -> Iterator[OperatorProcess]:
    """The operator as a process on this host with its ServiceAccount's token (its chart RBAC), CPU models on
    our CPU runtime image; its log in the cluster's logs/<name>.log."""
    operator_rbac(kube)
    kubeconfig = service_account_kubeconfig(kube, c.workdir / f"{name}-sa.kubeconfig")
    env = {"SERVLANE_RUNTIME_IMAGE_CPU": RUNTIME_CPU_IMAGE}
    process = OperatorProcess(kubeconfig, c.workdir / "logs" / f"{name}.log", extra_env=env)
    process.start()
    try:
        yield process
    finally:
        process.stop()


def runtime_startup(c: LocalCluster, operator_namespace: str, pod: dict[str, Any]) -> dict[str, float]:
    """A model pod's own /startup phases (Unix seconds), asked from the operator pod's network namespace in
    `operator_namespace`: the model's NetworkPolicy admits the operator (and the scraper) to the metrics port,
    not this host. OSError or a ValueError when the runtime does not answer them (yet)."""
    operator = pods(c, operator_namespace, "app.kubernetes.io/component=operator")[0]
    url = f"http://{pod['status']['podIP']}:{DEFAULT_METRICS_PORT}{STARTUP_PATH}"
    body = get_in_pod(netns_of(c, operator["status"]["podIP"]), url)
    return {phase: at for phase, at in RuntimeStartup.model_validate_json(body).phases.items()}
