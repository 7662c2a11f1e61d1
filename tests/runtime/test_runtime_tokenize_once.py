"""A prompt is tokenized once per request: the count that decides the 400 (too long) and the ids the engine
generates from are the same list, on every engine, for short prompts (tokenized on the event loop) and long ones
(in a thread)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from servlane_api.runtime_config import RuntimeConfig
from servlane_devtools.tiny_model import gguf_of
from servlane_runtime.engines import create_engine
from servlane_runtime.engines.base import InferenceEngine
from servlane_runtime.serving import INLINE_CHARS
from tests.support.servers import InProcessServer, tiny_config


class Tokenizations:
    """Which texts the served engine tokenized, and on which thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def factory(self, config: RuntimeConfig, path: str) -> InferenceEngine:
        engine = create_engine(config, path)
        tokenize = engine.tokenize

        def counted(text: str) -> list[int]:
            with self._lock:
                self.calls.append((text, threading.current_thread().name))
            return tokenize(text)

        engine.tokenize = counted  # type: ignore[method-assign]
        return engine

    def taken(self) -> list[tuple[str, str]]:
        with self._lock:
            calls, self.calls = self.calls, []
        return calls


@pytest.fixture(scope="module", params=["transformers", "llamacpp"])
def served(request: pytest.FixtureRequest, tiny_llama_dir: Path) -> Iterator[tuple[InProcessServer, Tokenizations]]:
    seen = Tokenizations()
    source = tiny_llama_dir if request.param == "transformers" else gguf_of(tiny_llama_dir).parent
    config = tiny_config(source, engine=request.param).model_copy(update={"max_model_len": 2048})
    with InProcessServer(config, engine_factory=seen.factory) as server:
        server.wait_ready()
        seen.taken()  # the warm-up's
        yield server, seen


@pytest.mark.parametrize("words", [5, INLINE_CHARS // 10])
@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_prompt_is_tokenized_once(
    served: tuple[InProcessServer, Tokenizations], words: int, stream: bool
) -> None:
    server, seen = served
    content = "completions" + " completions" * words  # one token per word with the tiny tokenizer
    body = {
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 3,
        "stream": stream,
        "stream_options": {"include_usage": True} if stream else None,
    }
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    calls = seen.taken()
    assert len(calls) == 1, [len(text) for text, _ in calls]
    text, thread = calls[0]
    assert content in text
    # Short prompts on the event loop's thread, long ones elsewhere (a worker thread).
    on_loop = thread == server.loop_thread_name
    assert on_loop == (len(text) <= INLINE_CHARS), (len(text), thread)


def test_each_completion_prompt_is_tokenized_once_and_counted_in_usage(
    served: tuple[InProcessServer, Tokenizations],
) -> None:
    server, seen = served
    prompts = ["one two three", "four five six seven eight"]
    body = {"model": "tiny-llama", "prompt": prompts, "max_tokens": 2, "n": 2}
    response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    calls = seen.taken()
    assert sorted(text for text, _ in calls) == sorted(prompts), "once per prompt, not per choice"
    engine = server.app.state.host.engine
    expected = sum(len(engine.tokenize(text)) for text in prompts)
    seen.taken()  # this test's own
    assert response.json()["usage"]["prompt_tokens"] == expected


def test_a_prompt_over_the_context_is_refused_after_one_count(served: tuple[InProcessServer, Tokenizations]) -> None:
    server, seen = served
    body = {"model": "tiny-llama", "prompt": "kube " * 3000, "max_tokens": 2}
    response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 400, response.text
    assert len(seen.taken()) == 1


@pytest.mark.parametrize("text", ["plain words, no BOS", "<s>[INST] a chat that starts with its BOS [/INST]", ""])
def test_the_transformers_engines_ids_are_its_tokenizers(tiny_llama_dir: Path, text: str) -> None:
    """tokenize reads the Rust backend directly (no BatchEncoding): the same ids the tokenizer's own call gives,
    BOS added to plain prompts only."""
    from transformers import AutoTokenizer

    engine = create_engine(tiny_config(tiny_llama_dir), str(tiny_llama_dir))
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    engine._tokenizer = tokenizer  # type: ignore[attr-defined]  # what load() sets, without loading weights
    bos = tokenizer.bos_token
    expected = tokenizer(text, add_special_tokens=not (bos and text.startswith(bos)))["input_ids"]
    assert engine.tokenize(text) == expected
    assert engine.count_tokens(text) == len(expected)
