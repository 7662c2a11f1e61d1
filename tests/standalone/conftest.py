"""Standalone-mode fixtures: real tiny models, a corrupted copy for the failing canary, manifest helpers."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing downloads weights at test time

from tests.support import models as shared_models

tiny_llama_dir = shared_models.tiny_llama_dir


@pytest.fixture(scope="session")
def nan_llama_dir(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with a corrupted checkpoint: its output layer is all NaN.

    A real failure mode (a broken conversion or quantisation) that passes the runtime's warm-up, which
    decodes one token greedily (argmax over NaNs still picks a token), and then fails every sampled
    request: the sampler refuses probabilities that are not finite, so the runtime answers 500. The canary
    analysis sees genuine 5xx responses counted by the gateway.
    """
    import torch
    from safetensors.torch import load_file, save_file

    target = tmp_path_factory.mktemp("models") / "tiny-llama-nan"
    shutil.copytree(tiny_llama_dir, target)
    weights = load_file(target / "model.safetensors")
    weights["lm_head.weight"] = torch.full_like(weights["lm_head.weight"], float("nan"))
    save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
    return target
