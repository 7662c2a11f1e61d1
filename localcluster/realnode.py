"""One real worker node beside the KWOK nodes (opt-in prototype): containerd 2.x with runc, CNI (bridge +
host-local + loopback), kubelet (and optionally kube-proxy), so a plain pod really runs on this machine.

Needs root, Linux, the CNI plugins (Debian: `apt-get install containernetworking-plugins`) and the binaries
`build-node.sh` builds (runc included: Debian's 1.1.5 fails containerd 2's CRI sandboxes). Images reach the
node by import (no registry): the pause image and the test image `servlane.local/hello:v1` are OCI archives
made here from two static Go programs.

Everything the node creates is undone by `down()`: processes (kubelet, kube-proxy, containerd, shims and the
containers), mounts under its folders, the CNI bridge, the iptables chains kubelet/kube-proxy add, the CNI
result cache entries, the kubepods cgroups and the kernel settings kubelet and kube-proxy change.

Services (with kube-proxy): pods get routes to the Service CIDR and the host's addresses through the bridge
(no default route), bridged pod traffic is accepted in `FORWARD` (whose policy is DROP where Docker runs),
and ClusterIP packets that kube-proxy did not translate are rejected here instead of leaving the machine.

Cluster DNS and the API server for pods (with kube-proxy): CoreDNS runs as a host process on the node's
address and a free port, behind the standard `kube-system/kube-dns` Service (ClusterIP 10.0.0.10) whose
selector-less EndpointSlice points at it; the kubelet gives pods `clusterDNS`/`clusterDomain`. The API
server listens on all addresses and advertises the node's, so the `kubernetes` Service (10.0.0.1:443)
reaches it from pods, which then use in-cluster config (projected ServiceAccount token, kube-root-ca.crt).

NetworkPolicy (by default): kube-router's network policy controller alone (iptables + ipset, built by
`build-netpol.sh`; v2.1.0, which has reported security flaws, used only inside this local test cluster) runs
as a host process once the node is registered, as user NETPOL_USER with read-only rights. Without its binary
the node runs without enforcement and says so loudly (CI=true: it fails instead).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import io
import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from localcluster.build_scripts import run_build_script
from localcluster.docker_layers import DockerImage, chain_ids, layout_without_layers, read_docker_image
from localcluster.mount_view import link_tree_command, mount_of

if TYPE_CHECKING:
    from localcluster.cluster import LocalCluster

HERE = Path(__file__).resolve().parent
NODE_BINARIES = (
    "kubelet",
    "kube-proxy",
    "containerd",
    "ctr",
    "containerd-shim-runc-v2",
    "runc",
    "coredns",
    "pause",
    "hello",
    "podcheck",
)
NODE_NAME = "real-node-1"
NODE_LABEL = "servlane.dev/real-node"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.1"
TEST_IMAGE = "servlane.local/hello:v1"
# The in-pod probe (DNS lookups, HTTP GETs, API reads with the pod's ServiceAccount): node/images/podcheck.
PODCHECK_IMAGE = "servlane.local/podcheck:v1"
POD_SUBNET = "10.244.0.0/24"
POD_GATEWAY = "10.244.0.1"  # the bridge's address (host-local gives the gateway the subnet's first address)
# The API server's --service-cluster-ip-range (cluster.py); read back from its ServiceCIDR when it answers.
SERVICE_CIDR = "10.0.0.0/16"
BRIDGE = "svlcni0"
CNI_NETWORK = "servlane-pods"
CNI_BIN_DIRS = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))
STATE_FILE = "realnode.json"
CLUSTER_DOMAIN = "cluster.local"
DNS_SERVICE = "kube-dns"  # in kube-system, the name pods' tooling and Helm charts expect
DNS_SERVICE_HOST = 10  # the Service CIDR's 10th address (10.0.0.10), as kubeadm gives kube-dns
# The EndpointSlice's manager label (a label value: no "/"); the endpointslice controller leaves it alone.
DNS_MANAGER = "real-node.servlane.dev"
# CoreDNS's identity (a client certificate) and its read-only rights: the upstream `system:coredns` rules.
DNS_USER = "servlane:coredns"
DNS_RULES = [
    {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
]
# Kernel settings kubelet (protectKernelDefaults: false), the bridge plugin and kube-proxy may change.
SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
    "net/netfilter/nf_conntrack_max",
    "net/netfilter/nf_conntrack_tcp_timeout_established",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
)


# The NetworkPolicy enforcer (build-netpol.sh): kube-router, only its firewall controller. Its identity (a
# client certificate) and rights: upstream's kube-router ClusterRole reduced to the reads the controller's
# informers make (they all must sync before it starts).
NETPOL_BINARY = "kube-router"
NETPOL_USER = "servlane:kube-router"
NETPOL_RULES = [
    {
        "apiGroups": [""],
        "resources": ["namespaces", "pods", "services", "nodes", "endpoints"],
        "verbs": ["get", "list", "watch"],
    },
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
]
# kube-router's ipsets (its chains all start with KUBE-, which _remove_chains already removes); "inet6:" is
# the prefix of its IPv6 sets.
NETPOL_IPSET = re.compile(r"^(inet6:)?KUBE-(SRC|DST)-")


class RealNodeError(RuntimeError):
    pass


def build_node_binaries() -> Path:
    """Runs build-node.sh (a no-op when its cache holds this pinned set) and returns the bin folder."""
    return run_build_script("build-node.sh", RealNodeError, "the real node")


def build_netpol_binaries() -> Path:
    """Runs build-netpol.sh (a no-op when its cache holds kube-router) and returns the bin folder."""
    return run_build_script("build-netpol.sh", RealNodeError, "the NetworkPolicy enforcer (kube-router)")


def netpol_binary() -> Path | None:
    """kube-router from SERVLANE_NETPOL_BIN (a folder), else from build-netpol.sh's cache (built when missing
    and Go is here); None when neither gives one. With CI=true a failing build raises instead."""
    folder = os.environ.get("SERVLANE_NETPOL_BIN")
    if folder:
        return Path(folder) / NETPOL_BINARY if (Path(folder) / NETPOL_BINARY).is_file() else None
    if shutil.which("go") is None:
        return None
    try:
        return build_netpol_binaries() / NETPOL_BINARY
    except RealNodeError:
        if os.environ.get("CI") == "true":
            raise
        return None


def cni_bin_dir() -> Path | None:
    return next((d for d in CNI_BIN_DIRS if (d / "bridge").is_file() and (d / "host-local").is_file()), None)


def missing_prerequisites() -> list[str]:
    """What this machine lacks for a real node (empty when it can run one)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (kubelet, containerd and CNI need it)")
    if cni_bin_dir() is None:
        missing.append("CNI plugins bridge/host-local/loopback (apt-get install containernetworking-plugins)")
    if shutil.which("iptables") is None:
        missing.append("iptables")
    if shutil.which("ip") is None:
        missing.append("ip (iproute2)")
    if (shutil.which("go") is None or shutil.which("gcc") is None) and not os.environ.get("SERVLANE_NODE_BIN"):
        missing.append("Go and gcc (to build kubelet, containerd, runc) or SERVLANE_NODE_BIN")
    return missing


