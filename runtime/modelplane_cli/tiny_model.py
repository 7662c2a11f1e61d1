"""`modelplane init-tiny-model DIR`: the tiny random-weight Llama chat model the tests use, for the example.

The recipe lives in one place, `modelplane_runtime.tiny_model`; this only places a build at a chosen path.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from modelplane_runtime.tiny_model import build_tiny_llama


def create_tiny_model(target: Path) -> Path:
    """Build the tiny model in a scratch folder next to `target`, then rename it into place (atomic:
    a folder with a config.json is always complete)."""
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.build-", dir=target.parent))
    try:
        built = build_tiny_llama(scratch)
        if (target / "config.json").is_file():  # another process finished first
            return target
        shutil.rmtree(target, ignore_errors=True)  # a leftover without config.json is incomplete
        built.rename(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target
