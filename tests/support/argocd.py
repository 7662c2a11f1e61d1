"""A real Argo CD in the local cluster (issue #34): the application controller and the repo-server as local
processes with the Redis they need, as Argo CD's own Procfile runs them, against a git repository that the test
owns, commits to and serves with `git daemon` (git://). Everything they need is in localcluster/argocd-e2e-notes.md
(flags, environment, objects, with references into Argo CD's source).

The binary is built from Go modules by localcluster/build-argocd.sh (scripts/setup.sh runs it). Missing, the
tests skip; with CI=true they fail, as for every real component. The processes log to the cluster's
logs/argocd-*.log, which a failed run keeps (and `ArgoCD.story` adds the ends of to a failure).

Our settings are installed the way users install them: examples/argocd/argocd-cm.yaml's `data` (the health
checks of AIModel and AIFeature, annotation tracking, status never compared) into `argocd-cm`.
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.cluster import LocalCluster, stop_process_groups
from tests.support.polling import wait_until
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "localcluster" / "build-argocd.sh"
EXAMPLES = ROOT / "examples" / "argocd"
NAMESPACE = "argocd"
GROUP_VERSION = "argoproj.io/v1alpha1"
IN_CLUSTER = "https://kubernetes.default.svc"
REFRESH = "argocd.argoproj.io/refresh"
LOG_TAIL_CHARS = 4000
# The upstream settings objects that must exist (empty ones are fine) besides argocd-cm and argocd-secret.
EMPTY_CONFIGMAPS = ("argocd-rbac-cm", "argocd-ssh-known-hosts-cm", "argocd-tls-certs-cm", "argocd-gpg-keys-cm")
# Argo CD's image puts upstream's hack/git-verify-wrapper.sh on PATH and the repo-server runs it on every revision
# (reposerver/repository/repository.go:556, deprecated signature check), failing "permission denied" without it;
# the binary's build has no such file. This one does what upstream's does for unsigned commits: `git verify-commit`,
# its "no signature" (exit 1) not an error.
GIT_VERIFY_WRAPPER = """#!/bin/sh
test -n "$1" || { echo "Wrong usage of git-verify-wrapper.sh" >&2; exit 1; }
out=$(git verify-commit "$1" 2>&1); ret=$?
echo "$out"
if [ "$ret" -eq 1 ]; then exit 0; fi
exit "$ret"
"""
PART_OF = {"app.kubernetes.io/part-of": "argocd"}  # the settings informer lists only objects with this label


def built(script: Path, what: str) -> Path:
    """The folder a localcluster build script prints with --print-path; missing, the test skips (fails in CI)."""
    found = subprocess.run(["bash", str(script), "--print-path"], capture_output=True, text=True)
    if found.returncode == 0:
        return Path(found.stdout.strip())
    message = f"{what} is not built: run {script.relative_to(ROOT)} (scripts/setup.sh does)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def argocd_bin() -> Path:
    """The folder of the argocd multi-call binary and its symlinks (build-argocd.sh --print-path)."""
    return built(BUILD_SCRIPT, "Argo CD")


def kustomize_bin() -> Path:
    """The folder of the kustomize binary the repo-server runs for a kustomization.yaml."""
    return built(ROOT / "localcluster" / "build-kustomize.sh", "kustomize")


def monitoring_crds() -> list[dict[str, Any]]:
    """The Prometheus operator's CRDs (ServiceMonitor, PodMonitor, PrometheusRule, ...), as a cluster with
    kube-prometheus-stack has them (localcluster/build-monitoring-crds.sh generates them from its API module)."""
    folder = built(ROOT / "localcluster" / "build-monitoring-crds.sh", "The Prometheus operator's CRDs")
    return [yaml.safe_load(path.read_text()) for path in sorted(folder.glob("*.yaml"))]


def needed_tools() -> None:
    """redis-server and git on this host (setup.sh installs redis-server); skip, or fail in CI, without them."""
    missing = [tool for tool in ("redis-server", "git") if shutil.which(tool) is None]
    if missing:
        message = f"the Argo CD e2e needs {', '.join(missing)} (scripts/setup.sh installs them)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


class GitRepo:
    """A local git repository the test commits to, served to the repo-server by `git daemon` (git://), a git
    server of the test's own, while `served()` runs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self._git("init", "--quiet", "--initial-branch", "main")
        self._daemon: subprocess.Popen[bytes] | None = None
        self._port = 0

    @property
    def url(self) -> str:
        assert self._daemon is not None, "the repository is served only inside served()"
        return f"git://127.0.0.1:{self._port}/{self.path.name}"

    @contextmanager
    def served(self) -> Iterator[GitRepo]:
        """`git daemon` (Debian's git) exporting this repository read-only on a free loopback port."""
        self._port = free_port()
        log = (self.path.parent / f"git-daemon-{self.path.name}.log").open("ab")
        self._daemon = subprocess.Popen(
            ["git", "daemon", "--reuseaddr", "--listen=127.0.0.1", f"--port={self._port}", "--export-all",
             f"--base-path={self.path.parent}", "--informative-errors", str(self.path)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:

            def answers() -> bool:
                assert self._daemon is not None
                if self._daemon.poll() is not None:
                    raise AssertionError(f"git daemon exited with {self._daemon.returncode}")
                listed = subprocess.run(["git", "ls-remote", self.url], capture_output=True, timeout=10)
                return listed.returncode == 0

            wait_until("git daemon", answers, timeout=30, interval=0.1)
            yield self
        finally:
            stop_process_groups([self._daemon.pid], timeout=5)
            self._daemon.wait(timeout=5)
            self._daemon = None
            log.close()

    def _git(self, *args: str) -> str:
        env = {
            **os.environ,
            "GIT_AUTHOR_NAME": "e2e",
            "GIT_AUTHOR_EMAIL": "e2e@servlane.invalid",
            "GIT_COMMITTER_NAME": "e2e",
            "GIT_COMMITTER_EMAIL": "e2e@servlane.invalid",
        }
        done = subprocess.run(["git", "-C", str(self.path), *args], capture_output=True, text=True, env=env)
        assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
        return done.stdout.strip()

    def write(self, relative: str, obj: dict[str, Any]) -> None:
        path = self.path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(obj, sort_keys=False))

    def remove(self, relative: str) -> None:
        self._git("rm", "--quiet", relative)

    def commit(self, message: str) -> str:
        """Commits everything in the tree; returns the new revision (the SHA Argo CD reports as synced)."""
        self._git("add", "--all")
        self._git("commit", "--quiet", "--message", message)
        return self._git("rev-parse", "HEAD")


@dataclass
class ArgoCD:
    """Redis, the repo-server and the application controller of `bin_dir`, on free loopback ports, reconciling
    Applications in the `argocd` namespace of `cluster` (the in-cluster destination is this cluster)."""

    cluster: LocalCluster
    bin_dir: Path
    workdir: Path
    extra_settings: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def log_path(self, name: str) -> Path:
        return self.cluster.workdir / "logs" / f"argocd-{name}.log"

    # --- the objects Argo CD reads before it starts -------------------------------------------------------
    def install_objects(self) -> None:
        c = self.cluster
        self._create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        for crd_file in sorted((self.bin_dir.parent / "crds").glob("*.yaml")):
            crd = yaml.safe_load(crd_file.read_text())
            self._create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
            name = crd["metadata"]["name"]

            def established(name: str = name) -> bool:
                got = c.api("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                conditions = (got.get("status") or {}).get("conditions") or []
                return any(x["type"] == "Established" and x["status"] == "True" for x in conditions)

            wait_until(f"CRD {name} established", established, timeout=30, interval=0.2)
        # argocd-cm as users install it: examples/argocd/argocd-cm.yaml's data (our health checks and settings).
        shipped = yaml.safe_load((EXAMPLES / "argocd-cm.yaml").read_text())
        assert shipped["metadata"]["labels"]["app.kubernetes.io/part-of"] == "argocd", shipped["metadata"]
        data = {**shipped["data"], **self.extra_settings}
        self._configmap("argocd-cm", data)
        for name in EMPTY_CONFIGMAPS:
            self._configmap(name, {})
        key = base64.b64encode(secrets.token_bytes(32)).decode()
        secret = {
            "metadata": {"name": "argocd-secret", "labels": {"app.kubernetes.io/name": "argocd-secret", **PART_OF}},
            "stringData": {"server.secretkey": key},
        }
        self._create(f"/api/v1/namespaces/{NAMESPACE}/secrets", secret)
        # The default AppProject: the API server creates it; this setup runs none.
        project = {
            "apiVersion": GROUP_VERSION,
            "kind": "AppProject",
            "metadata": {"name": "default"},
            "spec": {
                "sourceRepos": ["*"],
                "destinations": [{"server": "*", "namespace": "*"}],
                "clusterResourceWhitelist": [{"group": "*", "kind": "*"}],
            },
        }
        self._create(f"/apis/{GROUP_VERSION}/namespaces/{NAMESPACE}/appprojects", project)

    def _configmap(self, name: str, data: dict[str, str]) -> None:
        body = {"metadata": {"name": name, "labels": {"app.kubernetes.io/name": name, **PART_OF}}, "data": data}
        self._create(f"/api/v1/namespaces/{NAMESPACE}/configmaps", body)

    def _create(self, path: str, body: dict[str, Any]) -> None:
        try:
            self.cluster.api("POST", path, body)
        except urllib.error.HTTPError as exc:
            if exc.code != 409:
                raise AssertionError(f"POST {path}: {exc.code} {exc.read().decode(errors='replace')}") from None

    # --- processes -------------------------------------------------------------------------------------------
    def _start(self, name: str, args: list[str], env: dict[str, str]) -> None:
        self.log_path(name).parent.mkdir(parents=True, exist_ok=True)
        with self.log_path(name).open("ab") as log:
            self.procs[name] = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True,
                cwd=self.workdir,
            )  # fmt: skip

    def _answers(self, name: str, url: str) -> bool:
        proc = self.procs[name]
        if proc.poll() is not None:
            raise AssertionError(f"argocd {name} exited with {proc.returncode}:\n{self.tail(name)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.install_objects()
        redis_port, repo_port, repo_metrics, controller_metrics = free_port(), free_port(), free_port(), free_port()
        redis = f"127.0.0.1:{redis_port}"
        self._start(
            "redis",
            [shutil.which("redis-server") or "redis-server", "--save", "", "--appendonly", "no",
             "--port", str(redis_port), "--bind", "127.0.0.1", "--dir", str(self.workdir)],
            {},
        )  # fmt: skip
        for folder in ("tls", "ssh", "gnupg", "app"):
            (self.workdir / folder).mkdir(exist_ok=True)
        (self.workdir / "gnupg").chmod(0o700)
        tools = self.workdir / "bin"
        tools.mkdir(exist_ok=True)
        (tools / "git-verify-wrapper.sh").write_text(GIT_VERIFY_WRAPPER)
        (tools / "git-verify-wrapper.sh").chmod(0o755)
        # git, helm (the control plane's) and kustomize on PATH for the repo-server; its folders in the workdir,
        # not /app or /tmp (its checkouts go to $TMPDIR/_argocd-repo).
        k8s_bin = str(self.cluster.bins["kube-apiserver"].parent) if self.cluster.bins else ""
        (self.workdir / "tmp").mkdir(exist_ok=True)
        path = (str(tools), k8s_bin, str(kustomize_bin()), os.environ.get("PATH", ""))
        repo_env = {
            "PATH": os.pathsep.join(p for p in path if p),
            "TMPDIR": str(self.workdir / "tmp"),
            "ARGOCD_GPG_ENABLED": "false",
            "ARGOCD_TLS_DATA_PATH": str(self.workdir / "tls"),
            "ARGOCD_SSH_DATA_PATH": str(self.workdir / "ssh"),
            "ARGOCD_GNUPGHOME": str(self.workdir / "gnupg"),
            "ARGOCD_APP_CONF_PATH": str(self.workdir / "app"),
            "ARGOCD_ASK_PASS_SOCK": str(self.workdir / "ask-pass.sock"),
            "ARGOCD_BINARY_NAME": "argocd-repo-server",
        }
        self._start(
            "repo-server",
            [str(self.bin_dir / "argocd"), "--address", "127.0.0.1", "--port", str(repo_port),
             "--metrics-address", "127.0.0.1", "--metrics-port", str(repo_metrics), "--redis", redis,
             "--disable-tls", "--client-ca-path", "", "--loglevel", "info", "--logformat", "text"],
            repo_env,
        )  # fmt: skip
        wait_until(
            "the Argo CD repo-server",
            lambda: self._answers("repo-server", f"http://127.0.0.1:{repo_metrics}/healthz?full=true"),
            timeout=60,
            interval=0.2,
        )
        controller_env = {
            "ARGOCD_FAKE_IN_CLUSTER": "true",  # the in-cluster destination from KUBECONFIG, not a pod's token
            "KUBECONFIG": str(self.cluster.kubeconfig),
            "ARGOCD_BINARY_NAME": "argocd-application-controller",
        }
        self._start(
            "application-controller",
            [str(self.bin_dir / "argocd"), "--kubeconfig", str(self.cluster.kubeconfig), "--namespace", NAMESPACE,
             "--repo-server", f"127.0.0.1:{repo_port}", "--repo-server-plaintext", "--redis", redis,
             "--metrics-port", str(controller_metrics), "--loglevel", "info", "--logformat", "text",
             # Each resource's health in the Application's status, where the tests read it (off by default
             # since Argo CD 3.0, which keeps it in Redis for the API server and UI).
             "--persist-resource-health"],
            controller_env,
        )  # fmt: skip
        wait_until(
            "the Argo CD application controller",
            lambda: self._answers("application-controller", f"http://127.0.0.1:{controller_metrics}/healthz"),
            timeout=60,
            interval=0.2,
        )

    def stop(self) -> None:
        pids = [p.pid for p in reversed(self.procs.values()) if p.poll() is None]
        stop_process_groups(pids, timeout=15)
        for proc in self.procs.values():
            proc.wait(timeout=5)
        self.procs.clear()

    def tail(self, name: str) -> str:
        try:
            return self.log_path(name).read_text(errors="replace")[-LOG_TAIL_CHARS:]
        except OSError as exc:
            return f"(no log: {exc})"

    def story(self) -> str:
        """The end of each process's log, for a failure message (the whole logs stay in the cluster's logs/)."""
        return "\n".join(
            f"--- argocd {name} ({self.log_path(name)}), last {LOG_TAIL_CHARS} chars ---\n{self.tail(name)}"
            for name in ("application-controller", "repo-server")
        )

    # --- Applications ----------------------------------------------------------------------------------------
    def apps_path(self, name: str = "") -> str:
        return f"/apis/{GROUP_VERSION}/namespaces/{NAMESPACE}/applications" + (f"/{name}" if name else "")

    def create_app(self, app: dict[str, Any]) -> None:
        self.cluster.api("POST", self.apps_path(), app)

    def app(self, name: str) -> dict[str, Any]:
        got: dict[str, Any] = self.cluster.api("GET", self.apps_path(name))
        return got

    def refresh(self, name: str, kind: str = "hard") -> None:
        """Asks the controller to compare the app with git now (hard: past the repo-server's caches), as
        `argocd app get --hard-refresh` does; the controller removes the annotation when it has."""
        patch = {"metadata": {"annotations": {REFRESH: kind}}}
        self.cluster.api("PATCH", self.apps_path(name), patch, content_type="application/merge-patch+json")

    def compared(self, name: str) -> dict[str, Any] | None:
        """The app's summary once the controller has done the refresh asked for (it takes the annotation away
        with the status of that comparison); None before. Poll it after refresh()."""
        app = self.app(name)
        return summary(app) if REFRESH not in (app["metadata"].get("annotations") or {}) else None

    def delete_app(self, name: str) -> None:
        try:
            self.cluster.api("DELETE", self.apps_path(name))
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise


def team_application(repo: GitRepo, name: str, namespace: str) -> dict[str, Any]:
    """examples/argocd/apps/team-search.yaml (its sync policy and options as shipped) named `name`, syncing the
    `team` folder of the test's repository into `namespace` of the cluster Argo CD runs in."""
    app: dict[str, Any] = yaml.safe_load((EXAMPLES / "apps" / "team-search.yaml").read_text())
    app["metadata"]["name"] = name
    app["spec"]["source"] = {"repoURL": repo.url, "targetRevision": "main", "path": "team"}
    assert app["spec"]["destination"]["server"] == IN_CLUSTER, app["spec"]
    app["spec"]["destination"]["namespace"] = namespace
    assert app["spec"]["syncPolicy"]["automated"] == {"prune": True, "selfHeal": True}, app["spec"]
    return app


def summary(app: dict[str, Any]) -> dict[str, Any]:
    """What a test reads of an Application: sync and health, the synced revision, each resource's state, the
    conditions and the last operation's phase and message."""
    status = app.get("status") or {}
    operation = status.get("operationState") or {}
    return {
        "sync": (status.get("sync") or {}).get("status"),
        "revision": (status.get("sync") or {}).get("revision"),
        # Each source's (an Application with `sources`, such as a chart with its values from another repository,
        # reports these instead of `revision`).
        "revisions": (status.get("sync") or {}).get("revisions") or [(status.get("sync") or {}).get("revision")],
        "health": (status.get("health") or {}).get("status"),
        "resources": {
            f"{r['kind']}/{r['name']}": (r.get("status"), (r.get("health") or {}).get("status"))
            for r in status.get("resources") or []
        },
        "health_messages": {
            f"{r['kind']}/{r['name']}": (r.get("health") or {}).get("message") for r in status.get("resources") or []
        },
        "conditions": [f"{c.get('type')}: {c.get('message')}" for c in status.get("conditions") or []],
        "operation": f"{operation.get('phase')}: {operation.get('message')}" if operation else None,
        "operation_started": operation.get("startedAt"),
        # What the last sync applied: a self-heal is a partial sync of what drifted (and not in the history).
        "operation_synced": sorted(
            f"{r['kind']}/{r['name']}" for r in (operation.get("syncResult") or {}).get("resources") or []
        ),
        "history": len(status.get("history") or []),
        "reconciled_at": status.get("reconciledAt"),
    }


@contextmanager
def running_argocd(cluster: LocalCluster, workdir: Path, **settings: str) -> Iterator[ArgoCD]:
    """Argo CD started (objects, Redis, repo-server, controller), stopped afterwards."""
    needed_tools()
    argocd = ArgoCD(cluster, argocd_bin(), workdir, extra_settings=settings)
    try:
        started = time.monotonic()
        argocd.start()
        print(f"\nArgo CD up in {time.monotonic() - started:.1f}s (logs: {argocd.log_path('*')})")
        yield argocd
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{argocd.story()}") from None
    finally:
        argocd.stop()
