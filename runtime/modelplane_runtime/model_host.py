"""The model's life: loading in the background, a one-token warm-up, then ready (or failed, with why).

The server listens before the model loads, so /health answers at once and /ready tells the truth:
503 with {"status": "loading"|"failed", "reason": ...} until the warm-up has passed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Literal

from modelplane_api.runtime_config import RuntimeConfig

from .engines.base import Engine, SamplingOptions
from .errors import overloaded
from .model_source import resolve_model_source

log = logging.getLogger(__name__)

State = Literal["loading", "ready", "failed"]
EngineFactory = Callable[[RuntimeConfig, str], Engine]


class ModelHost:
    def __init__(self, config: RuntimeConfig, engine_factory: EngineFactory) -> None:
        self.config = config
        self._factory = engine_factory
        self.state: State = "loading"
        self.reason = "the model is loading"
        self.load_seconds: float | None = None
        self._engine: Engine | None = None

    @property
    def engine(self) -> Engine:
        """The ready engine; a 503 with Retry-After while loading, or when loading failed."""
        if self.state == "ready" and self._engine is not None:
            return self._engine
        retry = 5.0 if self.state == "loading" else 30.0
        raise overloaded(503, f"The model is not ready: {self.reason}", retry)

    def readiness(self) -> dict[str, object]:
        body: dict[str, object] = {"status": self.state, "model": self.config.served_model_name}
        if self.state != "ready":
            body["reason"] = self.reason
        if self.load_seconds is not None:
            body["load_seconds"] = round(self.load_seconds, 3)
        return body

    async def load(self) -> None:
        """Load and warm up within load_timeout_seconds; never raises (the outcome is in `state`)."""
        start = time.monotonic()
        timeout = self.config.load_timeout_seconds
        try:
            engine = await asyncio.wait_for(self._load_and_warm_up(), timeout=timeout)
        except TimeoutError:
            self._fail(f"loading did not finish within load_timeout_seconds={timeout:g}")
            return
        except Exception as exc:
            self._fail(f"{type(exc).__name__}: {exc}")
            return
        self._engine = engine
        self.load_seconds = time.monotonic() - start
        self.state = "ready"
        self.reason = ""
        log.info("model %s ready in %.1fs", self.config.served_model_name, self.load_seconds)

    async def _load_and_warm_up(self) -> Engine:
        source = self.config.model_source
        log.info("resolving model source %s", source)
        path = await asyncio.to_thread(resolve_model_source, source, self.config.cache_dir)
        self.reason = f"loading {self.config.engine} engine from {path}"
        log.info(self.reason)
        # In a thread: the factory imports the engine's module (torch, vLLM: seconds), and the loop
        # must keep answering /health meanwhile.
        engine = await asyncio.to_thread(self._factory, self.config, path)
        try:
            await engine.load()
            self.reason = "warming up"
            await _warm_up(engine, self.config.task)
        except BaseException:
            await engine.close()
            raise
        return engine

    def _fail(self, reason: str) -> None:
        self.state = "failed"
        self.reason = reason
        log.error("model %s failed to load: %s", self.config.served_model_name, reason)

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.close()


async def _warm_up(engine: Engine, task: str) -> None:
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
