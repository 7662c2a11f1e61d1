"""What e2e tests need around a real cluster: admin API access, the operator as a real process running
as its least-privilege ServiceAccount, polling with deadlines, and dumps for failed tests."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from localcluster.cluster import stop_process_groups
from tests.support import polling
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
# What scripts/build-images.sh tags (the chart's appVersion); the real node imports them from Docker.
RUNTIME_CPU_IMAGE = "ghcr.io/servlane/runtime:0.1.0-cpu"
OPERATOR_IMAGE = "ghcr.io/servlane/operator:0.1.0"
GATEWAY_IMAGE = "ghcr.io/servlane/gateway:0.1.0"
ARTIFACTS = ROOT / ".artifacts"
GROUP, VERSION = "servlane.dev", "v1alpha1"
OPERATOR_NS = "servlane-system"
# Not the chart's name for it ("<release>-operator" is "servlane-operator" for a release named servlane): an
# operator process started by one e2e module must leave nothing a later `helm install` in the same cluster
# finds owned by no release (Helm refuses to adopt it, and the install fails).
OPERATOR_SA = "servlane-operator-e2e"
OPERATOR_ROLE = "servlane-operator-e2e"  # its ClusterRole and ClusterRoleBinding
PLURALS = {"AIModel": "aimodels", "AIFeature": "aifeatures", "CustomResourceDefinition": "customresourcedefinitions"}
T = TypeVar("T")


def unavailable(reason: str) -> NoReturn:
    """A prerequisite is missing: skip here, fail in CI (CI=true), where every real component must be there."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"e2e prerequisites missing in CI: {reason}")
    pytest.skip(reason)


def _not_there_yet(exc: Exception) -> bool:
    """A 404 (not created yet, already gone) or 409 (a concurrent write) is worth another look."""
    return isinstance(exc, ApiException) and exc.status in (404, 409)


def wait_until(what: str, check: Callable[[], T | None], timeout: float = 60, interval: float = 0.25) -> T:
    """polling.wait_until, where the API server's 404 and 409 count as "not yet"."""
    return polling.wait_until(what, check, timeout, interval, tolerate=_not_there_yet)


def present(value: T | None, what: str) -> T:
    """`value`, which the client types Optional but the API server always sets where we read it; a clear
    failure naming `what` if it is missing after all."""
    if value is None:
        raise AssertionError(f"{what} is not set")
    return value


def json_object(value: object, what: str) -> dict[str, Any]:
    """A custom-objects API answer (parsed JSON, which the client types `object`) as the JSON object it is."""
    if not isinstance(value, dict):
        raise AssertionError(f"{what}: expected a JSON object, got {type(value).__name__}")
    return dict(value)


def pod_spec(deployment: client.V1Deployment) -> client.V1PodSpec:
    """The pod spec of a Deployment's template (always set on the operator's Deployments)."""
    return present(deployment.spec.template.spec, "the pod template's spec")


