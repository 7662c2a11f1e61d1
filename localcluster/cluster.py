"""A real local Kubernetes control plane as processes: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and KWOK, with fake GPU nodes. `python -m localcluster up|down|build`.

Every wait polls with a deadline; each component logs to <workdir>/logs/<name>.log, kept for failed runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localcluster import pki
from localcluster.build_scripts import run_build_script
from localcluster.nodes import FAKE_NODES, cpu_nodes

HERE = Path(__file__).resolve().parent
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "kwok-stages",
    "helm",
)
STATE_FILE = "cluster.json"


class ClusterError(RuntimeError):
    pass


def build_binaries() -> Path:
    """Runs build.sh (a no-op when the cache already holds this pinned set) and returns the bin folder."""
    return run_build_script("build.sh", ClusterError, "the control plane")


def binary_paths(bin_dir: Path | None = None) -> dict[str, Path]:
    """Each binary from $KUBEBUILDER_ASSETS when it is there (the envtest convention), else from the cache."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    paths: dict[str, Path] = {}
    for name in BINARIES:
        if assets and (Path(assets) / name).is_file():
            paths[name] = Path(assets) / name
    missing = [n for n in BINARIES if n not in paths]
    if missing:
        bin_dir = bin_dir or build_binaries()
        paths.update({n: bin_dir / n for n in missing})
    return paths


