"""`servlane serve`: runtimes, the gateway and the canary controller on one machine.

One loop, a few times a second: reload the manifests when a file changed, notice exited runtimes
and restart them with backoff, probe readiness, run each AIFeature's rollout plan, then write the
gateway's routes file and the state file (both atomically, and only when they changed).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import httpx

from servlane_cli.canary import FeatureController
from servlane_cli.local_config import has_gpu, local_adapters, local_runtime
from servlane_cli.manifests import ManifestError, Manifests, files_signature, load_manifests
from servlane_cli.ports import free_port, local_url, port_free
from servlane_cli.processes import ManagedProcess
from servlane_cli.state import (
    LOCK_FILE,
    ROUTES_FILE,
    STATE_FILE,
    FeatureState,
    GatewayProcessState,
    SupervisorState,
    read_state,
    write_atomically,
)
from servlane_cli.supervised_runtime import SupervisedRuntime
from servlane_core.rollout.timeutil import to_rfc3339
from servlane_operator.metric_readers.scrape_reader import ScrapeReader

log = logging.getLogger(__name__)
T = TypeVar("T")
TICK_SECONDS = 0.25
BATCH_DATABASE = "batch.db"  # the Batch API's SQLite database, in the state directory


@dataclass(frozen=True)
class ServeOptions:
    inputs: list[Path]
    state_dir: Path
    host: str = "127.0.0.1"
    port: int = 8080
    stop_timeout: float = 10.0
    model_cache: Path = Path.home() / ".cache" / "servlane" / "models"


class Supervisor:
    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        self.state_dir = options.state_dir
        self.slots: dict[str, SupervisedRuntime] = {}
        self.features: dict[str, FeatureController] = {}
        self.gateway_port = options.port or free_port()
        self.gateway_url = local_url(options.host, self.gateway_port)
        metrics_port = free_port()  # /metrics on a port of its own (the API port has none), on the same address
        self.gateway_metrics_url = f"{local_url(options.host, metrics_port)}/metrics"
        gateway_argv = [
            sys.executable, "-m", "servlane_gateway", "--routes-file", str(self.state_dir / ROUTES_FILE),
            "--host", options.host, "--port", str(self.gateway_port), "--log-level", "warning",
            "--metrics-port", str(metrics_port),
        ]  # fmt: skip
        # The Batch API keeps its files and batches in SQLite under the state directory (survives restarts).
        env = {"SERVLANE_GATEWAY_BATCH_DATABASE_URL": f"sqlite:///{self.state_dir.resolve() / BATCH_DATABASE}"}
        # One user on their own machine: batches without API keys are theirs alone (the gateway logs that it
        # runs so; with a keys file set, batches belong to keys as always).
        env["SERVLANE_GATEWAY_BATCH_ALLOW_WITHOUT_KEYS"] = "true"
        env |= os.environ  # a database URL set by the user wins
        self.gateway = ManagedProcess("gateway", gateway_argv, env, self.state_dir / "logs/gateway.log")
        self.reader = ScrapeReader([self.gateway_metrics_url])
        self._signature: object = None
        self._manifest_error: str | None = None
        self._stopping: set[asyncio.Task[None]] = set()
        self._written: dict[str, str] = {}
        self._applied = False  # manifests were applied once: a bad edit then keeps them
        self._gpu = has_gpu()

    # ---- manifests ---------------------------------------------------------------------------

    def reload_if_changed(self) -> None:
        try:
            signature = files_signature(self.options.inputs)
            if signature == self._signature:
                return
            self._signature = signature
            manifests = load_manifests(self.options.inputs)
        except Exception as exc:  # a manifest error, an unreadable file, or a bug: never a reason to stop serving
            if not isinstance(exc, ManifestError | OSError):
                log.exception("reading the manifests failed")
            if str(exc) != self._manifest_error:
                kept = "keeping the previous ones" if self._applied else "nothing started"
                log.error("manifests not applied, %s: %s", kept, exc)
            self._manifest_error = str(exc)
            return
        self._manifest_error = None
        self._apply(manifests)

    def _apply(self, manifests: Manifests) -> None:
        self._applied = True
        for name in [n for n in self.slots if n not in manifests.models]:
            log.info("model %s: removed from the manifests, stopping it", name)
            self._stop_in_background(self.slots.pop(name))
        for name, entry in manifests.models.items():
            old = self.slots.get(name)
            port = free_port()
            adapters_file = self.state_dir / "adapters" / f"{name}.json"
            try:
                # Its /metrics on a free port too: several runtimes (and the gateway) share this machine's ports.
                runtime = local_runtime(
                    entry.model, port, self.options.model_cache, self._gpu, adapters_file, metrics_port=free_port()
                )
            except ValueError as exc:
                log.error("model %s: not served: %s", name, exc)
                continue
            # Before a (re)start, so the runtime loads them with the model; a running one follows the file.
            adapters, adapter_warnings = local_adapters(entry.model)
            for warning in adapter_warnings:
                log.warning("model %s: %s", name, warning)
            adapters_file.parent.mkdir(parents=True, exist_ok=True)
            self._write_if_changed(f"adapters/{name}.json", json.dumps(adapters, indent=1))
            if old is not None and old.runtime.fingerprint() == runtime.fingerprint():
                old.model = entry.model  # metadata-only edits need no restart
                continue
            for warning in runtime.warnings:
                log.warning("model %s: %s", name, warning)
            if old is not None:
                log.info("model %s: spec changed, restarting its runtime", name)
                self._stop_in_background(old)
            slot = SupervisedRuntime(
                entry.model, runtime, self.state_dir / "logs" / f"{name}.log", entry.create_tiny_model
            )
            self.slots[name] = slot
            slot.start()
        for name in [n for n in self.features if n not in manifests.features]:
            log.info("feature %s: removed from the manifests", name)
            self.reader.forget(self.features.pop(name).feature.namespace, name)
        for name, feature in manifests.features.items():
            if name in self.features:
                self.features[name].update_spec(feature)
            else:
                self.features[name] = FeatureController(feature)
                if feature.spec.rollout.fixed_gpu_budget:
                    log.warning("feature %s: rollout.fixedGpuBudget is ignored in standalone mode", name)

    def _stop_in_background(self, slot: SupervisedRuntime) -> None:
        task = asyncio.create_task(slot.stop(self.options.stop_timeout))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def resume_features(self) -> None:
        """A previous run's rollout status, so a restarted `serve` continues rather than starts over."""
        previous = read_state(self.state_dir)
        for saved in previous.features if previous else []:
            controller = self.features.get(saved.name)
            if controller is not None:
                # A spec edited while nothing ran is a new generation, as an edit while running would be.
                same = saved.target == controller.feature.spec.model
                controller.status, controller.generation = saved.status, saved.generation + (0 if same else 1)

    # ---- one pass ----------------------------------------------------------------------------

    async def tick(self, client: httpx.AsyncClient) -> None:
        self.reload_if_changed()
        now = time.monotonic()
        for slot in self.slots.values():
            slot.supervise(now)
        code = self.gateway.check_exit()
        if code is not None:
            log.warning("gateway exited with code %d; restarting (log: %s)", code, self.gateway.log_path)
        if self.gateway.due_for_restart(now):
            self.gateway.restart()
        await asyncio.gather(*(slot.probe(client) for slot in self.slots.values()))
        ready = self._with_adapters({name: slot.ready for name, slot in self.slots.items()})
        failing = self._with_adapters({n: slot.failure for n, slot in self.slots.items() if slot.failure is not None})
        wall = datetime.now(UTC)
        for controller in self.features.values():
            await controller.step(ready, self.reader, wall, failing)
        for slot in self.slots.values():
            slot.report_progress(now)
        self.write_routes()
        self.write_state(running=True)

    def _with_adapters(self, by_model: dict[str, T]) -> dict[str, T]:
        """A model's value for the model and for each adapter target (`model:adapter`) its manifest lists: an
        adapter is ready, or failing, with its model."""
        targets = dict(by_model)
        for name, value in by_model.items():
            targets.update({f"{name}:{a.name}": value for a in self.slots[name].model.spec.adapters})
        return targets

    def write_routes(self) -> None:
        objects = [c.feature.model_copy(update={"status": c.status}).to_api() for c in self.features.values()]
        objects += [slot.api_object().to_api() for slot in self.slots.values()]
        self._write_if_changed(ROUTES_FILE, json.dumps(objects, indent=1))

    def write_state(self, running: bool) -> None:
        state = SupervisorState(
            supervisor_pid=os.getpid(),
            running=running,
            inputs=[str(p) for p in self.options.inputs],
            updated_at="",
            manifest_error=self._manifest_error,
            manifests_applied=self._applied,
            gateway=GatewayProcessState(
                url=self.gateway_url,
                metrics_url=self.gateway_metrics_url,
                pid=self.gateway.pid,
                restarts=self.gateway.restarts,
                log_file=str(self.gateway.log_path),
            ),
            models=[slot.state() for slot in self.slots.values()],
            features=[
                FeatureState(
                    name=n,
                    namespace=c.feature.namespace,
                    target=c.feature.spec.model,
                    generation=c.generation,
                    status=c.status,
                )
                for n, c in self.features.items()
            ],
        )
        # Compared without the timestamp, so an idle supervisor does not rewrite the file 4 times a second.
        if self._written.get(STATE_FILE) == state.model_dump_json():
            return
        self._written[STATE_FILE] = state.model_dump_json()
        stamped = state.model_copy(update={"updated_at": to_rfc3339(datetime.now(UTC))})
        write_atomically(self.state_dir / STATE_FILE, stamped.model_dump_json(indent=1))

    def _write_if_changed(self, name: str, text: str) -> None:
        if self._written.get(name) != text:
            write_atomically(self.state_dir / name, text)
            self._written[name] = text

    # ---- life --------------------------------------------------------------------------------

    async def run(self) -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals = 0

        def on_signal() -> None:
            nonlocal signals
            signals += 1
            if signals > 1:  # a second Ctrl-C: no more waiting
                log.warning("killing everything now")
                for slot in self.slots.values():
                    slot.kill_now()
                self.gateway.kill_now()
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        self.reload_if_changed()
        if self._manifest_error is not None:
            await self.shutdown()
            return 1
        self.resume_features()
        self.write_routes()
        self.gateway.start()
        log.info("gateway: %s/v1 (features: %s)", self.gateway_url, ", ".join(sorted(self.features)) or "none")
        try:
            async with httpx.AsyncClient(timeout=2.0) as client:
                while not stop.is_set():
                    await self.tick(client)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), TICK_SECONDS)
        finally:  # also on a bug in a pass: no child may outlive the supervisor
            await self.shutdown()
        return 0

    async def shutdown(self) -> None:
        log.info("stopping %d runtime(s) and the gateway", len(self.slots))
        deadline = self.options.stop_timeout
        await asyncio.gather(
            self.gateway.stop(deadline),
            *(slot.stop(deadline) for slot in self.slots.values()),
            *self._stopping,
            return_exceptions=True,
        )
        await self.reader.aclose()
        self.write_state(running=False)
        log.info("stopped")


def serve(options: ServeOptions) -> int:
    options.state_dir.mkdir(parents=True, exist_ok=True)
    lock = (options.state_dir / LOCK_FILE).open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"servlane: another `servlane serve` is using {options.state_dir}", file=sys.stderr)
        return 1
    try:
        if options.port and not port_free(options.host, options.port):
            print(f"servlane: port {options.port} is in use; pass --port (0: any free port)", file=sys.stderr)
            return 1
        log.info("state: %s", options.state_dir)
        return asyncio.run(Supervisor(options).run())
    finally:
        lock.close()
