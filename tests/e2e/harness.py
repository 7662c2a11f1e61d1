"""What e2e tests need around a real cluster: admin API access, the operator as a real process running
as its least-privilege ServiceAccount, polling with deadlines, and dumps for failed tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from e2e.cluster.localcluster import free_port, stop_process_groups
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tests import polling

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / ".artifacts"
GROUP, VERSION = "modelplane.dev", "v1alpha1"
OPERATOR_NS = "modelplane-system"
OPERATOR_SA = "modelplane-operator"
PLURALS = {"AIModel": "aimodels", "AIFeature": "aifeatures", "CustomResourceDefinition": "customresourcedefinitions"}
T = TypeVar("T")


def _not_there_yet(exc: Exception) -> bool:
    """A 404 (not created yet, already gone) or 409 (a concurrent write) is worth another look."""
    return isinstance(exc, ApiException) and exc.status in (404, 409)


def wait_until(what: str, check: Callable[[], T | None], timeout: float = 60, interval: float = 0.25) -> T:
    """polling.wait_until, where the API server's 404 and 409 count as "not yet"."""
    return polling.wait_until(what, check, timeout, interval, tolerate=_not_there_yet)


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
        return dict(self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURALS[kind], body))

    def get_object(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURALS[kind], name))

    def patch_object(self, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        plural = PLURALS[kind]
        return dict(self.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, plural, name, patch))

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
        resp.read()
        if resp.status >= 400:
            raise ApiException(http_resp=resp)
        return dict(json.loads(resp.data))


def install_crds(kube: Kube) -> None:
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        (crd,) = kube.apply_file(path)
        name = crd["metadata"]["name"]

        def established(name: str = name) -> bool:
            conditions = kube.ext.read_custom_resource_definition(name).status.conditions or []
            return any(c.type == "Established" and c.status == "True" for c in conditions)

        wait_until(f"CRD {name} established", established, timeout=30)


def operator_rbac(kube: Kube) -> None:
    """The operator's ServiceAccount bound to the chart's least-privilege rules."""
    rules = yaml.safe_load((ROOT / "charts/modelplane/files/operator-rules.yaml").read_text())
    try:
        kube.core.create_namespace({"metadata": {"name": OPERATOR_NS}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    objects = [
        (kube.core.create_namespaced_service_account, {"metadata": {"name": OPERATOR_SA}}, True),
        (kube.rbac.create_cluster_role, {"metadata": {"name": "modelplane-operator-e2e"}, "rules": rules}, False),
        (
            kube.rbac.create_cluster_role_binding,
            {
                "metadata": {"name": "modelplane-operator-e2e"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "modelplane-operator-e2e",
                },
                "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": OPERATOR_NS}],
            },
            False,
        ),
    ]
    for create, body, namespaced in objects:
        try:
            create(OPERATOR_NS, body) if namespaced else create(body)
        except ApiException as exc:
            if exc.status != 409:
                raise


def service_account_kubeconfig(kube: Kube, path: Path) -> Path:
    """A kubeconfig holding a bound ServiceAccount token (TokenRequest), not admin credentials."""
    request = {"spec": {"expirationSeconds": 6 * 3600}}
    token = kube.core.create_namespaced_service_account_token(OPERATOR_SA, OPERATOR_NS, request).status.token
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


@dataclass
class OperatorProcess:
    """`python -m modelplane_operator` as a real process, with the ServiceAccount kubeconfig."""

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
            "MODELPLANE_RESYNC_SECONDS": str(self.resync_seconds),
            "MODELPLANE_METRICS_PORT": str(self.metrics_port),
            "MODELPLANE_RUNTIME_IMAGE": "modelplane/runtime:e2e",
            **self.extra_env,
        }
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the process
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "modelplane_operator",
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
    """Pods, events and Modelplane objects of a failed test's namespace, for the CI log and artifacts."""
    out.mkdir(parents=True, exist_ok=True)
    sanitize = kube.api.sanitize_for_serialization
    dumps = {
        "pods": sanitize(kube.core.list_namespaced_pod(namespace)),
        "events": sanitize(kube.core.list_namespaced_event(namespace)),
        "deployments": sanitize(kube.apps.list_namespaced_deployment(namespace)),
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