def apiserver_args(pki_dir: Path) -> list[str]:
    """What kube-apiserver needs to reach a kubelet (pod logs, exec): a client certificate the kubelet's
    webhook authorizer accepts, and the node's InternalIP (its hostname need not resolve). And what pods
    need to reach the API server through the `kubernetes` Service: it advertises the node's address, which
    becomes that Service's endpoint (an EndpointSlice never holds a loopback address); the cluster makes it
    listen on all addresses and names that address in the serving certificate."""
    return [
        f"--kubelet-client-certificate={pki_dir / 'admin.crt'}",
        f"--kubelet-client-key={pki_dir / 'admin.key'}",
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        f"--advertise-address={node_address()}",
    ]


def node_address() -> str:
    """The address pods reach this machine on and the API server advertises: the first global IPv4 address
    of the default route's interface (the one the kubelet reports as InternalIP), else any global one."""
    out = subprocess.run(["ip", "-j", "-4", "route", "show", "default"], capture_output=True, text=True, check=False)
    with contextlib.suppress(ValueError, IndexError, KeyError):
        dev = json.loads(out.stdout or "[]")[0]["dev"]
        addrs = _host_addresses(dev)
        if addrs:
            return addrs[0]
    addrs = _host_addresses()
    if not addrs:
        raise RealNodeError("no global IPv4 address on this machine: pods could not reach the host")
    return addrs[0]


def dns_service_ip(service_cidr: str) -> str:
    return str(ipaddress.ip_network(service_cidr)[DNS_SERVICE_HOST])


def corefile(address: str, port: int, health_port: int, ready_port: int, kubeconfig_path: Path) -> str:
    """Answers the cluster's zone and the reverse zones from the API server; nothing else: pods have no
    route off this machine, so other names are refused at once instead of being forwarded upstream."""
    return f"""{CLUSTER_DOMAIN}:{port} in-addr.arpa:{port} ip6.arpa:{port} {{
    bind {address}
    errors
    health 127.0.0.1:{health_port}
    ready 127.0.0.1:{ready_port}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig_path}
        pods insecure
        ttl 30
    }}
    cache 30
}}
"""


def dns_service(service_cidr: str) -> dict[str, Any]:
    """`kube-system/kube-dns` without a selector: its endpoint is CoreDNS on the host (dns_endpoint_slice)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": DNS_SERVICE,
            "namespace": "kube-system",
            "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"},
        },
        "spec": {
            "clusterIP": dns_service_ip(service_cidr),
            "ports": [
                {"name": "dns", "protocol": "UDP", "port": 53},
                {"name": "dns-tcp", "protocol": "TCP", "port": 53},
            ],
        },
    }


def dns_endpoint_slice(address: str, port: int, node: str) -> dict[str, Any]:
    """kube-proxy DNATs the Service's port 53 to the slice's port of the same name: CoreDNS's free port."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{DNS_SERVICE}-{node}",
            "namespace": "kube-system",
            "labels": {
                "kubernetes.io/service-name": DNS_SERVICE,
                "endpointslice.kubernetes.io/managed-by": DNS_MANAGER,
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}, "nodeName": node}],
        "ports": [
            {"name": "dns", "protocol": "UDP", "port": port},
            {"name": "dns-tcp", "protocol": "TCP", "port": port},
        ],
    }


def free_dns_port(address: str) -> int:
    """A port free for both UDP and TCP on `address` (DNS answers on both)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            tcp.bind((address, 0))
            port = int(tcp.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind((address, port))
                except OSError:
                    continue
                return port
    raise RealNodeError(f"no port free for both UDP and TCP on {address}")


# --- images without a registry: OCI image-layout archives that `ctr images import` reads ---
def _blob(layout: tarfile.TarFile, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    layout.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}"


# The label by which content keeps a snapshot from containerd's garbage collector; containerd's unpacking
# puts it on an image's config, naming the top layer's snapshot.
SNAPSHOT_REF_LABEL = "containerd.io/gc.ref.snapshot.overlayfs"


def _snapshot_folder(mounts: list[dict[str, Any]]) -> Path:
    """The folder an active overlayfs snapshot's own files go in: its bind mount's source (no parent) or its
    overlay's upperdir (`ctr snapshots prepare --mounts` prints these mounts as JSON)."""
    (mount,) = mounts  # Go's mount.Mount, printed without JSON tags
    if mount.get("Type") == "bind":
        return Path(mount["Source"])
    for option in mount.get("Options") or []:
        if option.startswith("upperdir="):
            return Path(option.removeprefix("upperdir="))
    raise RealNodeError(f"no folder to fill in the snapshot's mounts: {mounts}")


def oci_archive(dest: Path, name: str, binary: Path, entrypoint: list[str]) -> Path:
    """One-layer image: the static `binary` as /<its name>, run as `entrypoint`; tagged `name`."""
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as layer:
        for folder in ("tmp", "etc"):
            d = tarfile.TarInfo(folder)
            d.type, d.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            layer.addfile(d)
        data = binary.read_bytes()
        f = tarfile.TarInfo(binary.name)
        f.size, f.mode = len(data), 0o755
        layer.addfile(f, io.BytesIO(data))
    layer_bytes = layer_buf.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    created = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC).isoformat()
    config = {
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    with tarfile.open(dest, "w") as layout:
        layer_digest = _blob(layout, layer_bytes)
        config_bytes = json.dumps(config).encode()
        config_digest = _blob(layout, config_bytes)
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": len(config_bytes),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest,
                    "size": len(layer_bytes),
                }
            ],
        }
        manifest_bytes = json.dumps(manifest).encode()
        manifest_digest = _blob(layout, manifest_bytes)
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": manifest_digest,
                    "size": len(manifest_bytes),
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                    },
                }
            ],
        }
        for fname, body in (("oci-layout", {"imageLayoutVersion": "1.0.0"}), ("index.json", index)):
            raw = json.dumps(body).encode()
            info = tarfile.TarInfo(fname)
            info.size = len(raw)
            layout.addfile(info, io.BytesIO(raw))
    return dest


