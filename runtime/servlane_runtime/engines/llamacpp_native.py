"""llama.cpp through llama-cpp-python's ctypes bindings of llama.h: one model, one context with a KV cache of
several sequences, and the calls the llama.cpp engine makes (tokenize, decode a batch, read logits or pooled
embeddings, free a sequence). Thin: no scheduling and no sampling here (llamacpp_engine decides those).

The public C API (llama_*), not llama-cpp-python's `Llama` class: `Llama` runs one sequence at a time, and the
engine decodes the tokens of every running request in one batch, as llama-server does.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np

from .base import EngineError

log = logging.getLogger("servlane_runtime.llamacpp")
GGUF_MAGIC = b"GGUF"
# ggml's log levels: what llama.cpp says at WARN and ERROR reaches the runtime's log; its INFO/DEBUG (hundreds of
# lines per load: every tensor, every buffer) does not.
_GGML_LOG_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}  # ggml.h
_last_level = logging.DEBUG
_BACKEND_READY = threading.Lock()
_backend_initialised = False


@dataclass(frozen=True)
class NativeSettings:
    """What the context is made with (engineOptions and the runtime config, resolved)."""

    sequences: int  # KV cache sequences: requests decoded together
    sequence_context: int  # tokens each sequence may hold: prompt and completion
    batch_tokens: int  # most tokens in one decode (llama.cpp's n_batch)
    threads: int
    batch_threads: int
    embeddings: bool = False


def kv_cache_bytes(n_layer: int, kv_width: int, tokens: int) -> int:
    """llama.cpp's KV cache at its default f16: a key and a value of kv_width halves per layer and token."""
    return 2 * n_layer * kv_width * 2 * tokens


def is_gguf(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def _log_line(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # Level 5 (CONT) continues the previous line at its level.
    global _last_level
    if level != 5:
        _last_level = _GGML_LOG_LEVELS.get(level, logging.DEBUG)
    if _last_level >= logging.WARNING:
        line = text.decode("utf-8", errors="replace").rstrip()
        if line:
            log.log(_last_level, "%s", line)


# Kept referenced: llama.cpp holds only the C pointer to it.
_LOG_CALLBACK = llama_cpp.llama_log_callback(_log_line)


def _init_backend() -> None:
    global _backend_initialised
    with _BACKEND_READY:
        if not _backend_initialised:
            llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _backend_initialised = True


class NativeModel:
    """A loaded GGUF model, then (open_context) its context. Not thread-safe for decoding: one thread (the
    engine's worker) decodes; tokenizing and reading pieces only read the vocabulary."""

    def __init__(self, path: str, *, use_mmap: bool = True, use_mlock: bool = False) -> None:
        _init_backend()
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = 0
        model_params.use_mmap = use_mmap
        model_params.use_mlock = use_mlock
        model = llama_cpp.llama_model_load_from_file(path.encode(), model_params)
        if not model:
            raise EngineError(f"llama.cpp cannot load {path} (its log above says why)")
        self._model = model
        self._ctx: Any = None
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(model))
        self.n_embd = int(llama_cpp.llama_model_n_embd(model))
        self.n_layer = int(llama_cpp.llama_model_n_layer(model))
        n_head = max(1, int(llama_cpp.llama_model_n_head(model)))
        # Keys and values per token and layer: the heads the KV cache keeps (grouped-query attention keeps fewer).
        self.kv_width = self.n_embd // n_head * int(llama_cpp.llama_model_n_head_kv(model))
        self._add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        self.bos = int(llama_cpp.llama_vocab_bos(self._vocab))
        self.eos = int(llama_cpp.llama_vocab_eos(self._vocab))
        self._pieces: dict[int, bytes] = {}
        self.settings = NativeSettings(1, 1, 1, 1, 1)

    def open_context(self, settings: NativeSettings) -> None:
        ctx_params = llama_cpp.llama_context_default_params()
        ctx_params.n_ctx = settings.sequences * settings.sequence_context
        ctx_params.n_seq_max = settings.sequences
        ctx_params.n_batch = settings.batch_tokens
        ctx_params.n_ubatch = settings.batch_tokens
        ctx_params.n_threads = settings.threads
        ctx_params.n_threads_batch = settings.batch_threads
        ctx_params.embeddings = settings.embeddings
        ctx_params.kv_unified = False  # each sequence its own share of the cache: one cannot crowd out another
        ctx = llama_cpp.llama_init_from_model(self._model, ctx_params)
        if not ctx:
            raise EngineError(
                f"llama.cpp cannot make a context of {ctx_params.n_ctx} tokens for {settings.sequences} sequences "
                "(too little memory for its KV cache? lower engineOptions.maxModelLen or "
                "engineOptions.llamacpp.parallelRequests)"
            )
        self._ctx = ctx
        self._memory = llama_cpp.llama_get_memory(ctx)
        self._batch = llama_cpp.llama_batch_init(settings.batch_tokens, 0, 1)
        self.settings = settings

    # --- vocabulary ---
    def tokenize(self, text: str, add_special: bool) -> list[int]:
        """`text` as tokens; special tokens written in it (<s>, <|user|>) are parsed as such, as chat templates
        produce them. `add_special`: prepend BOS where the model wants one."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        while True:
            buffer = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(
                self._vocab, data, len(data), buffer, capacity, add_special and self._add_bos, True
            )
            if n >= 0:
                return list(buffer[:n])
            capacity = -n

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for (a multi-byte character may be split over tokens); special tokens
        render as their text."""
        found = self._pieces.get(token)
        if found is None:
            buffer = ctypes.create_string_buffer(64)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, 64, 0, True)
            if n < 0:
                buffer = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, -n, 0, True)
            found = self._pieces[token] = buffer.raw[:n]
        return found

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def is_control(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_control(self._vocab, token))

    def metadata(self, key: str) -> str | None:
        buffer = ctypes.create_string_buffer(1 << 16)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buffer, len(buffer))
        if n < 0:
            return None
        if n >= len(buffer):
            buffer = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buffer, len(buffer))
        return buffer.value.decode("utf-8", errors="replace")

    def chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8") if raw else None

    # --- decoding ---
    def decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of (token, position, sequence, wants_logits) entries, at most batch_tokens of them.
        The logits of entry i are then logits(i)."""
        batch = self._batch
        for i, (token, position, sequence, wants) in enumerate(entries):
            batch.token[i] = token
            batch.pos[i] = position
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = sequence
            batch.logits[i] = wants
        batch.n_tokens = len(entries)
        code = llama_cpp.llama_decode(self._ctx, batch)
        if code != 0:
            raise EngineError(f"llama_decode failed with {code} for a batch of {len(entries)} tokens")

    def logits(self, index: int) -> np.ndarray:
        """A copy of the logits of batch entry `index` (float32, n_vocab)."""
        pointer = llama_cpp.llama_get_logits_ith(self._ctx, index)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).copy()

    def sample(self, sampler: NativeSampler, index: int) -> int:
        """The next token of batch entry `index`, drawn by llama.cpp's sampler chain (which then counts it, for
        its penalties)."""
        return int(llama_cpp.llama_sampler_sample(sampler.chain, self._ctx, index))

    def sequence_embedding(self, sequence: int) -> np.ndarray:
        pointer = llama_cpp.llama_get_embeddings_seq(self._ctx, sequence)
        if not pointer:
            raise EngineError("this model pools no embedding per sequence (pooling type none)")
        return np.ctypeslib.as_array(pointer, shape=(self.n_embd,)).copy()

    def sequence_state(self, sequence: int) -> bytearray:
        """A copy of a sequence's KV state (its cells, positions, keys and values), for restore_sequence.

        Written straight into the buffer that is kept: a second copy (into bytes) cost as much again, most of it
        the kernel's page faults on fresh memory (2.3 ms for 1.7 MB measured, against 0.06 ms for the copy)."""
        size = int(llama_cpp.llama_state_seq_get_size(self._ctx, sequence))
        buffer = bytearray(size)
        view = (ctypes.c_uint8 * size).from_buffer(buffer)
        written = int(llama_cpp.llama_state_seq_get_data(self._ctx, view, size, sequence))
        del view  # a bytearray cannot shrink while a ctypes view exports it
        if written != size:
            del buffer[written:]
        return buffer

    def restore_sequence(self, sequence: int, state: bytearray) -> bool:
        """A sequence's KV cache replaced by a state sequence_state copied (of any sequence). False if llama.cpp
        could not place it (the sequence is then empty). Read in place: llama.cpp only reads `state`."""
        self.forget(sequence)
        source = (ctypes.c_uint8 * len(state)).from_buffer(state)
        if int(llama_cpp.llama_state_seq_set_data(self._ctx, source, len(state), sequence)) == 0:
            self.forget(sequence)
            return False
        return True

    def forget(self, sequence: int, start: int = 0) -> None:
        """Free a sequence's KV cache cells from position `start` on (0: all of them)."""
        llama_cpp.llama_memory_seq_rm(self._memory, sequence, start if start > 0 else -1, -1)

    def close(self) -> None:
        if self._ctx:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None