@dataclass
class Kube:
    """Admin access to the cluster under test."""

    kubeconfig: Path
    api: client.ApiClient = field(init=False)

    def __post_init__(self) -> None:
        self.api = config.new_client_from_config(config_file=str(self.kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.autoscaling = client.AutoscalingV2Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.rbac = client.RbacAuthorizationV1Api(self.api)
        self.ext = client.ApiextensionsV1Api(self.api)

    def server_and_ca(self) -> tuple[str, str]:
        cfg = self.api.configuration
        return cfg.host, cfg.ssl_ca_cert

    # --- AIModel and AIFeature helpers: one generic body, named wrappers for readable tests ---
    def create_object(self, kind: str, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name}, "spec": spec}
        created = self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURALS[kind], body)
        return json_object(created, f"created {kind} {namespace}/{name}")

    def get_object(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        got = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURALS[kind], name)
        return json_object(got, f"{kind} {namespace}/{name}")

    def patch_object(self, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        plural = PLURALS[kind]
        patched = self.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, plural, name, patch)
        return json_object(patched, f"patched {kind} {namespace}/{name}")

    def create_model(self, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return self.create_object("AIModel", namespace, name, spec)

    def get_model(self, namespace: str, name: str) -> dict[str, Any]:
        return self.get_object("AIModel", namespace, name)

    def patch_model(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.patch_object("AIModel", namespace, name, patch)

    def delete_model(self, namespace: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURALS["AIModel"], name)

    def create_feature(self, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return self.create_object("AIFeature", namespace, name, spec)

    def delete_feature(self, namespace: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURALS["AIFeature"], name)

    def get_feature(self, namespace: str, name: str) -> dict[str, Any]:
        return self.get_object("AIFeature", namespace, name)

    def patch_feature(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.patch_object("AIFeature", namespace, name, patch)

    def condition(self, namespace: str, name: str, kind: str) -> dict[str, Any] | None:
        status = self.get_model(namespace, name).get("status") or {}
        return next((c for c in status.get("conditions", []) if c["type"] == kind), None)

    def phase(self, namespace: str, name: str) -> str | None:
        return (self.get_model(namespace, name).get("status") or {}).get("phase")

    def apply_file(self, path: Path, namespace: str | None = None) -> list[dict[str, Any]]:
        """Server-side applies every document of a YAML file as admin."""
        applied = []
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                applied.append(self.apply(doc, namespace))
        return applied

    def apply(self, obj: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        version, kind = obj["apiVersion"], obj["kind"]
        prefix = f"/api/{version}" if "/" not in version else f"/apis/{version}"
        ns_part = f"/namespaces/{namespace}" if namespace else ""
        path = f"{prefix}{ns_part}/{PLURALS[kind]}/{obj['metadata']['name']}"
        method, url, headers, body, _ = self.api.param_serialize(
            "PATCH",
            path,
            query_params=[("fieldManager", "e2e-admin"), ("force", "true")],
            header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
            body=obj,
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(method, url, header_params=headers, body=body)
        # read() returns the body that it stores in resp.data (which the client declares as always None).
        data: bytes = resp.read()
        if resp.status >= 400:
            raise ApiException(http_resp=resp)
        return dict(json.loads(data))


def install_crds(kube: Kube) -> None:
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        (crd,) = kube.apply_file(path)
        name = crd["metadata"]["name"]

        def established(name: str = name) -> bool:
            status = present(kube.ext.read_custom_resource_definition(name).status, f"CRD {name} status")
            conditions = status.conditions or []
            return any(c.type == "Established" and c.status == "True" for c in conditions)

        wait_until(f"CRD {name} established", established, timeout=30)


def operator_rbac(kube: Kube) -> None:
    """The operator's ServiceAccount bound to the chart's least-privilege rules."""
    rules: list[dict[str, Any]] = yaml.safe_load((ROOT / "charts/servlane/files/operator-rules.yaml").read_text())
    _create_unless_exists(lambda: kube.core.create_namespace(namespace_body(OPERATOR_NS)))
    account = client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=OPERATOR_SA))
    _create_unless_exists(lambda: kube.core.create_namespaced_service_account(OPERATOR_NS, account))
    role = client.V1ClusterRole(
        metadata=client.V1ObjectMeta(name=OPERATOR_ROLE),
        rules=[client.V1PolicyRule.model_validate(rule) for rule in rules],
    )
    _create_unless_exists(lambda: kube.rbac.create_cluster_role(role))
    binding = client.V1ClusterRoleBinding(
        metadata=client.V1ObjectMeta(name=OPERATOR_ROLE),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=OPERATOR_ROLE),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name=OPERATOR_SA, namespace=OPERATOR_NS)],
    )
    _create_unless_exists(lambda: kube.rbac.create_cluster_role_binding(binding))


def namespace_body(name: str) -> client.V1Namespace:
    return client.V1Namespace(metadata=client.V1ObjectMeta(name=name))


def _create_unless_exists(create: Callable[[], object]) -> None:
    """Runs `create`; an object that is already there (409) is fine."""
    try:
        create()
    except ApiException as exc:
        if exc.status != 409:
            raise


def service_account_kubeconfig(
    kube: Kube, path: Path, account: str = OPERATOR_SA, namespace: str = OPERATOR_NS
) -> Path:
    """A kubeconfig holding a bound ServiceAccount token (TokenRequest), not admin credentials: the harness's
    operator account by default, or another (such as the one a chart release created)."""
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(expiration_seconds=6 * 3600))
    answer = kube.core.create_namespaced_service_account_token(account, namespace, request)
    token = present(present(answer.status, "TokenRequest status").token, "TokenRequest token")
    server, ca = kube.server_and_ca()
    config_doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "sa",
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority": ca}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}],
    }
    path.write_text(json.dumps(config_doc))
    return path


