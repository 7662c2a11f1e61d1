"""The llama.cpp engine behind the runtime's OpenAI surface: the same request-option suite as the other engines
(tests/support/request_options.py), on the tiny Llama with the tool-capable template converted to GGUF by
llama.cpp's own converter (servlane_devtools.tiny_model.convert_to_gguf)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from servlane_devtools.tiny_model import convert_to_gguf
from tests.support import request_options, tool_model
from tests.support.servers import InProcessServer, tiny_config

tools_model_dir = tool_model.tools_model_dir
# The tool-capable template lists the tools in the prompt: about 750 tokens of this tiny tokenizer.
MAX_MODEL_LEN = 2048


@pytest.fixture(scope="module")
def gguf_dir(tools_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama-tools-gguf")
    convert_to_gguf(tools_model_dir, folder / "model.gguf")
    return folder


@pytest.fixture(scope="module")
def llamacpp_server(gguf_dir: Path) -> Iterator[InProcessServer]:
    config = tiny_config(gguf_dir, engine="llamacpp", max_model_len=MAX_MODEL_LEN, max_in_flight=8)
    with InProcessServer(config) as server:
        server.wait_ready()
        yield server


def test_every_request_option_behaves_as_on_the_other_engines(llamacpp_server: InProcessServer) -> None:
    client = openai.OpenAI(base_url=llamacpp_server.v1, api_key="unused", max_retries=0, timeout=120)
    request_options.check_every_option(client, llamacpp_server.v1)
