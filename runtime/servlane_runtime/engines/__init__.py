"""Engines, imported lazily: importing the server must not import torch or vLLM."""

from __future__ import annotations

import importlib
import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servlane_api.runtime_config import RuntimeConfig

    from .base import InferenceEngine

log = logging.getLogger(__name__)

# Each engine's module (what create_engine imports): torch and transformers, or vLLM, seconds of every start.
ENGINE_MODULES = {"transformers": ".transformers_engine", "vllm": ".vllm_engine", "llamacpp": ".llamacpp_engine"}
# Packages the engines' dependencies import for nothing the runtime uses: transformers imports scikit-learn (and
# with it much of SciPy) whenever it is installed, for assisted generation's candidate tuning, which the runtime
# never runs. sentence-transformers brings it into the CPU image; on a pod's 1.5 CPUs it was about a sixth of the
# engine's import (bench/results/cold_start.json, runtime_in_a_container).
UNUSED_PACKAGES = ("sklearn",)


def skip_unused_imports() -> None:
    """Make UNUSED_PACKAGES unimportable in this process: None in sys.modules, so importlib.util.find_spec (what
    transformers asks) says they are not installed and `import` raises ImportError. For the runtime's own process
    (its entrypoint), never a process that may need them; one already imported is left alone."""
    for name in UNUSED_PACKAGES:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


def import_engine(engine: str) -> None:
    """Import the engine's module now, e.g. in a thread while the server starts and the model's files are fetched,
    so create_engine finds it imported. A failure is left to create_engine, which raises it where it is reported."""
    module = ENGINE_MODULES.get(engine)
    if module is None:
        return
    try:
        importlib.import_module(module, __name__)
    except Exception as exc:  # create_engine imports it again and fails with the reason
        log.debug("importing the %s engine ahead failed: %s", engine, exc)


def create_engine(config: RuntimeConfig, model_path: str) -> InferenceEngine:
    """The engine named in the config, for the model files at `model_path` (not loaded yet)."""
    if config.engine == "transformers":
        from .transformers_engine import TransformersEngine

        return TransformersEngine(config, model_path)
    if config.engine == "vllm":
        from .vllm_engine import VllmEngine

        return VllmEngine(config, model_path)
    if config.engine == "llamacpp":
        from .llamacpp_engine import LlamaCppEngine

        return LlamaCppEngine(config, model_path)
    raise ValueError(f"unknown engine {config.engine!r}")
