"""The chart against the real local control plane: helm install, then the operator and the gateway as real
local processes started exactly as the chart's Deployments say (command, args, env) and authenticated with
the chart's ServiceAccount tokens (KWOK runs no containers), so the chart's RBAC is what is tested.
Then helm upgrade (peering on) and helm uninstall, which must leave only the CRDs.

The release watches one namespace of its own (namespaced Roles), so it never touches other tests' objects.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from localcluster.cluster import stop_process_groups
from tests.support.cluster_harness import ARTIFACTS, GROUP, ROOT, Kube, OperatorProcess, wait_until
from tests.support.helmtool import CHART, Helm, HelmUnavailable, find_helm
from tests.support.ports import free_port

pytestmark = pytest.mark.e2e

TEAM = ROOT / "examples" / "gitops" / "teams" / "search"
MODEL, SERVED, FEATURE = "smollm2-135m", "smollm2-135m-instruct", "assistant"


@dataclass
class Release:
    helm: Helm
    kube: Kube
    name: str
    namespace: str  # where the chart's objects live
    watched: str  # the namespace the operator and gateway serve

    @property
    def operator(self) -> str:
        return f"{self.name}-servlane-operator"

    @property
    def gateway(self) -> str:
        return f"{self.name}-servlane-gateway"

    def helm_run(self, *args: str) -> str:
        return self.helm.run(*args, "--namespace", self.namespace, kubeconfig=self.kube.kubeconfig).stdout

    def token_kubeconfig(self, service_account: str) -> Path:
        """A kubeconfig with a bound token of one of the chart's ServiceAccounts."""
        request: Any = {"spec": {"expirationSeconds": 3600}}
        token: Any = self.kube.core.create_namespaced_service_account_token(service_account, self.namespace, request)
        server, ca = self.kube.server_and_ca()
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "sa",
            "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority": ca}}],
            "users": [{"name": "sa", "user": {"token": token.status.token}}],
            "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}],
        }
        path = ARTIFACTS / f"{self.name}-{service_account}.kubeconfig"
        path.write_text(json.dumps(doc))
        return path


class DeploymentProcess:
    """The container of a Deployment run as a local process: its command, args and env, with local ports."""

    def __init__(self, deployment: Any, kubeconfig: Path, overrides: dict[str, str], log: Path) -> None:
        container = deployment.spec.template.spec.containers[0]
        command = [sys.executable if c == "python" else c for c in container.command]
        self.args = [overrides.get(a, a) for a in container.args or []]
        env = {e.name: overrides.get(e.name, e.value or "") for e in container.env or []}
        self.log = log
        self.proc = subprocess.Popen(
            [*command, *self.args],
            env={"PATH": "/usr/bin:/bin", "HOME": str(ARTIFACTS), "KUBECONFIG": str(kubeconfig), **env},
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
        )

    def get(self, url: str) -> tuple[int, bytes]:
        if self.proc.poll() is not None:
            raise AssertionError(f"process exited with {self.proc.returncode}; see {self.log}")
        try:
            with urllib.request.urlopen(url, timeout=3) as r:
                return int(r.status), bytes(r.read())
        except OSError:
            return 0, b""

    def stop(self) -> None:
        stop_process_groups([self.proc.pid], timeout=10)
        self.proc.wait(timeout=5)


@pytest.fixture(scope="module")
def release(crds: Kube) -> Iterator[Release]:
    try:
        helm = Helm(find_helm())
    except HelmUnavailable as exc:
        pytest.fail(f"helm is built with the control plane, so it must be there: {exc}")
    ARTIFACTS.mkdir(exist_ok=True)
    suffix = uuid.uuid4().hex[:6]
    rel = Release(helm, crds, f"mp{suffix}", f"mp{suffix}-system", f"team-{suffix}")
    namespace: Any = {"metadata": {"name": rel.watched}}
    crds.core.create_namespace(namespace)
    rel.helm_run(
        "install", rel.name, str(CHART), "--create-namespace", "--wait", "--timeout", "90s",
        "--set", f"operator.watchNamespaces={{{rel.watched}}}",
        # A short resync, as the harness's operator uses: the periodic reconcile rewrites observedGeneration.
        "--set", "operator.resyncSeconds=3",
    )  # fmt: skip
    yield rel
    subprocess.run(
        [str(helm.binary), "uninstall", rel.name, "-n", rel.namespace, "--ignore-not-found"],
        env={"KUBECONFIG": str(crds.kubeconfig)}, capture_output=True, check=False,
    )  # fmt: skip
    for ns in (rel.watched, rel.namespace):
        try:
            crds.core.delete_namespace(ns)
        except ApiException as exc:
            if exc.status != 404:
                raise


