"""Engines, imported lazily: importing the server must not import torch or vLLM."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servlane_api.runtime_config import RuntimeConfig

    from .base import InferenceEngine


def create_engine(config: RuntimeConfig, model_path: str) -> InferenceEngine:
    """The engine named in the config, for the model files at `model_path` (not loaded yet)."""
    if config.engine == "transformers":
        from .transformers_engine import TransformersEngine

        return TransformersEngine(config, model_path)
    if config.engine == "vllm":
        from .vllm_engine import VllmEngine

        return VllmEngine(config, model_path)
    raise ValueError(f"unknown engine {config.engine!r}")
