"""The llama.cpp engine: GGUF models (quantized or not) on CPUs, through llama-cpp-python's bindings of llama.h.

One worker thread owns the model and decodes the running requests together, as llama-server's slots do: each
step puts every generating request's newest token and chunks of waiting prompts into one batch
(llamacpp_batches.plan_batch), then samples each request's next token from its logits. Requests beyond the
context's sequences wait in the engine's queue (admission bounds it). A plain request (temperature, top-p,
OpenAI's penalties, a seed) is sampled by llama.cpp's own sampler chain, in C, as llama-server samples; one that
asks for logprobs or a JSON schema by the runtime's own sampler (transformers_sampling, on torch, with xgrammar's
mask), which follows the same rules on every engine. Both pick the same tokens at temperature 0.

The chat template is the GGUF's own (tokenizer.chat_template), rendered by transformers' Jinja renderer as the
other engines render theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
from collections import Counter
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from servlane_api.runtime_config import RuntimeConfig

from .base import (
    EmbeddingResult,
    EngineDeadError,
    EngineError,
    FinishReason,
    GenerationDelta,
    InferenceEngine,
    PromptInput,
    RequestNotSupported,
    SamplingOptions,
    TokenLogprob,
)
from .chat_template import ChatTemplate
from .cpu_memory import memory_budget_bytes
from .llamacpp_batches import SequenceView, pick_sequence, plan_batch
from .llamacpp_native import NativeModel, NativeSampler, NativeSettings, is_gguf, kv_cache_bytes
from .llamacpp_prompt_cache import PromptCache
from .text_stream import StopTextStream
from .transformers_sampling import MIN_TEMPERATURE, Guide, penalised, sample, unseeded

log = logging.getLogger(__name__)

DEFAULT_CONTEXT_CAP = 4096  # per request, when neither maxModelLen nor contextSize says: the KV cache is per slot
_GRAMMAR_CACHE_BYTES = 64 * 1024 * 1024
# Beside the weights and the KV cache: compute buffers, the runtime's Python (torch included), the tokenizer.
_OVERHEAD_BYTES = 768 * 1024 * 1024
_GIB = 1024**3
_MIB = 1024**2


def check_fits(weights: int, kv_cache: int, budget: int) -> int:
    """The bytes left for the prompt cache; EngineError, saying what to change, when the weights and the KV cache
    cannot fit in the memory allowed."""
    need = weights + kv_cache + _OVERHEAD_BYTES
    if need > budget:
        raise EngineError(
            f"the model does not fit in memory: {weights / _GIB:.2f} GiB of weights + {kv_cache / _GIB:.2f} GiB of "
            f"KV cache + {_OVERHEAD_BYTES / _GIB:.2f} GiB for the runtime need {need / _GIB:.2f} GiB, "
            f"{budget / _GIB:.2f} GiB allowed: raise resources.memory, or lower engineOptions.maxModelLen or "
            "engineOptions.llamacpp.parallelRequests, or pick a smaller quantization"
        )
    return budget - need


def find_gguf(model_path: str, file_name: str | None = None) -> str:
    """The GGUF file to load: `model_path` itself, or `file_name` in it, or its one .gguf file."""
    path = Path(model_path)
    if path.is_file():
        candidate = path
    elif file_name is not None:
        candidate = path / file_name
    else:
        found = sorted(path.glob("*.gguf"))
        if len(found) != 1:
            names = ", ".join(p.name for p in found) or "none"
            raise EngineError(f"{model_path}: the llama.cpp engine needs one .gguf file here (found: {names})")
        candidate = found[0]
    if not candidate.is_file():
        raise EngineError(f"{candidate}: no such file")
    if not is_gguf(str(candidate)):
        raise EngineError(f"{candidate} is not a GGUF file (the llama.cpp engine reads GGUF only)")
    return str(candidate)


class _GgufTokenizerView:
    """What ChatTemplate asks of a tokenizer, for a GGUF's own template and special tokens."""

    def __init__(self, template: str | None, bos_token: str, eos_token: str) -> None:
        self.chat_template = template
        self._specials = {"bos_token": bos_token, "eos_token": eos_token}

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        from transformers.utils.chat_template_utils import render_jinja_template

        render: Any = render_jinja_template  # annotated `-> str`, it returns (texts, generation indices)
        rendered, _ = render(
            [messages],
            tools=kwargs.get("tools"),
            chat_template=self.chat_template,
            add_generation_prompt=kwargs.get("add_generation_prompt", True),
            **self._specials,
        )
        return str(rendered[0])