@pytest.fixture(scope="module")
def only_the_chart_operator(operator: OperatorProcess) -> Iterator[None]:
    """The session's operator (e2e/conftest.py) watches every namespace: while it runs it reconciles the
    release's namespace too, racing the chart's operator (its Deployments would carry the harness's images)."""
    operator.stop()
    try:
        yield
    finally:
        operator.start()


@pytest.fixture(scope="module")
def chart_operator(release: Release, only_the_chart_operator: None) -> Iterator[DeploymentProcess]:
    health, metrics = free_port(), free_port()
    deployment: Any = release.kube.apps.read_namespaced_deployment(release.operator, release.namespace)
    overrides = {
        "http://0.0.0.0:8080/healthz": f"http://127.0.0.1:{health}/healthz",
        "SERVLANE_METRICS_PORT": str(metrics),
    }
    kubeconfig = release.token_kubeconfig(release.operator)
    process = DeploymentProcess(deployment, kubeconfig, overrides, ARTIFACTS / f"{release.name}-operator.log")
    process.metrics_url = f"http://127.0.0.1:{metrics}/metrics"  # type: ignore[attr-defined]
    wait_until("chart operator liveness", lambda: process.get(f"http://127.0.0.1:{health}/healthz")[0] == 200)
    yield process
    process.stop()


def model_ready(kube: Kube, ns: str) -> bool:
    model = kube.get_model(ns, MODEL)
    status = model.get("status") or {}
    return status.get("phase") == "Ready" and status.get("observedGeneration") == model["metadata"]["generation"]


def test_install_creates_the_workloads_and_service_accounts(release: Release) -> None:
    for name in (release.operator, release.gateway):
        dep: Any = release.kube.apps.read_namespaced_deployment(name, release.namespace)
        assert dep.status.ready_replicas == dep.spec.replicas  # helm --wait; KWOK marks the pods ready
        assert dep.spec.template.spec.service_account_name == name
    roles: Any = release.kube.rbac.list_namespaced_role(release.watched).items
    assert {r.metadata.name for r in roles} == {release.operator, release.gateway}


def test_operator_with_the_charts_service_account_reconciles_a_model_to_ready(
    release: Release, chart_operator: DeploymentProcess
) -> None:
    for path in (TEAM / "models" / f"{MODEL}.yaml", TEAM / "features" / f"{FEATURE}.yaml"):
        release.kube.apply_file(path, release.watched)
    wait_until("the GitOps example AIModel Ready", lambda: model_ready(release.kube, release.watched), timeout=60)
    child: Any = release.kube.apps.read_namespaced_deployment(f"model-{MODEL}", release.watched)
    # The chart's default CPU runtime image: the example model asks for no GPU.
    assert child.spec.template.spec.containers[0].image == "ghcr.io/servlane/runtime:0.1.0-cpu"

    def reconciled_ok() -> bool:
        text = chart_operator.get(chart_operator.metrics_url)[1].decode()  # type: ignore[attr-defined]
        return any(
            line.startswith("servlane_operator_reconciles_total{") and 'result="ok"' in line
            and 'kind="AIModel"' in line and float(line.rsplit(" ", 1)[1]) > 0
            for line in text.splitlines()
        )  # fmt: skip

    wait_until("the chart operator's own successful reconcile", reconciled_ok, timeout=30)
    assert "Forbidden" not in chart_operator.log.read_text()


