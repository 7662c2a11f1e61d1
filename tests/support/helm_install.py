"""`helm install --wait` of our chart on the real node, as the real-node Helm e2e modules and bench/cold_start.py
do it: the values written where a failed run leaves them (.artifacts), the pods' story added to a failed install,
and the gateway's NodePort (the host's way in)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.cluster import LocalCluster
from tests.support.helmtool import CHART, Helm, HelmUnavailable, find_helm

INSTALL_TIMEOUT = "300s"


def helm_or_fail() -> Helm:
    try:
        return Helm(find_helm())
    except HelmUnavailable as exc:
        pytest.fail(f"helm is built with the control plane, so it must be there: {exc}")


def install_chart(
    cluster: LocalCluster,
    helm: Helm,
    release: str,
    namespace: str,
    values: dict[str, Any],
    values_file: Path,
    story: Callable[[], str],
) -> float:
    """Installs the chart with `values` (kept in `values_file`) and waits for its pods; returns the seconds
    it took. A failed install raises with `story()` (the pods, their events and logs) appended."""
    values_file.write_text(yaml.safe_dump(values))
    started = time.monotonic()
    try:
        helm.run(
            "install", release, str(CHART), "--namespace", namespace, "--create-namespace",
            "--values", str(values_file), "--wait", "--timeout", INSTALL_TIMEOUT,
            kubeconfig=cluster.kubeconfig,
        )  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{story()}") from None
    return time.monotonic() - started


def gateway_node_port(cluster: LocalCluster, release: str, namespace: str) -> str:
    """http://127.0.0.1:<nodePort> of the release's gateway Service (installed with service.type NodePort)."""
    service = cluster.api("GET", f"/api/v1/namespaces/{namespace}/services/{release}-gateway")
    return f"http://127.0.0.1:{service['spec']['ports'][0]['nodePort']}"


def uninstall_chart(cluster: LocalCluster, helm: Helm, release: str, namespace: str) -> None:
    helm.run("uninstall", release, "-n", namespace, "--ignore-not-found", kubeconfig=cluster.kubeconfig)
