"""One AIModel's local runtime: its process, readiness as the runtime reports it, and its AIModel status.

The status written here (phase, endpoint, Ready condition) is what the gateway routes on and what
plan() reads as readiness, exactly the fields the operator maintains in a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
from pydantic import ValidationError

from servlane_api.aimodel import AIModel, AIModelStatus, Phase
from servlane_api.cold_start import STARTUP_PATH, ColdStartSample, ColdStartStatus, RuntimeStartup
from servlane_api.conditions import Condition
from servlane_api.runtime_config import ENV_VAR, READY_PATH
from servlane_api.runtime_exit import TERMINATION_LOG_ENV
from servlane_cli.local_config import LocalRuntime
from servlane_cli.processes import ManagedProcess
from servlane_cli.state import ModelState
from servlane_core.cold_start import runtime_steps

log = logging.getLogger(__name__)
PROGRESS_EVERY_SECONDS = 5.0
# While a ready runtime has served no token yet, its /startup is read again at most this often.
STARTUP_REREAD_SECONDS = 5.0


class SupervisedRuntime:
    def __init__(self, model: AIModel, runtime: LocalRuntime, log_path: Path, create_tiny_model: bool) -> None:
        self.model = model
        self.runtime = runtime
        self.create_tiny_model = create_tiny_model
        # Where the runtime leaves its one-line reason when it exits (a pod's /dev/termination-log), read back
        # so that the exit says why (e.g. the engine's own start error), not only its code.
        self.termination_log = log_path.with_name(f"{log_path.stem}.termination-log")
        env = {
            **os.environ,
            **runtime.env,
            ENV_VAR: runtime.config.to_env_value(),
            TERMINATION_LOG_ENV: str(self.termination_log),
        }
        self.process = ManagedProcess(model.name, [sys.executable, "-m", "servlane_runtime"], env, log_path)
        self.ready = False
        self.runtime_state = "starting"  # loading | ready | failed, as /ready says; starting: not listening yet
        self.reason = "starting"
        self.load_seconds: float | None = None
        # The runtime's own start, step by step (its GET /startup), once it is ready; None before.
        self.cold_start: ColdStartSample | None = None
        self._startup_read_at = 0.0
        self._creating: asyncio.Task[None] | None = None
        self.stopped = False  # by the supervisor (shutdown, removal, replacement): shown as Stopped
        # Why it last failed (an exit, a failed start), kept while it restarts until it is ready again: what
        # an AIModel's Degraded condition says in a cluster, so that a crash-looping canary is rolled back.
        self.failure: str | None = None
        self._last_progress = 0.0

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.runtime.config.port}"

    def start(self) -> None:
        source = Path(self.runtime.config.model_source)
        if self.create_tiny_model and source.is_absolute() and not (source / "config.json").exists():
            self.reason = f"creating the tiny chat model in {source}"
            log.info("model %s: %s", self.name, self.reason)
            self._creating = asyncio.create_task(self._create_then_start(source))
            return
        self.process.start()

    async def _create_then_start(self, target: Path) -> None:
        with self.process.log_path.open("ab") as out:
            child = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "servlane_cli", "init-tiny-model", str(target),
                stdout=out, stderr=out, start_new_session=True,
            )  # fmt: skip
            try:
                code = await child.wait()
            except asyncio.CancelledError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                raise
        if code != 0:
            self.runtime_state, self.reason = "failed", f"creating the tiny model failed (see {self.process.log_path})"
            self.failure = self.reason
            return
        self.process.start()

    def supervise(self, now: float) -> None:
        """Notice an exit (scheduling a restart with backoff) and restart when the backoff has passed."""
        code = self.process.check_exit()
        if code is not None:
            self.ready, self.runtime_state = False, "exited"
            wait = (self.process.restart_at or now) - now
            self.reason = f"exited with code {code}{self._termination_message()}; restart {self.process.restarts + 1} "
            self.reason += f"in {wait:.0f}s"
            self.failure = f"RuntimeCrashLoop: the runtime {self.reason}"
            log.warning("model %s: runtime %s (log: %s)", self.name, self.reason, self.process.log_path)
        if self.process.due_for_restart(now):
            log.info("model %s: restarting the runtime (restart %d)", self.name, self.process.restarts + 1)
            self.runtime_state, self.reason = "starting", "restarting"
            self.process.restart()

    def _termination_message(self) -> str:
        """': <the runtime's last words>' once, or '' when it left none."""
        try:
            message = self.termination_log.read_text().strip()
            self.termination_log.unlink()
        except OSError:
            return ""
        return f": {message}" if message else ""

    async def probe(self, client: httpx.AsyncClient) -> None:
        if self.process.pid is None:
            self.ready = False
            return
        try:
            response = await client.get(self.endpoint + READY_PATH)
            body = response.json()
        except (httpx.HTTPError, ValueError):
            self.ready, self.runtime_state = False, "starting"
            self.reason = "starting the runtime process (importing the engine's libraries)"
            return
        was_ready = self.ready
        self.ready = response.status_code == 200
        self.runtime_state = str(body.get("status", "loading"))
        self.reason = "" if self.ready else str(body.get("reason", ""))
        if isinstance(body.get("load_seconds"), int | float):
            self.load_seconds = float(body["load_seconds"])
        if self.ready and not was_ready:
            self.process.consecutive_failures = 0  # it loaded: a later crash is a new incident
            self.failure = None
            elapsed = time.monotonic() - (self.process.started_at or time.monotonic())
            log.info("model %s: ready in %.1fs at %s", self.name, elapsed, self.endpoint)
            self.cold_start = None  # this process's start, not the last one's
        if self.ready:
            await self.read_startup(client, time.monotonic())

    async def read_startup(self, client: httpx.AsyncClient, now: float) -> None:
        """The runtime's start from its /startup (metrics port): once when it turns ready, then again every
        few seconds until its first token is served."""
        known = self.cold_start
        if known is not None and (
            known.first_token is not None or now - self._startup_read_at < STARTUP_REREAD_SECONDS
        ):
            return
        self._startup_read_at = now
        try:
            response = await client.get(f"http://127.0.0.1:{self.runtime.config.metrics_port}{STARTUP_PATH}")
            startup = RuntimeStartup.model_validate_json(response.content)
        except (httpx.HTTPError, ValidationError):
            return
        process_start = startup.phases.get("process_start")
        created = iso_time(process_start) if process_start is not None else ""
        steps = runtime_steps(startup).model_dump()
        self.cold_start = ColdStartSample(pod=f"pid {self.process.pid}", created=created, **steps)

    def report_progress(self, now: float) -> None:
        """While loading, a line every few seconds: elapsed time and what the runtime says it is doing."""
        if self.phase != "Deploying" or now - self._last_progress < PROGRESS_EVERY_SECONDS:
            return
        self._last_progress = now
        started = self.process.started_at or now
        log.info("model %s: loading, %.0fs: %s", self.name, max(0.0, now - started), self.reason)

    @property
    def phase(self) -> Phase:
        if self.ready:
            return "Ready"
        if self.runtime_state in ("failed", "exited"):
            return "Failed"
        if self.process.pid is None:
            return "Pending"
        return "Deploying"

    def api_object(self) -> AIModel:
        """The AIModel with the status the operator would write: routes and readiness follow it."""
        condition = Condition(
            type="Ready",
            status="True" if self.ready else "False",
            reason="RuntimeReady" if self.ready else self.phase,
            message=self.reason,
        )
        status = AIModelStatus(
            phase=self.phase,
            replicas=1 if self.process.pid else 0,
            ready_replicas=1 if self.ready else 0,
            desired_replicas=1,
            endpoint=self.endpoint,
            served_model_name=self.model.served_model_name,
            conditions=[condition],
            cold_start=None
            if self.cold_start is None
            else ColdStartStatus(last=self.cold_start, recent=[self.cold_start]),
        )
        return self.model.model_copy(update={"status": status})

    def state(self) -> ModelState:
        config = self.runtime.config
        return ModelState(
            name=self.name,
            served_model_name=config.served_model_name,
            engine=config.engine,
            task=config.task,
            phase="Stopped" if self.stopped else self.phase,
            reason=self.reason,
            port=config.port,
            endpoint=self.endpoint,
            pid=self.process.pid,
            restarts=self.process.restarts,
            last_exit_code=self.process.last_exit_code,
            load_seconds=self.load_seconds,
            cold_start=self.cold_start,
            log_file=str(self.process.log_path),
            warnings=list(self.runtime.warnings),
        )

    async def stop(self, deadline_seconds: float) -> None:
        if self._creating is not None and not self._creating.done():
            self._creating.cancel()
            await asyncio.gather(self._creating, return_exceptions=True)
        await self.process.stop(deadline_seconds)
        self.ready, self.stopped, self.reason = False, True, "stopped"

    def kill_now(self) -> None:
        self.process.kill_now()


def iso_time(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