@dataclass
class _Generation:
    """One request while the worker runs it."""

    prompt: list[int]
    options: SamplingOptions
    loop: asyncio.AbstractEventLoop
    deltas: asyncio.Queue[GenerationDelta | BaseException]  # read by generate(), on `loop`
    cancelled: threading.Event
    seed: int
    guide: Guide | None
    stream: StopTextStream
    # Sampling: llama.cpp's chain while the request runs (when it asks for nothing beyond what the chain does),
    # else the runtime's own, on torch.
    sampler: NativeSampler | None = None
    generator: torch.Generator | None = None
    sequence: int = -1
    cached: int = 0  # prompt tokens its sequence held, or the prompt cache gave back, when it started
    read: int = 0
    position: int = 0
    last_token: int | None = None
    generated: list[int] = field(default_factory=list)
    decoded: list[int] = field(default_factory=list)  # what its sequence's KV cache holds, in order
    counts: Counter[int] = field(default_factory=Counter)
    text_bytes: bytearray = field(default_factory=bytearray)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)

    def delta(self, text: str, finish_reason: FinishReason | None = None) -> GenerationDelta:
        return GenerationDelta(
            text, len(self.prompt), len(self.generated), self.pending_logprobs, finish_reason, self.cached
        )

    def view(self) -> SequenceView:
        return SequenceView(self.sequence, self.prompt, self.read, self.last_token, self.position)


class _Outbox:
    """What the worker has for the requests, handed to their event loop in one wake-up per decode step, right
    before the worker lets go of the interpreter lock for long (llama_decode, or waiting for work).

    Handed over at once, each delta woke the loop while the worker still had Python to run before its next
    decode: the two took turns at the lock and the loop's work for a token (the SSE frame, the socket write)
    delayed the next decode. Now the loop does it while llama.cpp decodes."""

    def __init__(self) -> None:
        self._items: list[tuple[_Generation, GenerationDelta | BaseException]] = []

    def put(self, job: _Generation, item: GenerationDelta | BaseException) -> None:
        self._items.append((job, item))

    def flush(self) -> None:
        if not self._items:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Generation, GenerationDelta | BaseException]]] = {}
        for job, item in self._items:
            by_loop.setdefault(job.loop, []).append((job, item))
        self._items = []
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a loop closed under a request whose client is gone
                loop.call_soon_threadsafe(_deliver, items)


def _deliver(items: list[tuple[_Generation, GenerationDelta | BaseException]]) -> None:
    for job, item in items:
        job.deltas.put_nowait(item)


@dataclass
class _EmbedJob:
    inputs: list[PromptInput]
    done: Callable[[EmbeddingResult | BaseException], None]


