"""Argo CD for the tests (issue #34): the binary built from Go modules by localcluster/build-argocd.sh (scripts/setup.sh
runs it). Missing, the tests skip; with CI=true they fail, as for every real component.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "localcluster" / "build-argocd.sh"


def argocd_bin() -> Path:
    """The folder of the argocd multi-call binary and its symlinks (build-argocd.sh --print-path)."""
    found = subprocess.run(["bash", str(BUILD_SCRIPT), "--print-path"], capture_output=True, text=True)
    if found.returncode == 0:
        return Path(found.stdout.strip())
    message = "Argo CD is not built: run localcluster/build-argocd.sh (scripts/setup.sh does)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)