# --- the kubelet's own identity: system:node:<name> in system:nodes, signed by the cluster's CA ---
def node_certificate(pki_dir: Path, node: str, dest: Path) -> tuple[Path, Path]:
    return client_certificate(pki_dir, f"system:node:{node}", "system:nodes", dest, file_name=node)


def client_certificate(
    pki_dir: Path, user: str, group: str | None, dest: Path, file_name: str | None = None
) -> tuple[Path, Path]:
    """A client certificate for `user` (in `group`), signed by the cluster's CA: <dest>/<file_name>.crt/.key."""
    ca_key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes())
    if not isinstance(ca_key, rsa.RSAPrivateKey):
        raise RealNodeError("the cluster CA key is not RSA")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = datetime.datetime.now(datetime.UTC)
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, user)]
    if group:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, group))
    subject = x509.Name(attributes)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    dest.mkdir(parents=True, exist_ok=True)
    name = file_name or re.sub(r"[^A-Za-z0-9_.-]", "-", user)
    crt, pem_key = dest / f"{name}.crt", dest / f"{name}.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem_key.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    pem_key.chmod(0o600)
    return crt, pem_key


def kubeconfig(server: str, ca: Path, crt: Path, key: Path) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}],
            "users": [{"name": "node", "user": {"client-certificate": str(crt), "client-key": str(key)}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "node"}}],
            "current-context": "local",
        },
        indent=2,
    )


# --- host state to put back ---
def _read_sysctls() -> dict[str, str]:
    values = {}
    for name in SYSCTLS:
        with contextlib.suppress(OSError):
            values[name] = (Path("/proc/sys") / name).read_text().strip()
    return values


def _iptables_chains() -> dict[str, list[str]]:
    """{'iptables:nat': [chains...], ...} from iptables-save / ip6tables-save."""
    chains: dict[str, list[str]] = {}
    for tool in ("iptables", "ip6tables"):
        if shutil.which(f"{tool}-save") is None:
            continue
        out = subprocess.run([f"{tool}-save"], capture_output=True, text=True, check=False).stdout
        table = ""
        for line in out.splitlines():
            if line.startswith("*"):
                table = line[1:]
                chains[f"{tool}:{table}"] = []
            elif line.startswith(":"):
                chains[f"{tool}:{table}"].append(line[1:].split()[0])
    return chains


def _ipsets() -> list[str]:
    """The machine's ipset names (empty without the ipset command)."""
    if shutil.which("ipset") is None:
        return []
    out = subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True, check=False).stdout
    return out.split()


RULE_COMMENT = "servlane real node"


def _host_rules(service_cidr: str) -> list[tuple[str, list[str]]]:
    """Filter rules the node inserts (first in their chains) and deletes on down():
    - bridged pod-to-pod traffic (also a Service's, after kube-proxy's DNAT) passes FORWARD, whose policy
      is DROP where Docker runs (br_netfilter hands bridged frames to iptables);
    - a packet still addressed to the Service CIDR after the nat table (no rule for that ClusterIP yet, or
      none at all) is rejected, from the host and from pods, instead of following the default route away."""
    comment = ["-m", "comment", "--comment", RULE_COMMENT]
    return [
        ("FORWARD", ["-i", BRIDGE, "-o", BRIDGE, *comment, "-j", "ACCEPT"]),
        ("FORWARD", ["-d", service_cidr, *comment, "-j", "REJECT"]),
        ("OUTPUT", ["-d", service_cidr, *comment, "-j", "REJECT"]),
    ]


