"""LoRA adapters on both engines: listed in the adapters file, loaded live, served under their own names.

One server per engine; the test walks the life of adapters on it in order (the file is the server's
state): listed at start, added while serving, a broken one, removed. The base model answers throughout.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.polling import wait_until
from tests.support.servers import InProcessServer, _Server, tiny_config
from tests.support.vllm import vllm_config, vllm_runtime

BASE = "tiny-llama"
PROMPT = [{"role": "user", "content": "Hello"}]


def write_adapters(path: Path, adapters: dict[str, Path | str]) -> None:
    # Written aside and renamed into place, as the kubelet swaps a ConfigMap volume's files.
    scratch = path.with_suffix(".tmp")
    scratch.write_text(json.dumps([{"name": n, "source": str(s)} for n, s in adapters.items()]))
    scratch.replace(path)


@pytest.fixture(params=["transformers", pytest.param("vllm", marks=pytest.mark.slow)])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def served(
    engine: str, tiny_llama_dir: Path, tiny_adapter_dirs: tuple[Path, Path], tmp_path: Path
) -> Iterator[tuple[_Server, Path]]:
    adapters_file = tmp_path / "adapters.json"
    write_adapters(adapters_file, {"a1": tiny_adapter_dirs[0]})
    common: dict[str, Any] = {"adapters_enabled": True, "adapters_file": str(adapters_file), "max_adapters": 2}
    if engine == "transformers":
        with InProcessServer(tiny_config(tiny_llama_dir, **common)) as server:
            server.wait_ready()
            yield server, adapters_file
        return
    with vllm_runtime(vllm_config(tiny_llama_dir, **common)) as vllm:
        yield vllm, adapters_file


def chat(server: _Server, model: str, stream: bool = False) -> httpx.Response:
    body = {"model": model, "messages": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "stream": stream}
    return httpx.post(f"{server.v1}/chat/completions", json=body, timeout=120)


def answer(server: _Server, model: str) -> str:
    response = chat(server, model)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == model
    return str(response.json()["choices"][0]["message"]["content"])


def model_ids(server: _Server) -> dict[str, str | None]:
    return {card["id"]: card.get("parent") for card in server.get("/v1/models").json()["data"]}


def test_adapters_load_serve_and_unload_live(
    served: tuple[_Server, Path], tiny_adapter_dirs: tuple[Path, Path]
) -> None:
    server, adapters_file = served
    first, second = tiny_adapter_dirs

    # Listed at start: loaded before the server turned ready, listed with its base as parent.
    assert server.ready_body()["adapters"] == {"a1": {"state": "ready"}}
    assert model_ids(server) == {BASE: None, "a1": BASE}
    base_text, a1_text = answer(server, BASE), answer(server, "a1")
    assert a1_text != base_text, "the adapter changed nothing: it was not applied"
    streamed = chat(server, "a1", stream=True)
    assert streamed.status_code == 200
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert chunks
    assert all(chunk["model"] == "a1" for chunk in chunks)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == a1_text

    # Added while serving: callable without a restart, and a different adapter answers differently.
    write_adapters(adapters_file, {"a1": first, "a2": second, "broken": "/nonexistent/adapter"})
    wait_until("a2 to be served", lambda: "a2" in model_ids(server), timeout=60)
    a2_text = answer(server, "a2")
    assert a2_text not in (a1_text, base_text)
    assert answer(server, "a1") == a1_text  # the others keep their own weights

    # A broken adapter fails alone, says why, and its requests get 503 (not 404: it is listed).
    wait_until(
        "the broken adapter to fail", lambda: server.ready_body()["adapters"].get("broken", {}).get("state") == "failed"
    )
    assert "/nonexistent/adapter" in server.ready_body()["adapters"]["broken"]["reason"]
    refused = chat(server, "broken")
    assert refused.status_code == 503
    assert "Retry-After" in refused.headers
    assert refused.json()["error"]["message"].startswith("The adapter 'broken' failed to load")

    # Removed: 404 like any unknown model; the base model and the remaining adapter still answer the same.
    write_adapters(adapters_file, {"a2": second})
    wait_until("a1 to be gone", lambda: chat(server, "a1").status_code == 404, timeout=60)
    assert chat(server, "a1").json()["error"]["code"] == "model_not_found"
    assert model_ids(server) == {BASE: None, "a2": BASE}
    assert answer(server, BASE) == base_text
    assert answer(server, "a2") == a2_text
    assert chat(server, "no-such-adapter").status_code == 404

    # The last one removed: the base model alone, as before any adapter.
    write_adapters(adapters_file, {})
    wait_until("no adapters", lambda: model_ids(server) == {BASE: None}, timeout=60)
    assert answer(server, BASE) == base_text
