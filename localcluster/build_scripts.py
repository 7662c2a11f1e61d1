"""Runs one of this folder's cached build scripts (build.sh, build-node.sh): each prints its bin folder last."""

from __future__ import annotations

import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_build_script(script: str, error: type[Exception], what: str) -> Path:
    """Runs `script` (a no-op when its cache already holds the pinned set) and returns the bin folder it prints;
    a failure raises `error` with the tail of the script's stderr."""
    result = subprocess.run([str(HERE / script)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise error(f"building {what} failed:\n{result.stderr[-4000:]}")
    return Path(result.stdout.strip().splitlines()[-1])