# llama_sampler_init_dist reads this seed as "pick one at random" (LLAMA_DEFAULT_SEED).
_RANDOM_SEED = 0xFFFFFFFF


class NativeSampler:
    """llama.cpp's own sampler chain, for a request that asks for nothing it lacks: OpenAI's presence and
    frequency penalties over the completion, then greedy decoding (temperature 0) or temperature, top-p and a
    seeded draw, in vLLM's order (the temperature before top-p). One ctypes call per token instead of the logits
    copied into torch: the runtime's own sampler (transformers_sampling) stays for logprobs and JSON schemas.

    Made and freed on the engine's worker thread, one per running request."""

    def __init__(
        self,
        n_vocab: int,
        *,
        temperature: float,
        top_p: float,
        presence: float,
        frequency: float,
        window: int,
        seed: int,
    ) -> None:
        self.chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        add = llama_cpp.llama_sampler_chain_add
        if presence or frequency:
            # Over the last `window` tokens it was given: the whole completion when window is max_tokens.
            add(self.chain, llama_cpp.llama_sampler_init_penalties(n_vocab, max(1, window), 1.0, frequency, presence))
        if temperature <= 0:
            add(self.chain, llama_cpp.llama_sampler_init_greedy())
            return
        add(self.chain, llama_cpp.llama_sampler_init_temp(temperature))
        if top_p < 1.0:
            add(self.chain, llama_cpp.llama_sampler_init_top_p(top_p, 1))
        # 32 bits of the seed; never the value llama.cpp reads as "random", so a seed always reproduces.
        add(self.chain, llama_cpp.llama_sampler_init_dist(seed % _RANDOM_SEED))

    def close(self) -> None:
        if self.chain:
            llama_cpp.llama_sampler_free(self.chain)  # frees the samplers added to it too
            self.chain = None