E2E_GATEWAY_NAMESPACE = "servlane-system"


@dataclass
class OperatorProcess:
    """`python -m servlane_operator` as a real process, with the ServiceAccount kubeconfig."""

    kubeconfig: Path
    log_path: Path
    resync_seconds: float = 3
    extra_env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    health_port: int = 0
    metrics_port: int = 0

    def start(self) -> None:
        self.health_port, self.metrics_port = free_port(), free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "SERVLANE_RESYNC_SECONDS": str(self.resync_seconds),
            "SERVLANE_METRICS_PORT": str(self.metrics_port),
            "SERVLANE_RUNTIME_IMAGE_GPU": "servlane/runtime:e2e-cuda",
            "SERVLANE_RUNTIME_IMAGE_CPU": "servlane/runtime:e2e-cpu",
            # Required (the operator trusts the gateway's labels only in its namespace); the chart's default.
            "SERVLANE_GATEWAY_NAMESPACE": E2E_GATEWAY_NAMESPACE,
            **self.extra_env,
        }
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the process
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "servlane_operator",
                "--log-format",
                "full",
                "--liveness",
                f"http://127.0.0.1:{self.health_port}/healthz",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
        )
        wait_until("operator liveness", self._alive, timeout=60)

    def _alive(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited with {self.proc.returncode}; see {self.log_path}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL, as a crash or an evicted pod would: no cleanup runs."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            stop_process_groups([self.proc.pid], timeout=10)
            self.proc.wait(timeout=5)
            self.proc = None

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return str(r.read().decode())


def dump_namespace(kube: Kube, namespace: str, out: Path) -> None:
    """Pods, events and Servlane objects of a failed test's namespace, for the CI log and artifacts."""
    out.mkdir(parents=True, exist_ok=True)
    api = kube.api
    dumps = {
        "pods": api.sanitize_for_serialization(kube.core.list_namespaced_pod(namespace)),
        "events": api.sanitize_for_serialization(kube.core.list_namespaced_event(namespace)),
        "deployments": api.sanitize_for_serialization(kube.apps.list_namespaced_deployment(namespace)),
        "aimodels": kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "aimodels"),
        "aifeatures": kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "aifeatures"),
    }
    for name, data in dumps.items():
        (out / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    events = [
        f"{e['type']} {e['reason']} {e['involvedObject']['kind']}/{e['involvedObject']['name']}: {e['message']}"
        for e in dumps["events"]["items"]
    ]
    print(f"\n--- dump of namespace {namespace} in {out} ---\n" + "\n".join(events[-30:]))


_METRICS_URLS: dict[str, str] = {}


def metrics_url_of(gateway_url: str) -> str:
    """The /metrics URL of a gateway that watching_gateway started (on its metrics port, not the API's)."""
    return _METRICS_URLS[gateway_url]


@contextlib.contextmanager
def watching_gateway(kube: Kube, log_name: str, *args: str) -> Iterator[str]:
    """`python -m servlane_gateway --watch` against the test cluster (admin kubeconfig), its output in
    ARTIFACTS/<log_name>; yields its base URL once /ready answers 200, stops its process group after.
    Its /metrics, on a port of its own: metrics_url_of(that URL)."""
    port, metrics_port = free_port(), free_port()
    log = open(ARTIFACTS / log_name, "ab")  # noqa: SIM115 - handed to the process
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig)}
    command = [sys.executable, "-m", "servlane_gateway", "--watch", *args, "--port", str(port), "--host", "127.0.0.1"]
    command += ["--metrics-port", str(metrics_port)]
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    _METRICS_URLS[url] = f"http://127.0.0.1:{metrics_port}/metrics"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(url + "/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    try:
        wait_until("gateway ready", ready, timeout=30)
        yield url
    finally:
        stop_process_groups([proc.pid], timeout=10)
        proc.wait(timeout=5)
        log.close()