class LlamaCppEngine(InferenceEngine):
    def __init__(self, config: RuntimeConfig, model_path: str) -> None:
        self._config = config
        self._path = model_path
        self._native: NativeModel | None = None
        self._max_len = config.max_model_len or DEFAULT_CONTEXT_CAP
        self._chat: ChatTemplate | None = None
        self._inbox: queue.SimpleQueue[_Generation | _EmbedJob | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._dead: BaseException | None = None
        self._grammars: Any = None
        self._grammars_lock = threading.Lock()
        self._prompts = PromptCache(0)
        self._outbox = _Outbox()

    @property
    def max_model_len(self) -> int:
        return self._max_len

    @property
    def vocab_size(self) -> int | None:
        return self._native.n_vocab if self._native is not None else None

    async def load(self) -> None:
        await asyncio.to_thread(self._load_sync)

    def _settings(self, n_ctx_train: int) -> NativeSettings:
        options = self._config.llamacpp
        threads = options.threads or len(os.sched_getaffinity(0))
        sequences = options.parallel
        context = self._config.max_model_len or min(n_ctx_train or DEFAULT_CONTEXT_CAP, DEFAULT_CONTEXT_CAP)
        batch = max(options.batch_size, sequences)
        if self._config.task == "embed":
            batch = context  # an encoder reads a whole input in one batch
        return NativeSettings(
            sequences=sequences,
            sequence_context=context,
            batch_tokens=batch,
            threads=threads,
            batch_threads=threads,
            embeddings=self._config.task == "embed",
        )

    def _load_sync(self) -> None:
        options = self._config.llamacpp
        file = find_gguf(self._path, options.gguf_file)
        native = NativeModel(file, use_mmap=options.mmap, use_mlock=options.mlock)
        settings = self._settings(native.n_ctx_train)
        try:
            tokens = settings.sequences * settings.sequence_context
            kv_cache = 0 if settings.embeddings else kv_cache_bytes(native.n_layer, native.kv_width, tokens)
            spare = check_fits(os.path.getsize(file), kv_cache, memory_budget_bytes())
            native.open_context(settings)
        except EngineError:
            native.close()
            raise
        self._native = native
        self._max_len = settings.sequence_context
        # Within what the memory limit leaves: the cache is a speed-up, never a reason not to start.
        self._prompts = PromptCache(min(options.prompt_cache_mib * _MIB, spare))
        bos, eos = native.bos, native.eos
        template = native.chat_template()
        specials = (native.piece(token).decode(errors="replace") for token in (bos, eos))
        self._chat = ChatTemplate(_GgufTokenizerView(template, *specials))
        if template:
            # Before ready, not on the first chat: the renderer's import (transformers, ~2 s) and the template's
            # compilation. A canary's first requests measured 2.3 s without this, and were rolled back for it.
            self._chat.render([{"role": "user", "content": "hi"}], None)
        self._worker = threading.Thread(target=self._run, name="llamacpp", daemon=True)
        self._worker.start()

    # --- requests (event loop side) ---
    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        assert self._chat is not None, "render_chat before load"
        return self._chat.render(messages, tools)

    def tokenize(self, text: str) -> list[int]:
        assert self._native is not None
        bos = self._native.piece(self._native.bos).decode(errors="replace")
        return self._native.tokenize(text, add_special=not (bos and text.startswith(bos)))

    def check_json_schema(self, schema: str) -> None:
        self._compile(schema)

    def _compile(self, schema: str) -> Any:
        try:
            import xgrammar
        except ImportError as exc:
            raise RequestNotSupported("structured outputs need xgrammar, which is not installed") from exc
        native = self._native
        assert native is not None
        with self._grammars_lock:
            if self._grammars is None:
                vocab = [native.piece(token) for token in range(native.n_vocab)]
                stop = [token for token in range(native.n_vocab) if native.is_end_of_generation(token)]
                info = xgrammar.TokenizerInfo(vocab, xgrammar.VocabType.RAW, stop_token_ids=stop)
                self._grammars = xgrammar.GrammarCompiler(info, cache_limit_bytes=_GRAMMAR_CACHE_BYTES)
        try:
            return self._grammars.compile_json_schema(schema, any_whitespace=False)
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError for schemas it cannot compile
            raise RequestNotSupported(f"guided decoding cannot enforce this JSON schema: {exc}") from exc

    async def generate(
        self, prompt: PromptInput, options: SamplingOptions, request_id: str
    ) -> AsyncGenerator[GenerationDelta, None]:
        if self._config.task != "generate":
            raise EngineError("this model is loaded for embeddings, not generation")
        if options.adapter is not None:
            raise RequestNotSupported("the llama.cpp engine serves no LoRA adapters")
        self._raise_if_dead()
        deltas: asyncio.Queue[GenerationDelta | BaseException] = asyncio.Queue()
        guide = Guide(self._compile(options.json_schema)) if options.json_schema is not None else None
        job = _Generation(
            prompt=await asyncio.to_thread(self.tokenize, prompt) if isinstance(prompt, str) else prompt,
            options=options,
            loop=asyncio.get_running_loop(),
            deltas=deltas,
            cancelled=threading.Event(),
            seed=options.seed if options.seed is not None else unseeded(),
            guide=guide,
            stream=StopTextStream(options.stop),
        )
        self._inbox.put(job)
        try:
            while True:
                item = await deltas.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    break
        finally:
            job.cancelled.set()  # the worker drops it at its next step (client gone, or done)

    async def embed(self, inputs: list[PromptInput]) -> EmbeddingResult:
        if self._config.task != "embed":
            raise EngineError("this model is loaded for generation; embeddings need task 'embed'")
        self._raise_if_dead()
        loop = asyncio.get_running_loop()
        result: asyncio.Future[EmbeddingResult] = loop.create_future()

        def done(item: EmbeddingResult | BaseException) -> None:
            def settle() -> None:
                if result.done():
                    return
                if isinstance(item, BaseException):
                    result.set_exception(item)
                else:
                    result.set_result(item)

            loop.call_soon_threadsafe(settle)

        self._inbox.put(_EmbedJob(inputs, done))
        return await result

    def _raise_if_dead(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(f"the llama.cpp engine stopped: {self._dead}")

    async def check_health(self) -> None:
        self._raise_if_dead()
        if self._worker is not None and not self._worker.is_alive():
            raise EngineDeadError("the llama.cpp engine's worker thread ended")

    async def close(self) -> None:
        self._inbox.put(None)
        if self._worker is not None:
            await asyncio.to_thread(self._worker.join, 10)
        if self._native is not None:
            self._native.close()

    # --- the worker ---
    def _run(self) -> None:
        native = self._native
        assert native is not None
        free = list(range(native.settings.sequences))
        # The tokens each free sequence's KV cache still holds: a request with the same start reuses them.
        cached: dict[int, list[int]] = {}
        waiting: list[_Generation] = []
        running: list[_Generation] = []
        unsaved: list[int] = []  # free sequences not yet offered to the prompt cache, the newest last
        try:
            while True:
                block = not running and not waiting
                if block:
                    self._outbox.flush()
                    # Nothing to decode: keep a free sequence's prompt now rather than when a request takes the
                    # sequence (a copy of its state, ~1 ms a MiB, would then delay that request's first token).
                    # One at a time, looking for work between them.
                    block = not self._keep_free_sequence(unsaved, cached, native)
                while True:
                    try:
                        item = self._inbox.get(block=block)
                    except queue.Empty:
                        break
                    block = False
                    if item is None:
                        return
                    if isinstance(item, _EmbedJob):
                        self._embed(item, native)
                    else:
                        waiting.append(item)
                if waiting and free:
                    self._outbox.flush()  # admitting may copy a prompt's state (milliseconds)
                while waiting and free:
                    job = waiting.pop(0)
                    if job.cancelled.is_set():
                        continue
                    self._admit(job, free, cached, native)
                    if job.sequence in unsaved:
                        unsaved.remove(job.sequence)
                    running.append(job)
                for job in [j for j in running if j.cancelled.is_set()]:
                    self._release(job, running, free, cached)
                    unsaved.append(job.sequence)
                if running:
                    unsaved.extend(self._step(running, free, cached, native))
        except Exception as exc:  # the model or context failed: nothing more can run
            log.exception("the llama.cpp engine stopped")
            self._dead = exc
            for job in running + waiting:
                self._outbox.put(job, EngineDeadError(f"the llama.cpp engine stopped: {exc}"))
            self._outbox.flush()

    def _keep_free_sequence(self, unsaved: list[int], cached: dict[int, list[int]], native: NativeModel) -> bool:
        """Offer the newest free sequence's tokens to the prompt cache; False when none was left to offer."""
        if not unsaved:
            return False
        sequence = unsaved.pop()
        self._keep(cached.get(sequence, []), sequence, native)
        return True

    def _keep(self, held: list[int], sequence: int, native: NativeModel) -> None:
        """Copy the state of `sequence`, which holds `held`, into the prompt cache if the cache wants it."""
        if self._prompts.wants(held):
            self._prompts.put(held, native.sequence_state(sequence))

    def _admit(self, job: _Generation, free: list[int], cached: dict[int, list[int]], native: NativeModel) -> None:
        """Give `job` a free sequence, from the longest start of its prompt that a free sequence or the prompt
        cache holds; what the sequence held beyond that start goes to the prompt cache first."""
        sequence, reused = pick_sequence(free, cached, job.prompt)
        free.remove(sequence)
        held = cached.pop(sequence, [])
        seeded = job.options.seed is not None
        # Looked up before `held` goes in: keeping it may evict the entry that serves this prompt best.
        entry, from_cache = (None, 0) if seeded else self._prompts.best(job.prompt)
        if len(held) > reused:
            self._keep(held, sequence, native)
        if seeded:
            # llama.cpp's logits are not bit for bit the same for a prompt read afresh and one whose start was
            # kept (other batch shapes; llama-server says the same of cache_prompt): a seeded request reads its
            # whole prompt, so the same seed gives the same answer whatever the caches hold.
            reused = 0
        elif entry is not None and from_cache > reused:
            reused = from_cache if native.restore_sequence(sequence, entry.state) else 0
        native.forget(sequence, start=reused)
        job.sequence, job.cached, job.read, job.position = sequence, reused, reused, reused
        job.decoded = list(job.prompt[:reused])
        options = job.options
        # llama.cpp's chain samples what it can; logprobs, a grammar or a logit_bias go through the logits here.
        if options.logprobs is None and job.guide is None and not options.logit_bias:
            job.sampler = NativeSampler(
                native.n_vocab,
                temperature=0.0 if options.temperature <= 0 else max(options.temperature, MIN_TEMPERATURE),
                top_p=options.top_p,
                presence=options.presence_penalty,
                frequency=options.frequency_penalty,
                window=min(options.max_tokens, self._max_len),  # a penalty window: its tokens are allocated
                seed=job.seed,
            )
        else:
            job.generator = torch.Generator()
            job.generator.manual_seed(job.seed)

    @staticmethod
    def _release(job: _Generation, running: list[_Generation], free: list[int], cached: dict[int, list[int]]) -> None:
        """The sequence is free again; its KV cache stays for a next request with the same start."""
        running.remove(job)
        if job.sampler is not None:
            job.sampler.close()
        cached[job.sequence] = job.decoded
        free.append(job.sequence)

    def _step(
        self, running: list[_Generation], free: list[int], cached: dict[int, list[int]], native: NativeModel
    ) -> list[int]:
        """Decode one batch and sample every request that wanted logits; the sequences that finished."""
        entries = plan_batch([job.view() for job in running], native.settings.batch_tokens)
        self._outbox.flush()
        native.decode([(e.token, e.position, e.sequence, e.wants_logits) for e in entries])
        by_sequence = {job.sequence: job for job in running}
        finished: list[int] = []
        for index, entry in enumerate(entries):
            job = by_sequence[entry.sequence]
            job.decoded.append(entry.token)
            if job.last_token is None:
                job.read += 1
            job.position += 1
            if entry.wants_logits:
                self._next_token(job, index, native)
                if job.last_token is None:  # finished
                    self._release(job, running, free, cached)
                    finished.append(job.sequence)
        return finished

    def _next_token(self, job: _Generation, index: int, native: NativeModel) -> None:
        options = job.options
        logprob: TokenLogprob | None = None
        if job.sampler is not None:
            token = native.sample(job.sampler, index)
        else:
            assert job.generator is not None
            logits = penalised(torch.from_numpy(native.logits(index)), job.counts, options)
            if job.guide is not None:
                job.guide.mask(logits)
            token, logprob = sample(logits, options, job.generator, lambda t: native.piece(t).decode(errors="replace"))
            if job.guide is not None:
                job.guide.accept(token)
        if native.is_end_of_generation(token) and not options.ignore_eos:
            step = job.stream.step(self._text(job), final=True)
            self._outbox.put(job, job.delta(step.text, "stop"))
            job.last_token = None
            return
        job.generated.append(token)
        job.counts[token] += 1
        if not (options.skip_special_tokens and native.is_control(token)):
            job.text_bytes += native.piece(token)
        if logprob is not None:
            job.pending_logprobs.append(logprob)
        # The context holds positions up to max_model_len - 1: the token just sampled would take job.position.
        out_of_room = len(job.generated) >= options.max_tokens or job.position >= self._max_len
        step = job.stream.step(self._text(job), final=out_of_room)
        if step.stopped or out_of_room:
            reason: FinishReason = "stop" if step.stopped else "length"
            self._outbox.put(job, job.delta(step.text, reason))
            job.last_token = None
            return
        if step.text:
            self._outbox.put(job, job.delta(step.text))
            job.pending_logprobs = []
        job.last_token = token

    @staticmethod
    def _text(job: _Generation) -> str:
        return job.text_bytes.decode("utf-8", errors="replace")

    def _embed(self, job: _EmbedJob, native: NativeModel) -> None:
        try:
            vectors: list[list[float]] = []
            total = 0
            for given in job.inputs:
                tokens = (given if isinstance(given, list) else self.tokenize(given))[: self._max_len]
                total += len(tokens)
                native.decode([(t, i, 0, True) for i, t in enumerate(tokens)])
                vector = native.sequence_embedding(0)
                native.forget(0)
                norm = float(np.linalg.norm(vector)) or 1.0
                vectors.append([float(x) / norm for x in vector])
            job.done(EmbeddingResult(vectors, total))
        except Exception as exc:
            job.done(exc)