def _delete_host_rules() -> None:
    """Every filter rule carrying RULE_COMMENT (also those of an earlier run that died before down())."""
    out = subprocess.run(["iptables-save", "-t", "filter"], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        if line.startswith("-A ") and RULE_COMMENT in line:
            subprocess.run(["iptables", "-t", "filter", "-D", *shlex.split(line[3:])], capture_output=True, check=False)


def _host_addresses(dev: str | None = None) -> list[str]:
    """This machine's global IPv4 addresses (not the pod bridge's), or those of `dev`: pods reach NodePorts
    (and the API server, CoreDNS) on them."""
    out = subprocess.run(
        ["ip", "-j", "-4", "addr", "show", "scope", "global", *(["dev", dev] if dev else [])],
        capture_output=True,
        text=True,
        check=False,
    )
    with contextlib.suppress(ValueError):
        return [
            a["local"]
            for link in json.loads(out.stdout or "[]")
            if link.get("ifname") != BRIDGE
            for a in link.get("addr_info", [])
            if a.get("family") == "inet"
        ]
    return []


def _write_sysctl(name: str, value: str) -> None:
    path = Path("/proc/sys") / name
    if path.read_text().strip() != value:
        path.write_text(value)


def _mounts_under(roots: list[Path]) -> list[str]:
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if any(point == str(r) or point.startswith(f"{r}/") for r in roots):
                found.append(point)
    return found


def _pids_with_arg(arg: str) -> list[int]:
    """Processes whose command line has `arg` (our own containerd socket path: the shims it started)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if arg in (proc / "cmdline").read_bytes().decode(errors="replace").split("\0"):
                pids.append(int(proc.name))
    return pids


def _cgroup_roots(name: str) -> list[Path]:
    base = Path("/sys/fs/cgroup")
    if (base / "cgroup.controllers").exists():  # cgroup v2
        return [base / name] if (base / name).is_dir() else []
    return [d / name for d in base.iterdir() if (d / name).is_dir() and not d.is_symlink()]


def _lacks_sys_resource() -> bool:
    """CAP_SYS_RESOURCE (bit 24) is not in this process's effective set."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return not int(line.split()[1], 16) & (1 << 24)
    return True


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class RealNode:
    """A real node for a running LocalCluster (whose kube-apiserver got `apiserver_args`)."""

    cluster: LocalCluster
    name: str = NODE_NAME
    kube_proxy: bool = False
    bins: dict[str, Path] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    saved_sysctls: dict[str, str] = field(default_factory=dict)
    saved_chains: dict[str, list[str]] = field(default_factory=dict)
    had_kubepods: bool = False
    # NetworkPolicy enforcement (kube-router's firewall controller); off when its binary is missing (CI: fails).
    network_policy: bool = True
    saved_ipsets: list[str] = field(default_factory=list)
    service_cidr: str = SERVICE_CIDR
    address: str = ""  # node_address(): the kubelet's InternalIP, CoreDNS's and the API server's for pods

    @property
    def cluster_dns(self) -> bool:
        """CoreDNS behind kube-dns: pods reach its ClusterIP only through kube-proxy's rules."""
        return self.kube_proxy

    @property
    def workdir(self) -> Path:
        return self.cluster.workdir / "real-node"

    @property
    def rundir(self) -> Path:
        # Unix socket paths are limited to 108 bytes: a short folder under /run, named after the workdir.
        return Path("/run") / f"servlane-{hashlib.sha256(str(self.workdir).encode()).hexdigest()[:8]}"

    @property
    def socket(self) -> Path:
        return self.rundir / "containerd.sock"

    @property
    def logs(self) -> Path:
        return self.cluster.workdir / "logs"

    # --- processes ---
    def _start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - the process owns it until down()
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True
        )
        self.procs[name] = proc
        self._save_state()
        return proc

    def _fail(self, message: str) -> RealNodeError:
        tails = [f"--- {n}.log (last lines) ---\n{_tail(self.logs / f'{n}.log')}" for n in self.procs]
        return RealNodeError(message + "\n" + "\n".join(tails))

    def _wait(self, what: str, check: Any, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise self._fail(f"{what}: process exited with {proc.returncode}")
            with contextlib.suppress(OSError, ValueError, subprocess.SubprocessError, KeyError):
                if check():
                    return
            time.sleep(0.5)  # polling interval of a deadline-bounded wait
        raise self._fail(f"{what}: not ready after {timeout:.0f}s")

    def ctr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bins["ctr"]), "--address", str(self.socket), "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def docker_image_to_link(self, ref: str) -> DockerImage | None:
        """`ref` as Docker holds it, where its layers can be hard-linked into this node's snapshots (Docker's
        overlay2 driver, on the node's filesystem); None where the image must be copied (`import_docker_image`
        then streams it, which needs about twice the unpacked image's size free)."""
        try:
            image = read_docker_image(ref)
            if image is None:
                return None
            self.workdir.mkdir(parents=True, exist_ok=True)
            node_mount = mount_of(self.workdir)
            for layer_dir in image.layer_dirs:
                link_tree_command(layer_dir, mount_of(layer_dir), self.workdir, node_mount)
        except (ValueError, OSError, subprocess.SubprocessError):
            return None
        return image

    def import_docker_image(self, ref: str, timeout: float = 1200) -> float:
        """Puts Docker's image `ref` into the node's containerd (namespace k8s.io, unpacked for the CRI's
        overlayfs snapshotter), so pods run `ref` with imagePullPolicy IfNotPresent or Never; returns the
        seconds it took. Linked from Docker's own layers where it can be (`link_docker_image`), else streamed
        through `docker save ref | ctr images import -` (both processes killed at the deadline). The image
        stays under the node's workdir until `remove_image`."""
        if shutil.which("docker") is None:
            raise RealNodeError("docker is not installed: no local image to import")
        started = time.monotonic()
        linkable = self.docker_image_to_link(ref)
        if linkable is not None:
            self.link_docker_image(linkable, timeout=timeout)
            return time.monotonic() - started
        save = subprocess.Popen(
            ["docker", "save", ref], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
        assert save.stdout is not None
        ctr_args = ["--address", str(self.socket), "--namespace", "k8s.io", "images", "import"]
        # Unpacked for the CRI's snapshotter; the layer blobs are dropped after unpacking (pods need only the
        # snapshots), which ctr allows only with --local (the import runs in ctr, not via the transfer API).
        ctr_args += [
            "--local",
            "--platform",
            "linux/amd64",
            "--snapshotter",
            "overlayfs",
            "--discard-unpacked-layers",
            "-",
        ]
        load = subprocess.Popen(
            [str(self.bins["ctr"]), *ctr_args],
            stdin=save.stdout,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        save.stdout.close()  # ctr holds the pipe now: docker gets SIGPIPE if ctr dies
        try:
            load_out, load_err = load.communicate(timeout=timeout)
            save_err = save.communicate(timeout=max(1.0, timeout - (time.monotonic() - started)))[1]
        except subprocess.TimeoutExpired:
            for proc in (save, load):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise RealNodeError(f"importing {ref}: not done after {timeout:.0f}s") from None
        if save.returncode != 0 or load.returncode != 0:
            raise RealNodeError(
                f"importing {ref}: docker save exited {save.returncode} ({save_err.decode(errors='replace')[-2000:]}),"
                f" ctr import exited {load.returncode} ({load_err.decode(errors='replace')[-2000:]}"
                f"{load_out.decode(errors='replace')[-2000:]})"
            )
        if ref not in self.ctr("images", "ls", "-q").stdout.split():
            raise RealNodeError(f"{ref} not in containerd after import: {load_out.decode(errors='replace')[-2000:]}")
        return time.monotonic() - started

    def link_docker_image(self, image: DockerImage, timeout: float = 1200) -> None:
        """Puts `image` into the node's containerd without copying a byte of its layers: an image record whose
        manifest names layers that are not in the content store (as `--discard-unpacked-layers` leaves one),
        and, bottom layer first, a snapshot per layer named by its chain ID and filled with hard links to
        Docker's unpacked files (`cp -a --link`: folders made anew with their modes, owners and xattrs, such
        as overlayfs's opaque mark; files, whiteouts included, linked; see localcluster/docker_layers.py, and
        localcluster/mount_view.py for linking past Docker's bind mount of its own folder).

        Containerd's garbage collector deletes what nothing refers to: ctr marks each snapshot it prepares or
        commits as a root (`containerd.io/gc.root`), which keeps them while the image is put together; then
        the image's config is labelled with the top snapshot (as containerd's own unpacking leaves it), whose
        parents it keeps, and the root marks go, so removing the image frees them."""
        deadline = time.monotonic() + timeout
        layout = self.workdir / "images" / f"linked-{secrets.token_hex(4)}.tar"
        layout.parent.mkdir(parents=True, exist_ok=True)
        layout.write_bytes(layout_without_layers(image))
        try:
            platform = f"{image.os}/{image.architecture}"
            self._ctr_ok("images", "import", "--local", "--no-unpack", "--platform", platform, str(layout))
        finally:
            layout.unlink(missing_ok=True)
        snapshots = ("snapshots", "--snapshotter", "overlayfs")
        chains = chain_ids(image.diff_ids)
        made: list[str] = []
        parent: list[str] = []
        for chain, layer_dir in zip(chains, image.layer_dirs, strict=True):
            if self.ctr(*snapshots, "info", chain).returncode != 0:  # another image may have linked it already
                key = f"servlane-link-{secrets.token_hex(6)}"
                folder = _snapshot_folder(json.loads(self._ctr_ok(*snapshots, "prepare", "--mounts", key, *parent)))
                copied = subprocess.run(
                    link_tree_command(layer_dir, mount_of(layer_dir), folder, mount_of(folder)),
                    capture_output=True,
                    text=True,
                    timeout=max(1.0, deadline - time.monotonic()),
                    check=False,
                )
                if copied.returncode != 0:
                    self.ctr(*snapshots, "rm", key)
                    raise RealNodeError(f"linking {image.ref}'s layer {layer_dir}: {copied.stderr.strip()[-2000:]}")
                self._ctr_ok(*snapshots, "commit", chain, key)
                made.append(chain)
            parent = [chain]
        self._ctr_ok("content", "label", image.config_digest, f"{SNAPSHOT_REF_LABEL}={chains[-1]}")
        for chain in made:
            self._ctr_ok(*snapshots, "label", chain, "containerd.io/gc.root=")
        if image.ref not in self.ctr("images", "ls", "-q").stdout.split():
            raise RealNodeError(f"{image.ref} not in containerd after linking it")

    def _ctr_ok(self, *args: str, timeout: float = 120) -> str:
        result = self.ctr(*args, timeout=timeout)
        if result.returncode != 0:
            raise RealNodeError(f"ctr {' '.join(args[:3])}: {result.stderr.strip()[-2000:]}")
        return result.stdout

    def remove_image(self, ref: str, timeout: float = 300) -> None:
        """Deletes `ref` from the node's containerd and waits for its garbage collection (content and
        snapshots), giving the disk back while the node keeps running. The CRI names each image it learns of
        also by its ID (`sha256:<config digest>`), a second record that would keep it all: that one goes too
        (as `crictl rmi` does) unless another name still points at the image."""
        targets = self._image_targets()
        names = [ref]
        if ref in targets:
            config = json.loads(self._ctr_ok("content", "get", targets[ref])).get("config", {}).get("digest")
            others = [n for n, t in targets.items() if t == targets[ref] and n not in (ref, config)]
            if config in targets and not others:
                names.append(config)
        for name in names:
            result = self.ctr("images", "rm", "--sync", name, timeout=timeout)
            if result.returncode != 0 and "not found" not in result.stderr:
                raise RealNodeError(f"ctr images rm {name}: {result.stderr.strip()}")

    def _image_targets(self) -> dict[str, str]:
        """Each image's name and the digest of what it points at (its manifest)."""
        lines = self._ctr_ok("images", "ls").splitlines()[1:]  # REF TYPE DIGEST SIZE PLATFORMS LABELS
        return {fields[0]: fields[2] for fields in (line.split() for line in lines) if len(fields) >= 3}

    # --- up ---
    def up(self, timeout: float = 180) -> None:
        missing = missing_prerequisites()
        if missing:
            raise RealNodeError("a real node needs: " + "; ".join(missing))
        if not self.bins:
            bin_dir = Path(os.environ.get("SERVLANE_NODE_BIN") or build_node_binaries())
            self.bins = {n: bin_dir / n for n in NODE_BINARIES}
        from localcluster.cluster import free_port

        self.ports = {"kubelet": free_port(), "kubelet_healthz": free_port(), "proxy_healthz": free_port()}
        self.address = node_address()
        self.saved_sysctls = _read_sysctls()
        self.saved_chains = _iptables_chains()
        self.had_kubepods = bool(_cgroup_roots("kubepods"))
        self.saved_ipsets = _ipsets()
        for d in (self.workdir, self.rundir):
            d.mkdir(parents=True, exist_ok=True)
        self._save_state()
        try:
            self._prepare_network()
            self._write_cni()
            self._up_containerd(timeout)
            self._import_images(timeout)
            if self.cluster_dns:
                self._up_coredns(timeout)
            self._up_kubelet(timeout)
            if self.kube_proxy:
                self._up_kube_proxy(timeout)
            if self.network_policy:
                self._up_netpol(timeout)
        except BaseException:
            self.down()
            raise

    def _prepare_network(self) -> None:
        """Kernel settings and filter rules a pod's Service traffic needs (restored/deleted by down())."""
        with contextlib.suppress(OSError, ValueError, KeyError, IndexError):
            cidrs = self.cluster.api("GET", "/apis/networking.k8s.io/v1/servicecidrs/kubernetes")["spec"]["cidrs"]
            self.service_cidr = next((c for c in cidrs if ":" not in c), self.service_cidr)
        self._save_state()
        bridge_nf = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
        if not bridge_nf.exists() and shutil.which("modprobe"):
            subprocess.run(["modprobe", "br_netfilter"], capture_output=True, check=False)
        if self.kube_proxy and not bridge_nf.exists():
            raise RealNodeError(
                "kube-proxy needs br_netfilter (a Service's reply between two pods on one bridge must pass "
                "conntrack): `modprobe br_netfilter` on the host"
            )
        _write_sysctl("net/ipv4/ip_forward", "1")  # pod -> ClusterIP -> pod is routed through the host
        if bridge_nf.exists():
            _write_sysctl("net/bridge/bridge-nf-call-iptables", "1")
        _delete_host_rules()
        for chain, rule in reversed(_host_rules(self.service_cidr)):
            result = subprocess.run(
                ["iptables", "-t", "filter", "-I", chain, "1", *rule], capture_output=True, text=True, check=False
            )
            if result.returncode != 0:
                raise RealNodeError(f"iptables -I {chain} {shlex.join(rule)}: {result.stderr.strip()}")

    def _write_cni(self) -> None:
        conf = self.workdir / "cni" / "net.d"
        conf.mkdir(parents=True, exist_ok=True)
        conflist = {
            "cniVersion": "1.0.0",
            "name": CNI_NETWORK,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,  # pods talk to this machine only: no NAT rules on the host
                    "hairpinMode": True,  # a pod reaches itself through its own Service
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET, "gateway": POD_GATEWAY}]],
                        # No default route: ClusterIPs and this machine's addresses only, via the bridge.
                        "routes": [
                            {"dst": self.service_cidr, "gw": POD_GATEWAY},
                            *({"dst": f"{a}/32", "gw": POD_GATEWAY} for a in _host_addresses()),
                        ],
                        "dataDir": str(self.workdir / "cni" / "ipam"),
                    },
                }
            ],
        }
        (conf / "10-servlane.conflist").write_text(json.dumps(conflist, indent=2))

    def _containerd_config(self) -> str:
        w, r = self.workdir / "containerd", self.rundir
        runc = self.bins["runc"]
        return f"""version = 3
root = "{w / "root"}"
state = "{r / "state"}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[debug]
  level = "info"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"
[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  # Clamp OOMScoreAdj at containerd's own: kubelet asks -998 for every sandbox, and lowering it needs
  # CAP_SYS_RESOURCE, which root lacks on machines (like these) whose bounding set drops it.
  restrict_oom_score_adj = {"true" if _lacks_sys_resource() else "false"}
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{r / "runc"}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni_bin_dir()}"]
    conf_dir = "{self.workdir / "cni" / "net.d"}"
    max_conf_num = 1
[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[plugins.'io.containerd.internal.v1.opt']
  path = "{w / "opt"}"
"""

    def _up_containerd(self, timeout: float) -> None:
        config = self.workdir / "containerd.toml"
        config.write_text(self._containerd_config())
        bin_dir = str(self.bins["containerd"].parent)
        proc = self._start(
            "containerd",
            [str(self.bins["containerd"]), "--config", str(config)],
            env={"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"},
        )
        self._wait("containerd", lambda: self.ctr("version", timeout=5).returncode == 0, timeout, proc)

    def _import_images(self, timeout: float) -> None:
        images = self.workdir / "images"
        images.mkdir(exist_ok=True)
        archives = [
            oci_archive(images / "pause.tar", PAUSE_IMAGE, self.bins["pause"], ["/pause"]),
            oci_archive(images / "hello.tar", TEST_IMAGE, self.bins["hello"], ["/hello"]),
            oci_archive(images / "podcheck.tar", PODCHECK_IMAGE, self.bins["podcheck"], ["/podcheck"]),
        ]
        for archive in archives:
            result = self.ctr("images", "import", "--platform", "linux/amd64", str(archive), timeout=timeout)
            if result.returncode != 0:
                raise self._fail(f"ctr images import {archive.name}: {result.stderr.strip()}")
        listed = self.ctr("images", "ls", "-q").stdout.split()
        for name in (PAUSE_IMAGE, TEST_IMAGE, PODCHECK_IMAGE):
            if name not in listed:
                raise self._fail(f"{name} not in containerd after import: {listed}")

    def _up_kubelet(self, timeout: float) -> None:
        cluster = self.cluster
        kdir = self.workdir / "kubelet"
        kdir.mkdir(exist_ok=True)
        crt, key = node_certificate(cluster.pki_dir, self.name, self.workdir / "pki")
        kc = self.workdir / "kubelet.kubeconfig"
        kc.write_text(kubeconfig(cluster.server, cluster.pki_dir / "ca.crt", crt, key))
        endpoint = f"unix://{self.socket}"
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,  # kubelet >= 1.35 refuses cgroup v1 without it
            "cgroupDriver": "cgroupfs",
            "failSwapOn": False,
            "containerRuntimeEndpoint": endpoint,
            "imageServiceEndpoint": endpoint,
            "port": self.ports["kubelet"],
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.ports["kubelet_healthz"],
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(cluster.pki_dir / "ca.crt")},
            },
            "authorization": {"mode": "Webhook"},
            "podLogsDir": str(self.workdir / "pod-logs"),
            "resolvConf": "/etc/resolv.conf",
            "serializeImagePulls": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "protectKernelDefaults": False,
            "oomScoreAdj": 0 if _lacks_sys_resource() else -999,
            "registerNode": True,
            "maxPods": 20,
            "podPidsLimit": 4096,
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "nodeStatusReportFrequency": "10s",
            "localStorageCapacityIsolation": True,
            "featureGates": {},
        }
        if self.cluster_dns:
            config |= {"clusterDNS": [dns_service_ip(self.service_cidr)], "clusterDomain": CLUSTER_DOMAIN}
        (self.workdir / "kubelet.yaml").write_text(json.dumps(config, indent=2))
        proc = self._start(
            "kubelet",
            [
                str(self.bins["kubelet"]),
                f"--config={self.workdir / 'kubelet.yaml'}",
                f"--kubeconfig={kc}",
                f"--root-dir={kdir}",
                f"--cert-dir={self.workdir / 'kubelet-pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.address}",  # the address the API server advertises and CoreDNS binds
                f"--node-labels={NODE_LABEL}=true",
                "--v=2",
            ],
        )

        def healthy() -> bool:
            url = f"http://127.0.0.1:{self.ports['kubelet_healthz']}/healthz"
            with urllib.request.urlopen(url, timeout=2) as r:
                return bool(r.status == 200)

        self._wait("kubelet /healthz", healthy, timeout, proc)

        def node_ready() -> bool:
            node = cluster.api("GET", f"/api/v1/nodes/{self.name}")
            conditions = node.get("status", {}).get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        self._wait(f"node {self.name} Ready", node_ready, timeout, proc)

    def _up_coredns(self, timeout: float) -> None:
        """CoreDNS on the node's address (a free port), reading the API server as DNS_USER, and the kube-dns
        Service with an EndpointSlice pointing at it; ready when its /ready says the kubernetes plugin synced."""
        from localcluster.cluster import free_port

        port = free_dns_port(self.address)
        self.ports |= {"dns": port, "dns_health": free_port(), "dns_ready": free_port()}
        self._save_state()
        kc = self._host_identity(DNS_USER, DNS_RULES, "coredns.kubeconfig")
        config = self.workdir / "Corefile"
        config.write_text(corefile(self.address, port, self.ports["dns_health"], self.ports["dns_ready"], kc))
        proc = self._start("coredns", [str(self.bins["coredns"]), "-conf", str(config)])

        def ready() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['dns_ready']}/ready", timeout=2) as r:
                return bool(r.status == 200)

        self._wait("coredns /ready", ready, timeout, proc)
        self._apply("/api/v1/namespaces/kube-system/services", dns_service(self.service_cidr))
        self._apply(
            "/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices",
            dns_endpoint_slice(self.address, port, self.name),
        )

    def _host_identity(self, user: str, rules: list[dict[str, Any]], kubeconfig_name: str) -> Path:
        """A host process's own API identity: a ClusterRole with `rules` bound to `user`, and a kubeconfig
        with a client certificate for that user (removed again in down())."""
        cluster = self.cluster
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        self._apply(f"{rbac}/clusterroles", {"metadata": {"name": user}, "rules": rules})
        binding = {
            "metadata": {"name": user},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
        self._apply(f"{rbac}/clusterrolebindings", binding)
        crt, key = client_certificate(cluster.pki_dir, user, None, self.workdir / "pki")
        path = self.workdir / kubeconfig_name
        path.write_text(kubeconfig(cluster.server, cluster.pki_dir / "ca.crt", crt, key))
        return path

    def _up_netpol(self, timeout: float) -> None:
        """kube-router's network policy controller alone (no routing, no service proxy: the CNI bridge and
        kube-proxy do those), as NETPOL_USER; ready when its /healthz answers (after its informers synced and
        its first sync wrote the KUBE-ROUTER-* chains, which it keeps first in INPUT/FORWARD/OUTPUT, so policy
        decides before the node's own ACCEPT of bridged traffic). Without its binary: a loud warning (CI: fail)."""
        from localcluster.cluster import free_port

        binary = self.bins.get(NETPOL_BINARY) or netpol_binary()
        if binary is None or shutil.which("ipset") is None:
            what = (
                "the ipset command (apt-get install ipset)" if binary else "kube-router (localcluster/build-netpol.sh)"
            )
            message = f"NetworkPolicy is NOT enforced on {self.name}: {what} is missing"
            if os.environ.get("CI") == "true":
                raise RealNodeError(message)
            print(f"\n{'!' * 20} WARNING: {message} {'!' * 20}", flush=True)
            self.network_policy = False
            self._save_state()
            return
        self.bins[NETPOL_BINARY] = binary
        self.ports["netpol_health"] = free_port()
        self._save_state()
        kc = self._host_identity(NETPOL_USER, NETPOL_RULES, "kube-router.kubeconfig")
        proc = self._start(
            NETPOL_BINARY,
            [
                str(binary),
                "--run-firewall=true",
                "--run-router=false",
                "--run-service-proxy=false",
                "--run-loadbalancer=false",
                f"--kubeconfig={kc}",
                f"--hostname-override={self.name}",
                f"--service-cluster-ip-range={self.service_cidr}",
                f"--health-port={self.ports['netpol_health']}",
                "--metrics-port=0",
                "--v=1",
            ],
        )

        def healthy() -> bool:
            url = f"http://127.0.0.1:{self.ports['netpol_health']}/healthz"
            with urllib.request.urlopen(url, timeout=2) as r:
                synced = "KUBE-ROUTER-FORWARD" in _iptables_chains().get("iptables:filter", [])
                return bool(r.status == 200) and synced

        self._wait("kube-router (network policy) /healthz", healthy, timeout, proc)

    def _apply(self, collection: str, body: dict[str, Any]) -> None:
        """Create, or replace what an earlier run left (same name)."""
        try:
            self.cluster.api("POST", collection, body)
        except urllib.error.HTTPError as exc:
            if exc.code != 409:
                raise self._fail(
                    f"POST {collection} {body['metadata']['name']}: {exc.code} {exc.read()[:500]!r}"
                ) from exc
            path = f"{collection}/{body['metadata']['name']}"
            current = self.cluster.api("GET", path)
            body = {**body, "metadata": {**body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
            if "spec" in current and "clusterIP" in current["spec"]:
                body["spec"] = {**body["spec"], "clusterIP": current["spec"]["clusterIP"]}
            self.cluster.api("PUT", path, body)

    def _up_kube_proxy(self, timeout: float) -> None:
        from localcluster.cluster import free_port

        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clientConnection": {"kubeconfig": str(self.cluster.kubeconfig)},
            "hostnameOverride": self.name,
            "clusterCIDR": POD_SUBNET,
            "healthzBindAddress": f"127.0.0.1:{self.ports['proxy_healthz']}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            "oomScoreAdj": 0 if _lacks_sys_resource() else -999,
            "conntrack": {"maxPerCore": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        }
        (self.workdir / "kube-proxy.yaml").write_text(json.dumps(config, indent=2))
        proc = self._start(
            "kube-proxy", [str(self.bins["kube-proxy"]), f"--config={self.workdir / 'kube-proxy.yaml'}", "--v=2"]
        )

        def healthy() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['proxy_healthz']}/healthz", timeout=2) as r:
                return bool(r.status == 200)

        self._wait("kube-proxy /healthz", healthy, timeout, proc)

    # --- state, so `down` works from another process ---
    def _save_state(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        state = {
            "pids": {n: p.pid for n, p in self.procs.items()},
            "bins": {n: str(p) for n, p in self.bins.items()},
            "sysctls": self.saved_sysctls,
            "chains": self.saved_chains,
            "had_kubepods": self.had_kubepods,
            "kube_proxy": self.kube_proxy,
            "ipsets": self.saved_ipsets,
            "service_cidr": self.service_cidr,
            "address": self.address,
        }
        (self.workdir / STATE_FILE).write_text(json.dumps(state, indent=2))

    def _load_state(self) -> dict[str, int]:
        path = self.workdir / STATE_FILE
        if not path.exists():
            return {}
        state = json.loads(path.read_text())
        self.bins = self.bins or {n: Path(p) for n, p in state["bins"].items()}
        self.saved_sysctls = self.saved_sysctls or state["sysctls"]
        self.saved_chains = self.saved_chains or state["chains"]
        self.had_kubepods = self.had_kubepods or state["had_kubepods"]
        self.kube_proxy = self.kube_proxy or state["kube_proxy"]
        self.saved_ipsets = self.saved_ipsets or state.get("ipsets", [])
        self.service_cidr = state.get("service_cidr", self.service_cidr)
        self.address = state.get("address", self.address)
        return {n: int(p) for n, p in state["pids"].items()}

    # --- down: leave the machine as it was ---
    def down(self, timeout: float = 60) -> None:
        from localcluster.cluster import stop_process_groups

        pids = {n: p.pid for n, p in self.procs.items()} or self._load_state()
        if not pids and not (self.workdir / STATE_FILE).exists():
            return
        self._drain(min(timeout, 45))
        if self.kube_proxy:
            self._remove_dns_objects()
        if NETPOL_BINARY in self.bins:
            self._remove_netpol_rights()
        kubelet_side = [pid for n, pid in pids.items() if n != "containerd"]
        stop_process_groups(kubelet_side, 15)
        self._remove_containers()
        stop_process_groups([pid for n, pid in pids.items() if n == "containerd"] or list(pids.values()), 15)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1)
        self.procs.clear()
        self._kill_leftovers()
        if self.kube_proxy and "kube-proxy" in self.bins:
            subprocess.run([str(self.bins["kube-proxy"]), "--cleanup"], capture_output=True, check=False, timeout=60)
        self._unmount()
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)
        self._remove_chains()  # kube-router's KUBE-ROUTER-*, KUBE-POD-FW-*, KUBE-NWPLCY-* too
        self._remove_ipsets()  # after the chains: a set in use by a rule cannot be destroyed
        _delete_host_rules()
        self._remove_cgroups()
        for name, value in self.saved_sysctls.items():
            with contextlib.suppress(OSError):
                if (Path("/proc/sys") / name).read_text().strip() != value:
                    (Path("/proc/sys") / name).write_text(value)
        for cached in Path("/var/lib/cni/results").glob(f"{CNI_NETWORK}-*"):
            cached.unlink(missing_ok=True)
        shutil.rmtree(self.rundir, ignore_errors=True)
        (self.workdir / STATE_FILE).unlink(missing_ok=True)

    def _drain(self, timeout: float) -> None:
        """Deletes the node's pods while kubelet runs, so it tears their sandboxes down (CNI DEL included)."""
        try:
            selector = f"spec.nodeName={self.name}"
            pods = self.cluster.api("GET", f"/api/v1/pods?fieldSelector={selector}")["items"]
            for pod in pods:
                meta = pod["metadata"]
                with contextlib.suppress(OSError):
                    self.cluster.api("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}")
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                left = self.cluster.api("GET", f"/api/v1/pods?fieldSelector={selector}")["items"]
                running = self.ctr("tasks", "ls", "-q", timeout=5).stdout.split() if self.socket.exists() else []
                if not left and not running:
                    return
                time.sleep(0.5)  # polling interval of a deadline-bounded wait
        except (OSError, ValueError, KeyError, subprocess.SubprocessError):
            return  # the API server is gone already: the forced cleanup below still runs

    def _remove_dns_objects(self) -> None:
        """kube-dns and its EndpointSlice point at this host's CoreDNS, which is going: gone with it (and
        CoreDNS's rights). Best effort: the API server may be gone already."""
        for path in (
            f"/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices/{DNS_SERVICE}-{self.name}",
            f"/api/v1/namespaces/kube-system/services/{DNS_SERVICE}",
            f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{DNS_USER}",
            f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{DNS_USER}",
        ):
            with contextlib.suppress(OSError, ValueError):
                self.cluster.api("DELETE", path)

    def _remove_netpol_rights(self) -> None:
        """kube-router's identity goes with it. Best effort: the API server may be gone already."""
        for kind in ("clusterrolebindings", "clusterroles"):
            with contextlib.suppress(OSError, ValueError):
                self.cluster.api("DELETE", f"/apis/rbac.authorization.k8s.io/v1/{kind}/{NETPOL_USER}")

    def _remove_ipsets(self) -> None:
        """kube-router's ipsets that were not there before up(). Not `kube-router --cleanup-config`: in v2.1.0
        it cleans the policy controller through an uninitialised one (no iptables or ipset handlers, so it
        removes nothing of ours) and flushes every IPVS service on the machine."""
        before = set(self.saved_ipsets)
        for name in _ipsets():
            if name not in before and NETPOL_IPSET.match(name):
                subprocess.run(["ipset", "destroy", name], capture_output=True, check=False)

    def _remove_containers(self) -> None:
        if "ctr" not in self.bins or not self.socket.exists():
            return
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            for task in self.ctr("tasks", "ls", "-q", timeout=10).stdout.split():
                self.ctr("tasks", "kill", "--all", "--signal", "SIGKILL", task, timeout=10)
                self.ctr("tasks", "delete", "--force", task, timeout=10)
            for container in self.ctr("containers", "ls", "-q", timeout=10).stdout.split():
                self.ctr("containers", "delete", container, timeout=10)

    def _kill_leftovers(self) -> None:
        """Shims started by our containerd (their command line names its socket) and the containers'
        processes (in the kubepods cgroups, when kubelet created them)."""
        pids = set(_pids_with_arg(str(self.socket)))
        if not self.had_kubepods:
            for root in _cgroup_roots("kubepods"):
                for procs in root.rglob("cgroup.procs"):
                    with contextlib.suppress(OSError, ValueError):
                        pids.update(int(p) for p in procs.read_text().split())
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)  # polling interval of a deadline-bounded wait

    def _unmount(self) -> None:
        for point in reversed(_mounts_under([self.workdir, self.rundir])):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)

    def _remove_chains(self) -> None:
        """Chains kubelet (KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT, KUBE-FIREWALL) or kube-proxy added."""
        now = _iptables_chains()
        for table_key, chains in now.items():
            tool, table = table_key.split(":")
            before = set(self.saved_chains.get(table_key, []))
            for chain in [c for c in chains if c not in before and re.match(r"KUBE-", c)]:
                rules = subprocess.run([f"{tool}-save", "-t", table], capture_output=True, text=True, check=False)
                for line in rules.stdout.splitlines():
                    if line.startswith("-A ") and f"-j {chain}" in line and not line.startswith(f"-A {chain} "):
                        subprocess.run(
                            [tool, "-t", table, "-D", *shlex.split(line[3:])], capture_output=True, check=False
                        )
                subprocess.run([tool, "-t", table, "-F", chain], capture_output=True, check=False)
            for chain in [c for c in chains if c not in before and re.match(r"KUBE-", c)]:
                subprocess.run([tool, "-t", table, "-X", chain], capture_output=True, check=False)

    def _remove_cgroups(self) -> None:
        if self.had_kubepods:
            return
        for root in _cgroup_roots("kubepods"):
            for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                root.rmdir()
