"""A pod really runs on the local cluster's real node (containerd, runc, CNI, kubelet); part of `make test`,
SERVLANE_REAL_NODE=0 opts out (root, runc and the CNI plugins needed; see localcluster/README.md, "A real node").
kube-proxy runs too: a Service in front of a pod answers through its ClusterIP and a NodePort."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from localcluster.cluster import LocalCluster
from localcluster.docker_layers import chain_ids
from tests.support.cluster_harness import OPERATOR_IMAGE, unavailable
from tests.support.pod_netns import blocked, get_in_pod, netns_of
from tests.support.polling import wait_until
from tests.support.real_pods import gone

pytestmark = [
    pytest.mark.e2e,
]

NAMESPACE = "real-node-e2e"


def _wait(what: str, check: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except (OSError, KeyError, ValueError) as exc:
            value, last = None, exc
        if value:
            return value
        time.sleep(0.5)  # polling interval of a deadline-bounded wait
    raise AssertionError(f"{what}: not after {timeout:.0f}s (last error: {last})")


@pytest.fixture(scope="module")
def cluster(real_cluster: LocalCluster) -> LocalCluster:
    return real_cluster  # one real node per session (e2e/conftest.py): two would fight over the bridge


def _context(c: LocalCluster) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(c.pki_dir / "ca.crt"))
    ctx.load_cert_chain(str(c.pki_dir / "admin.crt"), str(c.pki_dir / "admin.key"))
    return ctx


def _text(c: LocalCluster, path: str) -> str:
    with urllib.request.urlopen(c.server + path, context=_context(c), timeout=30) as r:
        return str(r.read().decode())


def _pod(name: str, message: str, app: str = "hello") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {
            "nodeSelector": {"servlane.dev/real-node": "true"},
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "hello",
                    "image": "servlane.local/hello:v1",
                    "imagePullPolicy": "Never",  # imported into containerd; there is no registry
                    "env": [{"name": "MESSAGE", "value": message}],
                    "ports": [{"containerPort": 8080}],
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1},
                }
            ],
        },
    }


def _namespace(c: LocalCluster) -> None:
    try:
        c.api("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    except urllib.error.HTTPError as exc:
        if exc.code != 409:  # the other test made it
            raise
    _wait("default ServiceAccount", lambda: c.api("GET", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default"), 60)


def _running_pod(c: LocalCluster, name: str, message: str, app: str) -> dict[str, Any]:
    c.api("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", _pod(name, message, app))
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"

    def ready() -> dict[str, Any] | None:
        pod: dict[str, Any] = c.api("GET", path)
        status = pod.get("status", {})
        conditions = {x["type"]: x["status"] for x in status.get("conditions", [])}
        return pod if status.get("phase") == "Running" and conditions.get("Ready") == "True" else None

    return wait_until(f"pod {name} Running and Ready", ready, timeout=120, interval=0.5)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode().strip())


def _refused_or_timed_out(exc: Exception) -> bool:
    """Not yet: kube-proxy has not written the Service's rules (the node rejects untranslated ClusterIPs)."""
    return isinstance(exc, OSError)


def test_pod_runs_on_the_real_node(cluster: LocalCluster) -> None:
    c = cluster
    node = c.api("GET", "/api/v1/nodes/real-node-1")
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.36.3"
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.")

    _namespace(c)
    message = f"really-ran-{uuid.uuid4().hex[:8]}"
    c.api("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", _pod("hello", message))
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/hello"

    def ready() -> dict[str, Any] | None:
        pod: dict[str, Any] = c.api("GET", path)
        status = pod.get("status", {})
        conditions = {x["type"]: x["status"] for x in status.get("conditions", [])}
        return pod if status.get("phase") == "Running" and conditions.get("Ready") == "True" else None

    try:
        pod = _wait("pod hello Running and Ready", ready, 120)
    except AssertionError:
        pod = c.api("GET", path)
        events = c.api("GET", f"/api/v1/namespaces/{NAMESPACE}/events")["items"]
        print(json.dumps(pod.get("status"), indent=2))
        print("\n".join(f"{e['reason']}: {e.get('message')}" for e in events))
        raise
    assert pod["spec"]["nodeName"] == "real-node-1"
    pod_ip = pod["status"]["podIP"]
    assert pod_ip.startswith("10.244.0."), pod_ip

    # The container really ran: its stdout, through the API server and the kubelet.
    log = _wait("pod log", lambda: _text(c, f"{path}/log"), 30)
    assert f'message "{message}"' in log, log
    # And it answers on its pod address (a bridge address on this machine).
    with urllib.request.urlopen(f"http://{pod_ip}:8080/", timeout=5) as r:
        assert r.read().decode().strip() == "hello from hello"

    c.api("DELETE", path)
    _wait("pod hello deleted", lambda: gone(c, path), 60)
    assert c.node is not None
    _wait("no containers left in containerd", lambda: c.node.ctr("tasks", "ls", "-q").stdout.split() == [], 30)


