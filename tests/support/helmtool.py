"""The helm binary (built with the local control plane by localcluster/build.sh) and chart rendering helpers."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "servlane"
MONITORING_API = "monitoring.coreos.com/v1"


class HelmUnavailable(RuntimeError):
    pass


def find_helm() -> Path:
    """$KUBEBUILDER_ASSETS/helm, else the pinned build's cache (building it when Go is there), else PATH."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets and (Path(assets) / "helm").is_file():
        return Path(assets) / "helm"
    from localcluster.cluster import ClusterError, build_binaries

    try:
        return build_binaries() / "helm"
    except ClusterError as exc:
        on_path = shutil.which("helm")
        if on_path:
            return Path(on_path)
        raise HelmUnavailable(f"no helm binary: {str(exc)[:300]}") from exc


@dataclass
class Helm:
    binary: Path

    def run(self, *args: str, check: bool = True, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "HELM_CACHE_HOME": str(ROOT / ".artifacts" / "helm-cache")}
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        result = subprocess.run([str(self.binary), *args], capture_output=True, text=True, env=env, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def template(
        self,
        *values_files: Path,
        set_values: tuple[str, ...] = (),
        api_versions: tuple[str, ...] = (),
        release: str = "mp",
        namespace: str = "servlane-system",
    ) -> list[dict[str, Any]]:
        """Renders the chart and returns its objects (without the CRDs in crds/)."""
        args = ["template", release, str(CHART), "--namespace", namespace]
        for path in values_files:
            args += ["--values", str(path)]
        for item in set_values:
            args += ["--set", item]
        for api in api_versions:
            args += ["--api-versions", api]
        return [doc for doc in yaml.safe_load_all(self.run(*args).stdout) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]
