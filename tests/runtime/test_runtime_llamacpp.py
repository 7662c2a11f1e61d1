"""The llama.cpp engine behind the runtime's OpenAI surface: the same request-option suite as the other engines
(tests/support/request_options.py), on the tiny Llama with the tool-capable template converted to GGUF by
llama.cpp's own converter (servlane_devtools.tiny_model.convert_to_gguf)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest

from servlane_api.runtime_config import RuntimeConfig
from servlane_api.runtime_exit import MODEL_LOAD_FAILED
from servlane_devtools.tiny_model import convert_to_gguf
from servlane_runtime.engines import create_engine
from servlane_runtime.engines.base import InferenceEngine
from servlane_runtime.engines.llamacpp_engine import LlamaCppEngine
from servlane_runtime.engines.llamacpp_native import NativeModel, NativeSampler, NativeSettings
from tests.support import request_options, tool_model
from tests.support.polling import wait_until
from tests.support.servers import InProcessServer, SubprocessServer, tiny_config

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


def test_a_file_that_is_not_gguf_ends_the_process_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "model.gguf").write_bytes(b"PK\x03\x04 a zip, not a GGUF file")
    with SubprocessServer(tiny_config(tmp_path, engine="llamacpp"), wait_for_health=False) as server:
        code = server.exit_code_within(60)
        log, message = server.log(), server.termination_log.read_text()
    assert code == MODEL_LOAD_FAILED, log
    assert "is not a GGUF file" in message, message


def test_a_folder_with_two_gguf_files_and_no_choice_names_them(tmp_path: Path, gguf_dir: Path) -> None:
    for name in ("a-Q4_K_M.gguf", "a-Q8_0.gguf"):
        (tmp_path / name).write_bytes((gguf_dir / "model.gguf").read_bytes())
    with SubprocessServer(tiny_config(tmp_path, engine="llamacpp"), wait_for_health=False) as server:
        code = server.exit_code_within(60)
        message = server.termination_log.read_text()
    assert code == MODEL_LOAD_FAILED
    assert "needs one .gguf file here (found: a-Q4_K_M.gguf, a-Q8_0.gguf)" in message, message
    # engineOptions.llamacpp.ggufFile picks one.
    config = tiny_config(tmp_path, engine="llamacpp", llamacpp={"gguf_file": "a-Q8_0.gguf"})
    with InProcessServer(config) as server:
        server.wait_ready()


def test_a_kv_cache_beyond_the_memory_allowed_is_refused_with_what_to_change(gguf_dir: Path) -> None:
    # 4 sequences of 10 million tokens: ~40 GB of KV cache for this model, more than any test machine allows.
    config = tiny_config(gguf_dir, engine="llamacpp", max_model_len=10_000_000)
    with SubprocessServer(config, wait_for_health=False) as server:
        code = server.exit_code_within(60)
        message = server.termination_log.read_text()
    assert code == MODEL_LOAD_FAILED
    assert "the model does not fit in memory" in message, message
    assert "raise resources.memory, or lower engineOptions.maxModelLen" in message


def test_a_prompt_served_from_a_kept_kv_cache_gets_the_answer_it_gets_afresh(gguf_dir: Path) -> None:
    """Sequences keep their KV cache for a next request with the same start (as llama-server's slots do): what
    is reused must not change the answer. Greedy answers to prompts sharing a long start, asked in turn."""
    config = tiny_config(gguf_dir, engine="llamacpp", max_model_len=MAX_MODEL_LEN, llamacpp={"parallel": 1})
    start = "The quick brown fox jumps over the lazy dog. " * 8
    prompts = [start + "What is the capital of France?", start + "A canary sends a small share of traffic."]
    with InProcessServer(config) as server:
        server.wait_ready()
        client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=60)

        def answer(prompt: str) -> tuple[str, int]:
            reply = client.completions.create(
                model="tiny-llama", prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
            )
            assert reply.usage is not None
            return reply.choices[0].text, reply.usage.prompt_tokens

        first = [answer(p) for p in prompts]
        again = [answer(p) for p in reversed(prompts)][::-1]
        assert again == first
        assert answer(prompts[0]) == first[0]  # the whole prompt kept: its last token decoded again


def test_prompts_beyond_the_sequences_come_back_from_host_memory_with_the_same_answers(gguf_dir: Path) -> None:
    """A sequence given to another request keeps what it held in the prompt cache (llama-server's --cache-ram): a
    prompt asked again is copied back rather than read again (usage.prompt_tokens_details.cached_tokens says how
    much), and answers as it does afresh. Without the cache only the start all the prompts share is reused."""
    start = "The quick brown fox jumps over the lazy dog. " * 8
    prompts = [start + f"Question {i}: what does a canary rollout measure?" for i in range(3)]

    def served(prompt_cache_mib: int) -> tuple[list[tuple[str, int, int]], list[tuple[str, int, int]]]:
        options = {"parallel": 1, "prompt_cache_mib": prompt_cache_mib}
        config = tiny_config(gguf_dir, engine="llamacpp", max_model_len=MAX_MODEL_LEN, llamacpp=options)
        with InProcessServer(config) as server:
            server.wait_ready()
            client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=60)

            def answer(prompt: str) -> tuple[str, int, int]:
                reply = client.completions.create(
                    model="tiny-llama", prompt=prompt, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
                )
                usage = reply.usage
                assert usage is not None
                assert usage.prompt_tokens_details is not None  # the llama.cpp engine always says
                return reply.choices[0].text, usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens or 0

            first = [answer(p) for p in prompts]  # one sequence: each prompt takes it from the one before
            return first, [answer(p) for p in prompts]

    first, again = served(prompt_cache_mib=64)
    assert [text for text, _, _ in again] == [text for text, _, _ in first]
    assert [cached for _, _, cached in again] == [tokens - 1 for _, tokens, _ in again]
    first_uncached, again_uncached = served(prompt_cache_mib=0)
    assert [text for text, _, _ in first_uncached + again_uncached] == [text for text, _, _ in first + again]
    shared = {cached for _, _, cached in again_uncached}
    assert len(shared) == 1
    assert 0 < shared.pop() < min(tokens - 1 for _, tokens, _ in again_uncached)


def test_llamacpps_sampler_chain_draws_what_the_options_say(gguf_dir: Path) -> None:
    """Plain requests are sampled by llama.cpp's chain (NativeSampler): greedy is the argmax of the logits, a
    vanishing top_p leaves the likeliest token, a seed reproduces its draws and another seed draws others, and
    OpenAI's presence penalty steers away from a token already drawn."""
    model = NativeModel(str(gguf_dir / "model.gguf"))
    model.open_context(NativeSettings(sequences=1, sequence_context=64, batch_tokens=64, threads=2, batch_threads=2))
    try:
        prompt = model.tokenize("The quick brown fox jumps over the lazy dog", add_special=True)
        model.decode([(token, i, 0, i == len(prompt) - 1) for i, token in enumerate(prompt)])
        last = len(prompt) - 1
        likeliest = int(np.argmax(model.logits(last)))

        def drawn(times: int = 1, **options: float) -> list[int]:
            settings: dict[str, float] = {"temperature": 0.0, "top_p": 1.0, "presence": 0.0, "frequency": 0.0}
            sampler = NativeSampler(model.n_vocab, window=16, seed=int(options.pop("seed", 0)), **settings | options)
            try:
                return [model.sample(sampler, last) for _ in range(times)]
            finally:
                sampler.close()

        assert drawn() == [likeliest]
        assert drawn(temperature=1.0, top_p=1e-9, seed=3) == [likeliest]
        hot = {"temperature": 50.0}  # the random model's logits are close: at 50 every token is about as likely
        assert drawn(20, seed=7, **hot) == drawn(20, seed=7, **hot)
        assert drawn(20, seed=7, **hot) != drawn(20, seed=8, **hot)
        assert len(set(drawn(20, seed=7, **hot))) > 1
        # Each token drawn is counted: a greedy chain with a large presence penalty never repeats itself.
        penalised = drawn(5, presence=100.0)
        assert penalised[0] == likeliest
        assert len(set(penalised)) == 5
    finally:
        model.close()


def test_plain_and_logprob_requests_get_the_same_greedy_tokens(llamacpp_server: InProcessServer) -> None:
    """A request asking for logprobs is sampled by the runtime's own sampler (torch), a plain one by llama.cpp's
    chain: at temperature 0, with and without penalties, both pick the same tokens."""
    client = openai.OpenAI(base_url=llamacpp_server.v1, api_key="unused", max_retries=0, timeout=120)
    for presence, frequency in ((0.0, 0.0), (1.5, 0.5)):
        answers = [
            client.completions.create(
                model="tiny-llama",
                prompt="A canary sends a small share of traffic",
                max_tokens=24,
                temperature=0,
                presence_penalty=presence,
                frequency_penalty=frequency,
                logprobs=logprobs,
                extra_body={"ignore_eos": True},
            )
            .choices[0]
            .text
            for logprobs in (None, 1)
        ]
        assert answers[0] == answers[1], (presence, frequency)


def test_a_finished_prompt_is_kept_while_the_engine_idles(gguf_dir: Path) -> None:
    """The state of a finished request's sequence goes to the prompt cache while the engine has nothing else to
    do, not when the next request takes the sequence (where the copy would delay that request's first token)."""
    engines: list[InferenceEngine] = []

    def keep(config: RuntimeConfig, path: str) -> InferenceEngine:
        engines.append(create_engine(config, path))
        return engines[-1]

    config = tiny_config(gguf_dir, engine="llamacpp", max_model_len=MAX_MODEL_LEN, llamacpp={"parallel": 1})
    with InProcessServer(config, keep) as server:
        server.wait_ready()
        client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=60)
        prompt = "The quick brown fox jumps over the lazy dog. " * 4
        client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=4, temperature=0)
        engine = engines[0]
        assert isinstance(engine, LlamaCppEngine)
        wait_until("the idle engine to keep the finished prompt", lambda: len(engine._prompts) == 1, timeout=10)