def test_service_answers_through_cluster_ip_and_node_port(cluster: LocalCluster) -> None:
    """kube-proxy (iptables) on the real node: the host reaches a pod through its Service's ClusterIP and a
    NodePort (on the node's InternalIP and on 127.0.0.1, route_localnet), and so do pods (another pod, and
    the pod itself through its own Service: hairpin)."""
    c = cluster
    _namespace(c)
    web = _running_pod(c, "web", "behind-a-service", app="web")
    client = _running_pod(c, "client", "a-client", app="client")
    service = c.api(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/services",
        {
            "metadata": {"name": "web"},
            "spec": {"type": "NodePort", "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    cluster_ip, node_port = service["spec"]["clusterIP"], service["spec"]["ports"][0]["nodePort"]
    assert cluster_ip.startswith("10.0."), cluster_ip

    def endpoint_ready() -> bool:
        slices = c.api(
            "GET",
            f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices?labelSelector=kubernetes.io/service-name=web",
        )["items"]
        ready = [
            a for s in slices for e in s.get("endpoints") or [] if e["conditions"].get("ready") for a in e["addresses"]
        ]
        return ready == [web["status"]["podIP"]]

    wait_until("the Service's EndpointSlice lists the web pod", endpoint_ready, timeout=60, interval=0.5)
    node = c.api("GET", "/api/v1/nodes/real-node-1")
    node_ip = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")

    def service_rules_written() -> bool:  # before any packet goes to the ClusterIP
        nat = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True, check=False).stdout
        return f"-d {cluster_ip}/32" in nat and f"--dport {node_port}" in nat

    wait_until("kube-proxy wrote the Service's rules", service_rules_written, timeout=60, interval=0.5)
    expected = "hello from web"
    for url in (f"http://{cluster_ip}/", f"http://{node_ip}:{node_port}/", f"http://127.0.0.1:{node_port}/"):
        answer = wait_until(
            f"host: GET {url}", functools.partial(_get, url), timeout=60, interval=0.5, tolerate=_refused_or_timed_out
        )
        assert answer == expected, (url, answer)

    for pod in (client, web):  # another pod; the endpoint itself (hairpin, masqueraded by kube-proxy)
        netns = netns_of(c, pod["status"]["podIP"])
        for url in (
            f"http://{cluster_ip}/",
            f"http://{web['status']['podIP']}:8080/",
            f"http://{node_ip}:{node_port}/",
        ):
            answer = wait_until(
                f"pod {pod['metadata']['name']}: GET {url}",
                functools.partial(get_in_pod, netns, url),
                timeout=30,
                interval=0.5,
                tolerate=_refused_or_timed_out,
            )
            assert answer == expected, (pod["metadata"]["name"], url, answer)

    c.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/services/web")
    for name in ("web", "client"):
        c.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")


# --- what a pod sees of the cluster from inside: cluster DNS and the API server (in-cluster config) ---
def _ready_endpoints(c: LocalCluster, namespace: str, service: str) -> list[str]:
    slices = c.api(
        "GET",
        f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices?labelSelector=kubernetes.io/service-name={service}",
    )["items"]
    return [a for s in slices for e in s.get("endpoints") or [] if e["conditions"].get("ready") for a in e["addresses"]]


def _podcheck(c: LocalCluster, name: str, checks: list[str], service_account: str | None = None) -> dict[str, Any]:
    """Runs the podcheck image (localcluster/node/images/podcheck) as a pod on the real node with `checks`
    as its arguments and returns its JSON lines keyed by "check:arg". The pod retries each check on transport
    errors for up to 60 s itself; its log, status and events are in the message when it does not succeed."""
    from localcluster.realnode import PODCHECK_IMAGE

    spec: dict[str, Any] = {
        "nodeSelector": {"servlane.dev/real-node": "true"},
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "containers": [
            {
                "name": "podcheck",
                "image": PODCHECK_IMAGE,
                "imagePullPolicy": "Never",
                "args": checks,
                "env": [{"name": "DEADLINE", "value": "60s"}],
            }
        ],
    }
    if service_account:
        spec["serviceAccountName"] = service_account
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"
    c.api("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", {"metadata": {"name": name}, "spec": spec})

    def finished() -> dict[str, Any] | None:
        pod: dict[str, Any] = c.api("GET", path)
        return pod if pod.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

    pod = wait_until(f"pod {name} finished", finished, timeout=150, interval=0.5)
    log = _text(c, f"{path}/log")
    events = c.api("GET", f"/api/v1/namespaces/{NAMESPACE}/events?fieldSelector=involvedObject.name={name}")["items"]
    context = f"pod {name}: phase {pod['status']['phase']}\nlog:\n{log}\nevents:\n" + "\n".join(
        f"{e['reason']}: {e.get('message')}" for e in events
    )
    assert pod["status"]["phase"] == "Succeeded", context
    assert not [e for e in events if e["reason"] == "MissingClusterDNS"], context
    results = {f"{r['check']}:{r['arg']}": r for r in map(json.loads, log.splitlines()) if "check" in r}
    assert set(results) == set(checks), context
    c.api("DELETE", path)
    return results


def test_pod_resolves_services_by_name(cluster: LocalCluster) -> None:
    """CoreDNS behind kube-system/kube-dns (10.0.0.10): a pod resolves a Service by its full name and by its
    short name (the kubelet's search domains), and fetches from it by name."""
    c = cluster
    _namespace(c)
    dns = c.api("GET", "/api/v1/namespaces/kube-system/services/kube-dns")
    assert dns["spec"]["clusterIP"] == "10.0.0.10"
    _running_pod(c, "dns-web", "found-by-name", app="dns-web")
    service = c.api(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/services",
        {
            "metadata": {"name": "dns-web"},
            "spec": {"selector": {"app": "dns-web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    cluster_ip = service["spec"]["clusterIP"]
    wait_until(
        "dns-web has a ready endpoint", lambda: _ready_endpoints(c, NAMESPACE, "dns-web"), timeout=60, interval=0.5
    )

    fqdn = f"dns-web.{NAMESPACE}.svc.cluster.local"
    results = _podcheck(
        c,
        "dns-check",
        [f"lookup:{fqdn}", "lookup:dns-web", "lookup:kubernetes.default", "get:http://dns-web/", f"get:http://{fqdn}/"],
    )
    assert results[f"lookup:{fqdn}"]["body"] == cluster_ip, results
    assert results["lookup:dns-web"]["body"] == cluster_ip, results
    assert results["lookup:kubernetes.default"]["body"] == "10.0.0.1", results
    for url in ("http://dns-web/", f"http://{fqdn}/"):
        assert (results[f"get:{url}"]["status"], results[f"get:{url}"]["body"]) == (200, "hello from dns-web"), results

    c.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/services/dns-web")
    c.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/dns-web")


def test_pod_reads_its_own_pod_with_its_service_account(cluster: LocalCluster) -> None:
    """In-cluster config: the `kubernetes` Service's endpoint is the node's address (the API server listens
    there), the pod gets a projected token and the cluster CA (kube-root-ca.crt), and with a Role allowing
    `get pods` it reads its own pod through https://kubernetes.default.svc, and nothing else (403)."""
    c = cluster
    _namespace(c)
    node = c.api("GET", "/api/v1/nodes/real-node-1")
    node_ip = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
    assert _ready_endpoints(c, "default", "kubernetes") == [node_ip]
    ca = (c.pki_dir / "ca.crt").read_text()
    root_ca = _wait(
        "kube-root-ca.crt published",
        lambda: c.api("GET", f"/api/v1/namespaces/{NAMESPACE}/configmaps/kube-root-ca.crt"),
        60,
    )
    assert root_ca["data"]["ca.crt"].strip() == ca.strip()

    ns_api = f"/api/v1/namespaces/{NAMESPACE}"
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}"
    c.api("POST", f"{ns_api}/serviceaccounts", {"metadata": {"name": "pod-reader"}})
    c.api(
        "POST",
        f"{rbac}/roles",
        {"metadata": {"name": "get-pods"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]},
    )
    c.api(
        "POST",
        f"{rbac}/rolebindings",
        {
            "metadata": {"name": "pod-reader-get-pods"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "get-pods"},
            "subjects": [{"kind": "ServiceAccount", "name": "pod-reader", "namespace": NAMESPACE}],
        },
    )
    own = f"/api/v1/namespaces/{NAMESPACE}/pods/api-check"
    by_name, by_ip = f"https://kubernetes.default.svc{own}", f"https://10.0.0.1{own}"
    forbidden = f"https://kubernetes.default.svc/api/v1/namespaces/{NAMESPACE}/secrets"
    results = _podcheck(c, "api-check", [f"apiget:{by_name}", f"apiget:{by_ip}", f"apiget:{forbidden}"], "pod-reader")

    for url in (by_name, by_ip):
        answer = results[f"apiget:{url}"]
        assert answer["status"] == 200, answer
        pod = json.loads(answer["body"])
        assert (pod["metadata"]["name"], pod["spec"]["serviceAccountName"]) == ("api-check", "pod-reader")
        projected = [v for v in pod["spec"]["volumes"] if v["name"].startswith("kube-api-access-")]
        sources = [s for v in projected for s in v["projected"]["sources"]]
        assert any("serviceAccountToken" in s for s in sources), pod["spec"]["volumes"]
    denied = results[f"apiget:{forbidden}"]
    assert denied["status"] == 403, denied
    assert f"system:serviceaccount:{NAMESPACE}:pod-reader" in denied["body"], denied


# --- NetworkPolicy on the real node (kube-router's firewall controller, localcluster/build-netpol.sh) ---
NETPOL_NAMESPACES = ("netpol-server", "netpol-friends", "netpol-others")


def _pod_in(c: LocalCluster, namespace: str, name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A hello pod in `namespace` with `labels`, Running and Ready."""
    body = _pod(name, name, app=name)
    body["metadata"]["labels"] |= labels
    c.api("POST", f"/api/v1/namespaces/{namespace}/pods", body)
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"

    def ready() -> dict[str, Any] | None:
        pod: dict[str, Any] = c.api("GET", path)
        status = pod.get("status", {})
        conditions = {x["type"]: x["status"] for x in status.get("conditions", [])}
        return pod if status.get("phase") == "Running" and conditions.get("Ready") == "True" else None

    return wait_until(f"pod {namespace}/{name} Running and Ready", ready, timeout=120, interval=0.5)


def test_network_policy_admits_only_the_selected_pods(cluster: LocalCluster) -> None:
    """A NetworkPolicy is enforced on the real node: the server admits only pods labelled `role: friend` in
    namespace netpol-friends. Before the policy every client reaches it (so a failure below is the policy's
    doing); with it, that client still does, while an unlabelled pod in the same namespace and a labelled one
    in a third namespace are refused (or time out), and the host (the kubelet's probes) still gets through."""
    c = cluster
    server_ns, friends_ns, others_ns = NETPOL_NAMESPACES
    for ns in NETPOL_NAMESPACES:
        c.api("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    for ns in NETPOL_NAMESPACES:
        wait_until(
            f"{ns}: default ServiceAccount",
            functools.partial(c.api, "GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default"),
            timeout=60,
            interval=0.5,
            tolerate=lambda exc: isinstance(exc, urllib.error.HTTPError) and exc.code == 404,
        )
    try:
        server = _pod_in(c, server_ns, "server", {})
        clients = {
            "friend": _pod_in(c, friends_ns, "friend", {"role": "friend"}),
            "stranger": _pod_in(c, friends_ns, "stranger", {}),
            "outsider": _pod_in(c, others_ns, "outsider", {"role": "friend"}),
        }
        url = f"http://{server['status']['podIP']}:8080/"
        netns = {name: netns_of(c, pod["status"]["podIP"]) for name, pod in clients.items()}
        for name, ns in netns.items():
            answer = wait_until(
                f"before the policy: {name} reaches the server",
                functools.partial(get_in_pod, ns, url),
                timeout=30,
                interval=0.5,
                tolerate=_refused_or_timed_out,
            )
            assert answer == "hello from server", (name, answer)

        c.api(
            "POST",
            f"/apis/networking.k8s.io/v1/namespaces/{server_ns}/networkpolicies",
            {
                "metadata": {"name": "friends-only"},
                "spec": {
                    "podSelector": {"matchLabels": {"app": "server"}},
                    "policyTypes": ["Ingress"],
                    "ingress": [
                        {
                            "from": [
                                {
                                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": friends_ns}},
                                    "podSelector": {"matchLabels": {"role": "friend"}},
                                }
                            ]
                        }
                    ],
                },
            },
        )
        # Enforced once kube-router has synced the policy: polled with a deadline, each try bounded at 5 s.
        for name in ("stranger", "outsider"):
            wait_until(
                f"with the policy: {name} is kept out",
                functools.partial(blocked, netns[name], url),
                timeout=60,
                interval=0.5,
            )
        assert get_in_pod(netns["friend"], url) == "hello from server"
        for name in ("stranger", "outsider"):  # still out on a second try, not a one-off loss
            why = blocked(netns[name], url)
            assert why is not None, name
            print(f"\n{name} -> {url}: {why}")
        assert _get(url) == "hello from server"  # from the host: the kubelet's probes keep working
        filter_rules = subprocess.run(
            ["iptables-save", "-t", "filter"], capture_output=True, text=True, check=False
        ).stdout
        assert "policy name friends-only namespace netpol-server" in filter_rules, filter_rules[-3000:]
    finally:
        for ns in NETPOL_NAMESPACES:
            with contextlib.suppress(urllib.error.HTTPError):
                c.api("DELETE", f"/api/v1/namespaces/{ns}")


# A layer that deletes a file (an overlayfs whiteout) and replaces a folder (an opaque folder), over our
# operator image's layers: what linking Docker's layer folders into the node's snapshots must keep.
LINKED_PROBE_DOCKERFILE = f"""FROM {OPERATOR_IMAGE}
USER root
RUN mkdir -p /probe/replaced && echo old > /probe/replaced/old && echo gone > /probe/gone && echo kept > /probe/kept
RUN rm /probe/gone && rm -rf /probe/replaced && mkdir /probe/replaced && echo new > /probe/replaced/new
USER 10001:10001
"""


def test_a_docker_image_linked_into_the_node_runs_with_its_deletions_and_its_removal_frees_its_snapshots(
    cluster: LocalCluster,
) -> None:
    """`import_docker_image` links Docker's overlay2 layers (localcluster/docker_layers.py): a pod sees the
    image's files as Docker built them, deleted files and replaced folders included, and removing the image
    lets containerd's garbage collector take its snapshots."""
    node = cluster.node
    assert node is not None
    if subprocess.run(["docker", "image", "inspect", OPERATOR_IMAGE], capture_output=True).returncode != 0:
        unavailable(f"{OPERATOR_IMAGE} is not built (scripts/build-images.sh all)")
    ref = f"servlane.local/linked-probe:{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["docker", "build", "--quiet", "-t", ref, "-"],
        input=LINKED_PROBE_DOCKERFILE.encode(),
        env={**os.environ, "DOCKER_BUILDKIT": "0"},  # the classic builder: any client, no buildx
        check=True,
        capture_output=True,
        timeout=300,
    )
    try:
        linkable = node.docker_image_to_link(ref)
        assert linkable is not None, "Docker's overlay2 layers on the node's filesystem are linked, not copied"
        node.import_docker_image(ref)
        top = chain_ids(linkable.diff_ids)[-1]
        assert top in node.ctr("snapshots", "ls").stdout
        assert node.ctr("content", "ls", "-q").stdout.count(linkable.diff_ids[-1]) == 0, "no layer blob written"

        _namespace(cluster)
        name = f"linked-{uuid.uuid4().hex[:6]}"
        path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"servlane.dev/real-node": "true"},
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "probe",
                        "image": ref,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", "cd /probe && ls -A . replaced && cat kept"],
                    }
                ],
            },
        }
        cluster.api("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
        _wait(f"pod {name} Succeeded", lambda: cluster.api("GET", path)["status"].get("phase") == "Succeeded", 120)
        listing = _text(cluster, f"{path}/log").split()
        assert "kept" in listing, listing
        assert "new" in listing, listing
        assert "gone" not in listing, f"the deleted file shows through: {listing}"
        assert "old" not in listing, f"the replaced folder's old file shows through: {listing}"
        cluster.api("DELETE", path)
        _wait(f"pod {name} deleted", lambda: gone(cluster, path), 60)
        # A container's snapshot is a child of the image's top one and would keep it. The kubelet removes a
        # deleted pod's exited containers in its container GC, which runs once a minute (a constant, not a
        # setting): up to a minute after the deletion, later when the machine is busy (60 s was missed in CI).
        _wait("its container gone from containerd", lambda: ref not in node.ctr("containers", "ls").stdout, 180)
    finally:
        node.remove_image(ref)
        subprocess.run(["docker", "rmi", ref], capture_output=True, check=False)
    assert top not in node.ctr("snapshots", "ls").stdout, "removing the image frees its snapshots"
