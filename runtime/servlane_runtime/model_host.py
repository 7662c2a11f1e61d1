"""The model's life: loading in the background, a one-token warm-up, then ready; or failed, and then the end.

The server listens before the model loads, so /health answers at once and /ready tells the truth:
503 with {"status": "loading"|"failed", "reason": ...} until the warm-up has passed.

A model that cannot load, or an engine that dies while serving (vLLM's engine core process killed,
a device failure), is fatal: the host turns "failed" (/health says 503 with the reason, requests get
503 with Retry-After) and, a moment later, asks the process to exit with a code that says which
(servlane_api.runtime_exit), as `vllm serve` does. Kubernetes then restarts the container instead of
keeping a pod that answers 500 forever, or waiting out the 30-minute startup probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any, Literal

from servlane_api.runtime_config import RuntimeConfig
from servlane_api.runtime_exit import ENGINE_DIED, MODEL_LOAD_FAILED, MODEL_SOURCE_FAILED
from servlane_core.protocol.errors import OpenAIError, overloaded

from .adapters import AdapterHost
from .engines.base import (
    EmbeddingResult,
    EngineDeadError,
    GenerationDelta,
    InferenceEngine,
    PromptInput,
    SamplingOptions,
    ToolCallParser,
)
from .model_source import ModelSourceError, resolve_model_source
from .startup import StartupClock
from .termination import redact, secret_values

log = logging.getLogger(__name__)

State = Literal["loading", "ready", "failed"]
EngineFactory = Callable[[RuntimeConfig, str], InferenceEngine]

# How often a serving engine is asked whether it is still alive (a dead one with no traffic is noticed too).
HEALTH_CHECK_SECONDS = 1.0
# Between "failed" and asking the process to exit: long enough for in-flight requests and a probe to get
# the 503 and its reason rather than a reset connection, short next to any probe period.
EXIT_GRACE_SECONDS = 2.0
_RETRY_AFTER_LOADING = 5.0
# A failed runtime is about to exit and restart, which takes at least a model load.
_RETRY_AFTER_FAILED = 30.0


class ModelHost:
    def __init__(
        self, config: RuntimeConfig, engine_factory: EngineFactory, startup: StartupClock | None = None
    ) -> None:
        self.config = config
        # The start's phases (GET /startup): weights fetched, engine loaded and ready are stamped here.
        self.startup = startup if startup is not None else StartupClock()
        self._factory = engine_factory
        self.state: State = "loading"
        self.reason = "the model is loading"
        self.load_seconds: float | None = None
        # Set once something fatal happened: the code the process should exit with.
        self.exit_code: int | None = None
        # Called (once) when the process should exit; the entrypoint stops the server with it.
        self.on_fatal: Callable[[], None] | None = None
        self._engine: InferenceEngine | None = None
        # Set when the state leaves "loading" (ready or failed): what GET /ready?wait= waits for.
        self._settled = asyncio.Event()
        self._watchdog: asyncio.Task[None] | None = None
        self._secrets = secret_values(os.environ)
        # LoRA adapters follow their file once the base model serves (servlane_runtime.adapters).
        self.adapters: AdapterHost | None = None
        if config.adapters_enabled and config.adapters_file is not None and config.task == "generate":
            self.adapters = AdapterHost(config.adapters_file, config.cache_dir)
        self._adapter_sync: asyncio.Task[None] | None = None

    @property
    def engine(self) -> InferenceEngine:
        """The ready engine; a 503 with Retry-After while loading, or once loading failed or the engine died."""
        if self.state == "ready" and self._engine is not None:
            return self._engine
        retry = _RETRY_AFTER_LOADING if self.state == "loading" else _RETRY_AFTER_FAILED
        raise overloaded(503, f"The model is not ready: {self.reason}", retry)

    def readiness(self) -> dict[str, object]:
        body: dict[str, object] = {"status": self.state, "model": self.config.served_model_name}
        if self.state != "ready":
            body["reason"] = self.reason
        if self.load_seconds is not None:
            body["load_seconds"] = round(self.load_seconds, 3)
        if self.adapters is not None:
            body["adapters"] = self.adapters.states()
        return body

    async def until_settled(self, seconds: float) -> None:
        """Returns once the model is no longer loading (ready or failed), or after `seconds`."""
        if self.state == "loading" and seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._settled.wait(), seconds)

    async def load(self) -> None:
        """Load and warm up within load_timeout_seconds; never raises (the outcome is in `state`)."""
        start = time.monotonic()
        timeout = self.config.load_timeout_seconds
        try:
            engine = await asyncio.wait_for(self._load_and_warm_up(), timeout=timeout)
        except TimeoutError:
            self._fatal(MODEL_LOAD_FAILED, f"loading did not finish within load_timeout_seconds={timeout:g}")
            return
        except ModelSourceError as exc:
            # The files cannot be had: the message names the source and quotes its store (AIModel: ModelSourceFailed).
            self._fatal(MODEL_SOURCE_FAILED, str(exc))
            return
        except Exception as exc:
            # What it was doing says where (e.g. which directory) when the error itself does not.
            self._fatal(MODEL_LOAD_FAILED, f"{self.reason} failed: {type(exc).__name__}: {exc}")
            return
        self._engine = _DeathWatch(engine, self.engine_died)
        if self.adapters is not None:
            # The adapters listed at start load before the pod turns ready; one that fails does not stop it.
            self.reason = "loading adapters"
            await self.adapters.sync_once(self._engine)
            self._adapter_sync = asyncio.create_task(self.adapters.run(self._engine), name="adapter-sync")
        self.load_seconds = time.monotonic() - start
        self.state = "ready"
        self.startup.mark("ready")
        self.reason = ""
        self._settled.set()
        log.info("model %s ready in %.1fs", self.config.served_model_name, self.load_seconds)
        self._watchdog = asyncio.create_task(self._watch(engine), name="engine-health")

    async def _load_and_warm_up(self) -> InferenceEngine:
        source = self.config.model_source
        self.reason = f"resolving model source {source}"
        log.info(self.reason)
        gguf = self.config.engine == "llamacpp"
        only = self.config.llamacpp.gguf_file if gguf else None
        path = await asyncio.to_thread(resolve_model_source, source, self.config.cache_dir, self.config.s3, only, gguf)
        self.startup.mark("weights_fetched")
        self.reason = f"loading {self.config.engine} engine from {path}"
        log.info(self.reason)
        # In a thread: the factory imports the engine's module (torch, vLLM: seconds), and the loop
        # must keep answering /health meanwhile.
        engine = await asyncio.to_thread(self._factory, self.config, path)
        try:
            await engine.load()
            self.startup.mark("engine_loaded")
            self.reason = "warming up"
            await _warm_up(engine, self.config.task)
        except BaseException:
            await engine.close()
            raise
        return engine

    async def _watch(self, engine: InferenceEngine) -> None:
        while self.state == "ready":
            await asyncio.sleep(HEALTH_CHECK_SECONDS)  # a period, not a synchronisation
            try:
                await engine.check_health()
            except EngineDeadError as exc:
                self.engine_died(exc)

    def engine_died(self, exc: EngineDeadError) -> OpenAIError:
        """Mark the engine dead (once) and return the 503 that requests get from now on."""
        self._fatal(ENGINE_DIED, f"the engine died: {exc}")
        return overloaded(503, f"The model is not serving: {self.reason}", _RETRY_AFTER_FAILED)

    def _fatal(self, exit_code: int, reason: str) -> None:
        if self.exit_code is not None:
            return
        self.state = "failed"
        self.reason = redact(reason, self._secrets)
        self.exit_code = exit_code
        self._settled.set()
        log.error(
            "model %s failed, exiting with code %d in %gs: %s",
            self.config.served_model_name, exit_code, EXIT_GRACE_SECONDS, self.reason,
        )  # fmt: skip
        asyncio.get_running_loop().call_later(EXIT_GRACE_SECONDS, self._request_exit)

    def _request_exit(self) -> None:
        if self.on_fatal is not None:
            self.on_fatal()

    async def close(self) -> None:
        for task in (self._watchdog, self._adapter_sync):
            if task is not None:
                task.cancel()
        if self._engine is not None:
            await self._engine.close()


class _DeathWatch(InferenceEngine):
    """The ready engine as serving sees it: an EngineDeadError from any call marks the host failed and
    reaches the client as a 503 with Retry-After (an OpenAIError, which serving already answers with)."""

    def __init__(self, engine: InferenceEngine, died: Callable[[EngineDeadError], OpenAIError]) -> None:
        self._engine = engine
        self._died = died

    @property
    def max_model_len(self) -> int:
        return self._engine.max_model_len

    @property
    def vocab_size(self) -> int | None:
        return self._engine.vocab_size

    async def load(self) -> None:
        await self._engine.load()

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        return self._engine.render_chat(messages, tools)

    def check_json_schema(self, schema: str) -> None:
        self._engine.check_json_schema(schema)

    async def load_adapter(self, name: str, path: str) -> None:
        await self._engine.load_adapter(name, path)

    async def unload_adapter(self, name: str) -> None:
        await self._engine.unload_adapter(name)

    def tool_parser(self) -> ToolCallParser | None:
        return self._engine.tool_parser()

    def tokenize(self, text: str) -> list[int]:
        return self._engine.tokenize(text)

    def count_tokens(self, text: str) -> int:
        return self._engine.count_tokens(text)

    async def generate(
        self, prompt: PromptInput, options: SamplingOptions, request_id: str
    ) -> AsyncGenerator[GenerationDelta, None]:
        stream = self._engine.generate(prompt, options, request_id)
        try:
            async for delta in stream:
                yield delta
        except EngineDeadError as exc:
            raise self._died(exc) from exc
        finally:
            await stream.aclose()

    async def embed(self, inputs: list[PromptInput]) -> EmbeddingResult:
        try:
            return await self._engine.embed(inputs)
        except EngineDeadError as exc:
            raise self._died(exc) from exc

    async def check_health(self) -> None:
        await self._engine.check_health()

    async def close(self) -> None:
        await self._engine.close()


async def _warm_up(engine: InferenceEngine, task: str) -> None:
    """One real token (or one embedding) proves the model can serve before /ready says so."""
    if task == "embed":
        await engine.embed(["warm-up"])
        return
    stream = engine.generate("Hello", SamplingOptions(max_tokens=1, temperature=0), "warm-up")
    try:
        async for _ in stream:
            pass
    finally:
        await stream.aclose()
