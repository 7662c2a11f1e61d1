"""Traffic as a pod on the real node sends it: the pod's network namespace (mounted under the node's containerd
state), entered with nsenter, runs this interpreter's HTTP GET. For the real-node e2e (NetworkPolicy checks: who
may reach whom; a model pod's metrics port, which only the operator and the scraper may reach) and
bench/cold_start.py."""

from __future__ import annotations

import subprocess
import sys

from localcluster.cluster import LocalCluster

_GET_IN_POD = (
    "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode().strip())"
)


def netns_of(c: LocalCluster, pod_ip: str) -> str:
    """The network namespace (mounted under the node's containerd state) whose eth0 has `pod_ip`."""
    assert c.node is not None
    for ns in sorted((c.node.rundir / "state").glob("*/netns/cni-*")):
        out = subprocess.run(
            ["nsenter", f"--net={ns}", "ip", "-4", "-o", "addr", "show", "dev", "eth0"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        if f" {pod_ip}/" in out:
            return str(ns)
    raise AssertionError(f"no network namespace with {pod_ip}")


def get_in_pod(netns: str, url: str) -> str:
    """The body of a GET of `url` from `netns` (5 s bound on connect and read); OSError when it fails."""
    result = subprocess.run(
        ["nsenter", f"--net={netns}", sys.executable, "-c", _GET_IN_POD, url],
        capture_output=True,
        text=True,
        timeout=15,
        check=False,
    )
    if result.returncode != 0:
        raise OSError(f"GET {url} in {netns}: {result.stderr.strip().splitlines()[-1:]}")
    return result.stdout.strip()


def blocked(netns: str, url: str) -> str | None:
    """None when a GET from `netns` gets through; else why it did not (refused, reset, timed out)."""
    try:
        get_in_pod(netns, url)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None