# Below the kernel's ephemeral range (ip_local_port_range, 32768-60999 by default). A port there that was
# free a moment ago can become the source port of any outgoing connection before our server binds it: CI
# saw the operator container's liveness port taken that way ("address already in use"). The kernel never
# picks a port below that range on its own.
_LOWEST_PORT = 10000


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port that can be bound now, chosen at random below the ephemeral range (see above)."""
    chooser = random.SystemRandom()
    for _ in range(200):
        port = chooser.randrange(_LOWEST_PORT, max(_LOWEST_PORT + 1, _ephemeral_start()))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port below the ephemeral port range")


def answers_ok(url: str, context: ssl.SSLContext | None = None) -> Callable[[], bool]:
    """A readiness check for wait_for: the URL answers 200 (connection errors count as not yet)."""

    def check() -> bool:
        with urllib.request.urlopen(url, context=context, timeout=5) as response:
            return bool(response.status == 200)

    return check


def wait_for(what: str, check: Callable[[], bool], timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ClusterError(f"{what}: process exited with {proc.returncode}")
        try:
            if check():
                return
        except (OSError, urllib.error.URLError, ValueError):
            pass
        time.sleep(0.2)  # polling interval of a deadline-bounded wait
    raise ClusterError(f"{what}: not ready after {timeout:.0f}s")


@dataclass
class LocalCluster:
    workdir: Path
    bins: dict[str, Path] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    extra_cpu_nodes: int = 0
    # Opt-in: one real worker node (containerd, runc, CNI, kubelet) beside the KWOK nodes; see realnode.py.
    real_node: bool = False
    real_node_kube_proxy: bool = False
    extra_apiserver_args: list[str] = field(default_factory=list)
    node: Any = None  # the RealNode, when real_node

    @property
    def pki_dir(self) -> Path:
        return self.workdir / "pki"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    # --- talking to the API server as admin, without any client library ---
    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki_dir / "ca.crt"))
        ctx.load_cert_chain(str(self.pki_dir / "admin.crt"), str(self.pki_dir / "admin.key"))
        return ctx

    def api(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Content-Type", content_type)
        with urllib.request.urlopen(req, context=self._ssl(), timeout=30) as resp:
            return json.loads(resp.read() or b"null")

    # --- processes ---
    def _start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = open(logs / f"{name}.log", "ab")  # noqa: SIM115 - the process owns it until down()
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True
        )
        self.procs[name] = proc
        return proc

    def up(self, timeout: float = 120) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self.bins:
            self.bins = binary_paths()
        pki.generate(self.pki_dir, extra_ips=self._real_node_addresses())
        for name in ("etcd", "etcd_peer", "apiserver", "kcm", "scheduler", "kwok"):
            self.ports[name] = free_port()
        try:
            self._up_etcd(timeout)
            self._up_apiserver(timeout)
            self._write_kubeconfig()
            self._up_controllers(timeout)
            self._up_kwok(timeout)
            self._create_nodes(timeout)
            if self.real_node:
                self._up_real_node(timeout)
        except BaseException:
            self.down()
            raise
        self._save_state()

    def _up_etcd(self, timeout: float) -> None:
        p, peer = self.ports["etcd"], self.ports["etcd_peer"]
        proc = self._start(
            "etcd",
            [
                str(self.bins["etcd"]),
                "--name=node0",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{p}",
                f"--advertise-client-urls=http://127.0.0.1:{p}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=node0=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync=true",
                "--auto-compaction-retention=1",
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{p}/health", timeout=2) as r:
                return bool(json.loads(r.read()).get("health") == "true")

        wait_for("etcd", healthy, timeout, proc)

    def _up_apiserver(self, timeout: float) -> None:
        d = self.pki_dir
        proc = self._start(
            "kube-apiserver",
            [
                str(self.bins["kube-apiserver"]),
                f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
                # Pods on a real node reach it through the `kubernetes` Service (the node's address); with
                # KWOK nodes alone nothing but this machine's loopback needs it.
                f"--bind-address={'0.0.0.0' if self.real_node else '127.0.0.1'}",
                f"--secure-port={self.ports['apiserver']}",
                f"--cert-dir={self.workdir / 'certs'}",
                f"--tls-cert-file={d / 'apiserver.crt'}",
                f"--tls-private-key-file={d / 'apiserver.key'}",
                f"--client-ca-file={d / 'ca.crt'}",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                "--service-cluster-ip-range=10.0.0.0/16",
                f"--service-account-key-file={d / 'sa.pub'}",
                f"--service-account-signing-key-file={d / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--proxy-client-cert-file={d / 'admin.crt'}",
                f"--proxy-client-key-file={d / 'admin.key'}",
                "--etcd-prefix=/registry",
                "--v=1",
                *self._real_node_apiserver_args(),
                *self.extra_apiserver_args,
            ],
        )

        wait_for("kube-apiserver /readyz", answers_ok(self.server + "/readyz", self._ssl()), timeout, proc)

    def _write_kubeconfig(self) -> None:
        d = self.pki_dir
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "local", "cluster": {"server": self.server, "certificate-authority": str(d / "ca.crt")}}
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {"client-certificate": str(d / "admin.crt"), "client-key": str(d / "admin.key")},
                }
            ],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
            "current-context": "local",
        }
        self.kubeconfig.write_text(json.dumps(config, indent=2))  # JSON is valid kubeconfig YAML

    def _healthz(self, port: int) -> Callable[[], bool]:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # self-signed component cert
        return answers_ok(f"https://127.0.0.1:{port}/healthz", ctx)

    def _up_controllers(self, timeout: float) -> None:
        kc, d = str(self.kubeconfig), self.pki_dir
        common = [
            f"--kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            "--v=1",
        ]
        kcm = self._start(
            "kube-controller-manager",
            [
                str(self.bins["kube-controller-manager"]),
                *common,
                f"--secure-port={self.ports['kcm']}",
                f"--root-ca-file={d / 'ca.crt'}",
                f"--service-account-private-key-file={d / 'sa.key'}",
                "--use-service-account-credentials=false",
                "--node-monitor-grace-period=40s",
            ],
        )
        sched = self._start(
            "kube-scheduler",
            [
                str(self.bins["kube-scheduler"]),
                *common,
                f"--secure-port={self.ports['scheduler']}",
            ],
        )
        wait_for("kube-controller-manager", self._healthz(self.ports["kcm"]), timeout, kcm)
        wait_for("kube-scheduler", self._healthz(self.ports["scheduler"]), timeout, sched)

    def _up_kwok(self, timeout: float) -> None:
        stages = subprocess.run([str(self.bins["kwok-stages"])], capture_output=True, text=True, check=True).stdout
        kwok_dir = self.workdir / "kwok"
        kwok_dir.mkdir(exist_ok=True)
        (kwok_dir / "kwok.yaml").write_text(stages)
        d, port = self.pki_dir, self.ports["kwok"]
        proc = self._start(
            "kwok",
            [
                str(self.bins["kwok"]),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={kwok_dir / 'kwok.yaml'}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                f"--tls-cert-file={d / 'admin.crt'}",
                f"--tls-private-key-file={d / 'admin.key'}",
                "--node-ip=127.0.0.1",
                "--node-name=localhost",
                f"--node-port={port}",
                f"--server-address=127.0.0.1:{port}",
                "--node-lease-duration-seconds=40",
            ],
            env={"KWOK_WORKDIR": str(kwok_dir), "HOME": str(kwok_dir)},
        )

        wait_for("kwok", answers_ok(f"http://127.0.0.1:{port}/healthz"), timeout, proc)

    def _create_nodes(self, timeout: float) -> None:
        nodes = FAKE_NODES + cpu_nodes(self.extra_cpu_nodes)
        for node in nodes:
            self.api("POST", "/api/v1/nodes", node)

        def all_ready() -> bool:
            nodes = self.api("GET", "/api/v1/nodes")["items"]
            ready = [
                n
                for n in nodes
                if any(
                    c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", [])
                )
            ]
            return len(ready) == len(nodes)

        wait_for("KWOK nodes Ready", all_ready, timeout, self.procs["kwok"])

    # --- the opt-in real node ---
    def _real_node_addresses(self) -> list[str]:
        """The node's address, which pods' traffic to the API server arrives on: named in its certificate."""
        if not self.real_node:
            return []
        from localcluster import realnode

        return [realnode.node_address()]

    def _real_node_apiserver_args(self) -> list[str]:
        if not self.real_node:
            return []
        from localcluster import realnode

        return realnode.apiserver_args(self.pki_dir)

    def _up_real_node(self, timeout: float) -> None:
        from localcluster.realnode import RealNode

        self.node = RealNode(self, kube_proxy=self.real_node_kube_proxy)
        self._save_state()
        self.node.up(max(timeout, 180))

    def _down_real_node(self) -> None:
        from localcluster.realnode import STATE_FILE as NODE_STATE
        from localcluster.realnode import RealNode

        if self.node is None and (self.workdir / "real-node" / NODE_STATE).exists():
            state = self.workdir / STATE_FILE
            if not self.ports and state.exists():  # `down` from another process: the API server's port
                self.ports = json.loads(state.read_text())["ports"]
            self.node = RealNode(self)
        if self.node is not None:
            self.node.down()
            self.node = None

    # --- state, so `down` works from another process ---
    def _save_state(self) -> None:
        state = {
            "pids": {n: p.pid for n, p in self.procs.items()},
            "ports": self.ports,
            "kubeconfig": str(self.kubeconfig),
        }
        (self.workdir / STATE_FILE).write_text(json.dumps(state, indent=2))

    def down(self, timeout: float = 20) -> None:
        """Stops every component (reverse start order): SIGTERM, then SIGKILL at the deadline."""
        self._down_real_node()  # first, while the API server still answers (it drains the node's pods)
        pids = [p.pid for p in self.procs.values()]
        state = self.workdir / STATE_FILE
        if not pids and state.exists():
            pids = list(json.loads(state.read_text())["pids"].values())
        stop_process_groups(list(reversed(pids)), timeout)
        for proc in self.procs.values():
            proc.wait(timeout=1)
        self.procs.clear()
        state.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def stop_process_groups(pids: list[int], timeout: float) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling interval of a deadline-bounded wait
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
