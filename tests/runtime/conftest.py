"""Runtime test fixtures: real uvicorn servers on loopback ports, real tiny models."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing downloads weights at test time

from servlane_api.runtime_config import RuntimeConfig
from servlane_devtools.tiny_model import gguf_of
from tests.support import models as shared_models
from tests.support.servers import InProcessServer, tiny_config

# The shared model fixtures, re-exported so pytest finds them for these tests.
tiny_llama_dir = shared_models.tiny_llama_dir
minilm_model_dir = shared_models.minilm_model_dir
tiny_adapter_dirs = shared_models.tiny_adapter_dirs


@pytest.fixture(scope="session")
def chat_server(tiny_llama_dir: Path) -> Iterator[InProcessServer]:
    with InProcessServer(tiny_config(tiny_llama_dir)) as server:
        server.wait_ready()
        yield server


@pytest.fixture(scope="session")
def llamacpp_chat_server(tiny_llama_dir: Path) -> Iterator[InProcessServer]:
    """The tiny Llama on the llama.cpp engine, from its GGUF (llama.cpp's converter)."""
    gguf = gguf_of(tiny_llama_dir)
    with InProcessServer(tiny_config(gguf.parent, engine="llamacpp")) as server:
        server.wait_ready()
        yield server


@pytest.fixture(scope="session")
def llamacpp_embed_server(minilm_model_dir: Path) -> Iterator[InProcessServer]:
    gguf = gguf_of(minilm_model_dir)
    config = RuntimeConfig(model_source=str(gguf.parent), served_model_name="minilm", engine="llamacpp", task="embed")
    with InProcessServer(config) as server:
        server.wait_ready()
        yield server


@pytest.fixture(scope="session")
def embed_server(minilm_model_dir: Path) -> Iterator[InProcessServer]:
    config = RuntimeConfig(
        model_source=str(minilm_model_dir), served_model_name="minilm", engine="transformers", task="embed"
    )
    with InProcessServer(config) as server:
        server.wait_ready()
        yield server