def test_gateway_with_the_charts_service_account_lists_the_model(
    release: Release, chart_operator: DeploymentProcess
) -> None:
    wait_until("AIModel Ready", lambda: model_ready(release.kube, release.watched), timeout=60)
    port = free_port()
    deployment = release.kube.apps.read_namespaced_deployment(release.gateway, release.namespace)
    gateway = DeploymentProcess(
        deployment,
        release.token_kubeconfig(release.gateway),
        # Both ports free ones here: the chart's 9090 for /metrics may be taken on this machine.
        {"SERVLANE_GATEWAY_PORT": str(port), "SERVLANE_GATEWAY_METRICS_PORT": str(free_port())},
        ARTIFACTS / f"{release.name}-gateway.log",
    )
    try:
        wait_until("gateway /ready", lambda: gateway.get(f"http://127.0.0.1:{port}/ready")[0] == 200, timeout=30)
        status, body = gateway.get(f"http://127.0.0.1:{port}/v1/models")
        assert status == 200
        ids = {m["id"] for m in json.loads(body)["data"]}
        assert {SERVED, FEATURE} <= ids
    finally:
        gateway.stop()
    assert "Forbidden" not in gateway.log.read_text()


def test_upgrade_turns_on_peering_and_uninstall_leaves_only_the_crds(
    release: Release, chart_operator: DeploymentProcess
) -> None:
    chart_operator.stop()  # the standalone operator gives way to the peered one below
    release.helm_run(
        "upgrade", release.name, str(CHART), "--reuse-values", "--wait", "--timeout", "90s",
        "--set", "operator.replicaCount=2",
    )  # fmt: skip
    peering: Any = release.kube.custom.get_namespaced_custom_object(
        "kopf.dev", "v1", release.watched, "kopfpeerings", release.operator
    )
    deployment: Any = release.kube.apps.read_namespaced_deployment(release.operator, release.namespace)
    assert deployment.spec.replicas == 2
    health = free_port()
    peered = DeploymentProcess(
        deployment,
        release.token_kubeconfig(release.operator),
        {"http://0.0.0.0:8080/healthz": f"http://127.0.0.1:{health}/healthz", "SERVLANE_METRICS_PORT": "0"},
        ARTIFACTS / f"{release.name}-operator-peered.log",
    )
    assert peered.args[peered.args.index("--peering") + 1] == peering["metadata"]["name"]
    try:
        # kopf announces itself in the peering object's status: the chart's peering RBAC works.
        def announced() -> bool:
            obj: Any = release.kube.custom.get_namespaced_custom_object(
                "kopf.dev", "v1", release.watched, "kopfpeerings", release.operator
            )
            return bool(obj.get("status"))

        wait_until("the peered operator in the KopfPeering status", announced, timeout=60)
    finally:
        peered.stop()

    release.helm_run("uninstall", release.name, "--wait", "--timeout", "60s")
    selector = f"app.kubernetes.io/instance={release.name}"
    kube = release.kube
    peerings: Any = kube.custom.list_namespaced_custom_object(
        "kopf.dev", "v1", release.watched, "kopfpeerings", label_selector=selector
    )
    leftovers: dict[str, Any] = {
        "deployments": kube.apps.list_namespaced_deployment(release.namespace, label_selector=selector).items,
        "services": kube.core.list_namespaced_service(release.namespace, label_selector=selector).items,
        "serviceaccounts": kube.core.list_namespaced_service_account(release.namespace, label_selector=selector).items,
        "roles": kube.rbac.list_namespaced_role(release.watched, label_selector=selector).items,
        "rolebindings": kube.rbac.list_namespaced_role_binding(release.watched, label_selector=selector).items,
        "clusterroles": kube.rbac.list_cluster_role(label_selector=selector).items,
        "clusterrolebindings": kube.rbac.list_cluster_role_binding(label_selector=selector).items,
        "kopfpeerings": peerings["items"],
    }
    assert {k: len(v) for k, v in leftovers.items() if v} == {}
    crd_list: Any = kube.ext.list_custom_resource_definition().items
    crds = {c.metadata.name for c in crd_list}
    assert {f"aimodels.{GROUP}", f"aifeatures.{GROUP}", "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"} <= crds
