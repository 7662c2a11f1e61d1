"""The transformers engine: Hugging Face models on CPU or one GPU, one request per worker thread.

Generation is a plain token-by-token loop with the KV cache (rather than `model.generate`) so that
each token is streamed as soon as it exists, OpenAI's presence/frequency penalties and logprobs
are exact, and a cancelled request stops at the next token. The loop runs in a worker thread and
hands tokens to the event loop through an asyncio queue.

Structured outputs (a JSON schema from response_format or forced tool calls) are xgrammar's: its
GrammarMatcher masks, at every step, the tokens that would leave the schema (the loop applies the mask
before sampling). Compiled grammars are cached by xgrammar's compiler, keyed by the schema. The sampling
itself (penalties, top-p, logprobs, the grammar's mask) is in transformers_sampling.

LoRA adapters are peft's, on the one shared model: a step runs with one adapter active (or none, for
the base model). Requests for the same adapter step together; a request for another waits for the running
steps to finish, then the switch happens (adapter_switch, taken per token, so no request waits for a
whole generation of another adapter). Without any adapter loaded the model is the plain one.

A device failure (a CUDA error: illegal memory access, device-side assert, a lost GPU) leaves the CUDA
context unusable for every later request, so it is raised as EngineDeadError; out of memory is not one.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

from servlane_api.runtime_config import RuntimeConfig

from .adapter_switch import AdapterSwitch
from .base import (
    AdapterUsers,
    EmbeddingResult,
    EngineDeadError,
    EngineError,
    GenerationDelta,
    InferenceEngine,
    PromptInput,
    RequestNotSupported,
    SamplingOptions,
    TokenLogprob,
)
from .chat_template import ChatTemplate
from .text_stream import StopTextStream
from .transformers_sampling import Guide, penalised, sample, unseeded

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_DEFAULT_MAX_LEN = 2048
_EMBED_BATCH = 32  # inputs per forward pass of an embedding model (sentence-transformers' default batch size)
# Memory for compiled grammars (xgrammar's cache): schemas come from clients, so the cache is bounded.
_GRAMMAR_CACHE_BYTES = 64 * 1024 * 1024
# Unloading an adapter waits this long at most for the generations that use it (then they may fail).
_ADAPTER_DRAIN_SECONDS = 600.0


class TransformersEngine(InferenceEngine):
    def __init__(self, config: RuntimeConfig, model_path: str) -> None:
        self._config = config
        self._path = model_path
        self._device = "cuda" if torch.cuda.is_available() else "cpu"
        self._model: Any = None
        self._tokenizer: Any = None
        self._max_len = config.max_model_len or _DEFAULT_MAX_LEN
        self._eos: set[int] = set()
        self._chat: ChatTemplate | None = None
        self._grammars: Any = None  # xgrammar's GrammarCompiler, made on the first structured request
        self._grammars_lock = threading.Lock()
        # One thread per running request: admission control bounds how many there are.
        self._pool = ThreadPoolExecutor(max_workers=config.max_in_flight, thread_name_prefix="generate")
        self._switch = AdapterSwitch(self._activate)
        self._adapters: set[str] = set()
        self._adapter_users = AdapterUsers()

    @property
    def max_model_len(self) -> int:
        return self._max_len

    @property
    def vocab_size(self) -> int | None:
        return int(self._model.config.vocab_size) if self._model is not None else None

    async def load(self) -> None:
        await asyncio.to_thread(self._load_sync)

    def _load_sync(self) -> None:
        dtype = _DTYPES.get(self._config.dtype, torch.float32 if self._device == "cpu" else "auto")
        self._tokenizer = AutoTokenizer.from_pretrained(self._path)
        model_class: Any = AutoModel if self._config.task == "embed" else AutoModelForCausalLM
        try:
            model = model_class.from_pretrained(self._path, dtype=dtype)
        except (OSError, ValueError) as exc:
            raise EngineError(f"cannot load the model at {self._path}: {exc}") from exc
        self._model = model.to(self._device).eval()
        positions = getattr(model.config, "max_position_embeddings", None)
        if self._config.max_model_len is None and isinstance(positions, int):
            self._max_len = positions
        eos = getattr(model.generation_config, "eos_token_id", None) if self._config.task == "generate" else None
        eos = eos if eos is not None else self._tokenizer.eos_token_id
        self._eos = set(eos) if isinstance(eos, list) else ({eos} if eos is not None else set())
        self._chat = ChatTemplate(self._tokenizer)

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        assert self._chat is not None, "render_chat before load"
        return self._chat.render(messages, tools)

    def check_json_schema(self, schema: str) -> None:
        if Guide(self._compile(schema)).allows_nothing():
            raise RequestNotSupported("no value can match this JSON schema", param="response_format")

    def _compile(self, schema: str) -> Any:
        """xgrammar's compiled grammar for `schema` (cached by its compiler), or RequestNotSupported."""
        try:
            import xgrammar
        except ImportError as exc:
            raise RequestNotSupported("structured outputs need xgrammar, which is not installed") from exc
        with self._grammars_lock:
            if self._grammars is None:
                info = xgrammar.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=int(self._model.config.vocab_size), stop_token_ids=sorted(self._eos)
                )
                self._grammars = xgrammar.GrammarCompiler(info, cache_limit_bytes=_GRAMMAR_CACHE_BYTES)
        try:
            # Compact JSON: with any whitespace allowed, a weak model can pad with spaces until max_tokens.
            return self._grammars.compile_json_schema(schema, any_whitespace=False)
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError for schemas it cannot compile
            raise RequestNotSupported(f"guided decoding cannot enforce this JSON schema: {exc}") from exc

    def count_tokens(self, text: str) -> int:
        # Embeddings count without the ids: the Rust encoding's length, no Python list (see tokenize).
        backend = self._untruncated_backend()
        if backend is None:
            return len(self.tokenize(text))
        return len(backend.encode_batch([text], add_special_tokens=not self._has_bos(text))[0])

    def tokenize(self, text: str) -> list[int]:
        # Chat templates already contain the special tokens, so only plain prompts get them added.
        # A fast tokenizer's Rust batch call releases the GIL while it encodes, so a multi-megabyte prompt
        # tokenized in a worker thread does not hold up the event loop; the tokenizer's own __call__ holds it
        # for 0.2 s per 3.5 MB building its BatchEncoding. The same ids (no truncation, no padding).
        add_special = not self._has_bos(text)
        backend = self._untruncated_backend()
        if backend is None:
            return list(self._tokenizer(text, add_special_tokens=add_special)["input_ids"])
        ids: list[int] = backend.encode_batch([text], add_special_tokens=add_special)[0].ids
        return ids

    def _untruncated_backend(self) -> Any:
        """The fast tokenizer's Rust backend, unless it truncates (its counts would be short): else None."""
        backend = getattr(self._tokenizer, "backend_tokenizer", None)
        return None if backend is None or backend.truncation is not None else backend

    def _has_bos(self, text: str) -> bool:
        bos = self._tokenizer.bos_token
        return bool(bos) and text.startswith(bos)

    async def generate(
        self, prompt: PromptInput, options: SamplingOptions, request_id: str
    ) -> AsyncGenerator[GenerationDelta, None]:
        if self._config.task != "generate":
            raise EngineError("this model is loaded for embeddings, not generation")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[GenerationDelta | BaseException] = asyncio.Queue()
        cancelled = threading.Event()

        def emit(item: GenerationDelta | BaseException) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        if options.adapter is not None and options.adapter not in self._adapters:
            raise RequestNotSupported(f"the adapter {options.adapter!r} is not loaded")
        users = self._adapter_users.using(options.adapter)
        users.__enter__()
        future = loop.run_in_executor(self._pool, self._generate_sync, prompt, options, cancelled, emit)
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    break
        finally:
            # Reached on completion, error, or the consumer closing us (client gone): stop the loop.
            cancelled.set()
            try:
                await asyncio.shield(future)
            finally:
                users.__exit__(None, None, None)

    @torch.inference_mode()
    def _generate_sync(
        self, prompt: PromptInput, options: SamplingOptions, cancelled: threading.Event, emit: Any
    ) -> None:
        try:
            self._generate_loop(prompt, options, cancelled, emit)
        except Exception as exc:  # handed to the event loop, raised there
            emit(as_engine_death(exc))

    def _generate_loop(
        self, prompt: PromptInput, options: SamplingOptions, cancelled: threading.Event, emit: Any
    ) -> None:
        prompt_ids = self.tokenize(prompt) if isinstance(prompt, str) else prompt
        n_prompt = len(prompt_ids)
        generator = torch.Generator(device=self._device)
        generator.manual_seed(options.seed if options.seed is not None else unseeded())
        stream = StopTextStream(options.stop)
        inputs = torch.tensor([prompt_ids], device=self._device)
        past: Any = None
        generated: list[int] = []
        counts: Counter[int] = Counter()
        pending: list[TokenLogprob] = []
        guide = Guide(self._compile(options.json_schema)) if options.json_schema is not None else None
        for _ in range(options.max_tokens):
            if cancelled.is_set():
                return
            with self._switch.step(options.adapter):
                out = self._model(input_ids=inputs, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = penalised(out.logits[0, -1].float(), counts, options)
            if guide is not None:
                guide.mask(logits)
            token, logprob = sample(logits, options, generator, self._token_text)
            if guide is not None:
                guide.accept(token)
            if token in self._eos and not options.ignore_eos:
                step = stream.step(self._decode(generated, options.skip_special_tokens), final=True)
                emit(GenerationDelta(step.text, n_prompt, len(generated), pending, "stop"))
                return
            generated.append(token)
            counts[token] += 1
            if logprob is not None:
                pending.append(logprob)
            step = stream.step(self._decode(generated, options.skip_special_tokens))
            if step.stopped:
                emit(GenerationDelta(step.text, n_prompt, len(generated), pending, "stop"))
                return
            if step.text:
                emit(GenerationDelta(step.text, n_prompt, len(generated), pending))
                pending = []
            inputs = torch.tensor([[token]], device=self._device)
        step = stream.step(self._decode(generated, options.skip_special_tokens), final=True)
        emit(GenerationDelta(step.text, n_prompt, len(generated), pending, "length"))

    def _decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def _token_text(self, token: int) -> str:
        return str(self._tokenizer.decode([token]))

    async def load_adapter(self, name: str, path: str) -> None:
        if self._config.task != "generate":
            raise EngineError("adapters apply to task generate only")
        await asyncio.to_thread(self._load_adapter_sync, name, path)
        self._adapters.add(name)

    def _load_adapter_sync(self, name: str, path: str) -> None:
        from peft import PeftModel

        with self._switch.exclusive():
            try:
                if name in self._adapters:
                    self._model.delete_adapter(name)
                if isinstance(self._model, PeftModel):
                    self._model.load_adapter(path, adapter_name=name)
                else:
                    self._model = PeftModel.from_pretrained(self._model, path, adapter_name=name).eval()
            except (OSError, ValueError, KeyError, RuntimeError) as exc:
                raise EngineError(f"cannot load the adapter at {path}: {exc}") from exc

    async def unload_adapter(self, name: str) -> None:
        if name not in self._adapters:
            return
        self._adapters.discard(name)
        await self._adapter_users.drained(name, _ADAPTER_DRAIN_SECONDS)
        await asyncio.to_thread(self._unload_adapter_sync, name)

    def _unload_adapter_sync(self, name: str) -> None:
        with self._switch.exclusive():
            if not self._adapters:  # the last one: back to the plain model, no LoRA layers in the way
                self._model = self._model.unload().eval()
            else:
                self._model.delete_adapter(name)

    def _activate(self, name: str | None) -> None:
        """Make `name` the adapter the shared model computes with (None: the base model). Called by the switch
        while no step runs."""
        if not hasattr(self._model, "peft_config"):
            return  # no adapter loaded: the plain model is the base
        if name is None:
            self._model.base_model.disable_adapter_layers()
        else:
            self._model.base_model.enable_adapter_layers()
            self._model.set_adapter(name)

    async def embed(self, inputs: list[PromptInput]) -> EmbeddingResult:
        if self._config.task != "embed":
            raise EngineError("this model is loaded for generation; embeddings need task 'embed'")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, self._embed_sync, inputs)
        except Exception as exc:
            raise as_engine_death(exc)  # noqa: B904 - the cause is kept by as_engine_death

    @torch.inference_mode()
    def _embed_sync(self, inputs: list[PromptInput]) -> EmbeddingResult:
        # Texts tokenised together, as sentence-transformers does; token ids taken as they are.
        texts = [given for given in inputs if isinstance(given, str)]
        encoded = iter(self._tokenizer(texts, truncation=True, max_length=self._max_len)["input_ids"] if texts else [])
        ids = [given[: self._max_len] if isinstance(given, list) else next(encoded) for given in inputs]
        vectors: list[list[float]] = []
        tokens = 0
        # A few inputs per forward pass, as sentence-transformers runs them: the activations (and attention's,
        # quadratic in the length) are one such batch's, not those of a request's 2048 inputs at once.
        for start in range(0, len(ids), _EMBED_BATCH):
            batch = self._padded(ids[start : start + _EMBED_BATCH])
            hidden = self._model(**batch).last_hidden_state
            # Mean pooling over real tokens, then L2 normalisation (sentence-transformers' recipe).
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            vectors += torch.nn.functional.normalize(pooled.float(), p=2, dim=1).cpu().tolist()
            tokens += int(batch["attention_mask"].sum())
        return EmbeddingResult(vectors, tokens)

    def _padded(self, ids: list[list[int]]) -> dict[str, torch.Tensor]:
        """Sequences padded on the right to the longest, with their attention mask, on the model's device (what
        the tokenizer's pad does, without its warning that calling it on a fast tokenizer is slower)."""
        width = max(len(seq) for seq in ids)
        pad = self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0
        input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for row, seq in enumerate(ids):
            input_ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[row, : len(seq)] = 1
        return {"input_ids": input_ids.to(self._device), "attention_mask": mask.to(self._device)}

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


# What CUDA errors (torch.AcceleratorError, or RuntimeError before torch 2.8) say when the device is unusable.
_DEVICE_FAILURE_MARKERS = ("CUDA error", "device-side assert", "CUBLAS_STATUS", "CUDNN_STATUS", "NCCL error")


def is_device_failure(exc: BaseException) -> bool:
    """Whether `exc` means the device can no longer compute (sticky CUDA errors), rather than one request failing."""
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc):
        return False  # freed with the request's tensors: the next request can run
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    return isinstance(exc, RuntimeError) and any(marker in str(exc) for marker in _DEVICE_FAILURE_MARKERS)


def as_engine_death(exc: Exception) -> Exception:
    """`exc` as EngineDeadError (caused by `exc`) when it is a device failure, else `exc` itself."""
    if not is_device_failure(exc):
        return exc
    dead = EngineDeadError(f"the device failed: {exc}")
    dead.__cause__ = exc
    return dead
