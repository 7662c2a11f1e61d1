"""Holding requests for a model with no ready pod (scaled to zero, or starting) until one is ready.

A request whose route has no ready backend but a waking one (servlane_core.routing.waking) is held for
the AIModel its weights give it, in a queue bounded per model and per namespace (beyond either: 429 with
Retry-After, so one team's flood never takes another team's places) for at most a maximum wait (then
503 with Retry-After). Held requests keep their admission (their in-flight place and token reservation
with the limiter): holding is being in flight, as far as the limits go.

While requests are held for a model, one watcher task per model (on the event loop):
- signals demand at once and then at most every `demand_renew` seconds (servlane_gateway.routing.demand_lease),
  so the operator scales the model up;
- asks the runtime `/ready?wait=` of each pod its EndpointSlices list as not ready yet (without slices: the
  model's URL): the runtime answers the moment its model is ready (readiness pushed, not polled: a start of
  30 s costs one request per pod, not 600), and a pod that answers 200 takes requests at once
  (PodRouter.mark_probed), without waiting for the kubelet's next readiness probe. A runtime that answers
  at once anyway (one without the parameter, or another server behind a routes file) is asked again every
  `probe_interval` seconds;
- releases every request held for the model as soon as it has a pod to take them: a ready endpoint in a
  slice update (pushed: `poke`), a probe's 200, or the route table saying the model is ready.
A model that is deleted, or stops waking (it failed) while requests wait, fails them at once (503).

Lives on the event loop: no locks. Each gateway worker process holds its own requests, so the bounds are
per process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from servlane_api.runtime_config import READY_PATH, READY_WAIT_PARAM
from servlane_api.targets import parse_target
from servlane_core.protocol.errors import OpenAIError, overloaded
from servlane_core.routing.routes import Backend, RouteTable
from servlane_core.routing.waking import (
    MODEL_GONE,
    MODEL_QUEUE_FULL,
    WAIT_EXCEEDED,
    HoldLimits,
    hold_refusal,
)
from servlane_gateway.gateway_metrics import GatewayMetrics
from servlane_gateway.routing.demand_lease import DemandSink, NoDemand
from servlane_gateway.routing.pods import PodRouter

log = logging.getLogger(__name__)

ModelKey = tuple[str, str]  # (namespace, AIModel name)
PROBE_TIMEOUT_SECONDS = 0.5  # a pod slower than this to connect is asked again at the next probe
# How long one /ready?wait= may wait at the runtime (it caps this at READY_MAX_WAIT_SECONDS); the demand
# Lease's renewal ends a wait sooner, and a slice update or a request's deadline never waits for it.
READY_WAIT_SECONDS = 10.0
MAX_READY_WAITS = 512  # /ready waits open at once (one per starting pod of a held model)


def model_key(backend: Backend) -> ModelKey:
    """The AIModel a backend's requests wait for (an adapter's requests wait for its model's pods)."""
    return backend.namespace, parse_target(backend.model).model


class Ticket:
    """One held request: its place in its model's and namespace's queues until released or left."""

    def __init__(self, queue: HoldQueue, backend: Backend, now: float) -> None:
        self.queue = queue
        self.backend = backend
        self.key = model_key(backend)
        self.started = now
        self.released: asyncio.Future[Backend] = asyncio.get_running_loop().create_future()
        self._left = False

    @property
    def deadline(self) -> float:
        return self.started + self.queue.limits.max_wait

    async def wait(self, tick: Callable[[], Awaitable[None]] | None = None, every: float = 0.0) -> Backend:
        """The backend to send the request to, once it has a pod ready; OpenAIError 503 when the wait
        exceeds the limit or the model goes. With `tick`, awaited every `every` seconds while waiting (a
        held stream's keep-alive). The place is freed either way (and by leave())."""
        try:
            while True:
                remaining = self.deadline - self.queue.clock()
                if remaining <= 0:
                    raise self.queue.waited_too_long(self)
                timeout = remaining if tick is None else min(every, remaining)
                done, _ = await asyncio.wait({self.released}, timeout=timeout)
                if done:
                    return self.released.result()
                if tick is not None and self.deadline > self.queue.clock():
                    await tick()
        finally:
            self.leave()

    def leave(self, reason: str | None = None) -> None:
        """Frees the place (idempotent): released, refused, or the client went away."""
        if not self._left:
            self._left = True
            self.queue._left(self, reason)


class HoldQueue:
    def __init__(
        self,
        router: PodRouter,
        metrics: GatewayMetrics,
        limits: HoldLimits | None = None,
        demand: DemandSink | None = None,
        retry_after: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.router = router
        self.metrics = metrics
        self.limits = limits or HoldLimits()
        self.demand: DemandSink = demand or NoDemand()
        self.retry_after = retry_after
        self.clock = clock
        self._held: dict[ModelKey, dict[Ticket, None]] = {}  # insertion-ordered sets
        self._in_namespace: Counter[str] = Counter()
        self._watchers: dict[ModelKey, asyncio.Task[None]] = {}
        self._wake: dict[ModelKey, asyncio.Event] = {}
        self._ready_in_table: set[ModelKey] = set()  # held models the latest route table says are ready
        self._http: Any = None  # httpx.AsyncClient for the probes, made on first use

    # -- entering and leaving ------------------------------------------------------------------------------

    def held(self, namespace: str, model: str) -> int:
        return len(self._held.get((namespace, model), ()))

    def enter(self, backend: Backend) -> Ticket:
        """A place for a request waiting for `backend`'s model; OpenAIError 429 when a queue is full."""
        key = model_key(backend)
        namespace = key[0]
        refusal = hold_refusal(self.held(*key), self._in_namespace[namespace], self.limits)
        if refusal is not None:
            self.metrics.hold_rejections.labels(namespace, refusal).inc()
            whose = f"AIModel '{key[1]}'" if refusal == MODEL_QUEUE_FULL else f"namespace '{namespace}'"
            raise overloaded(
                429,
                f"Too many requests are waiting for {whose} to start (its pods are not ready yet); try again shortly.",
                self.retry_after,
            )
        ticket = Ticket(self, backend, self.clock())
        self._held.setdefault(key, {})[ticket] = None
        self._in_namespace[namespace] += 1
        self.metrics.requests_held.labels(*key).inc()
        if key not in self._watchers:
            self._wake[key] = asyncio.Event()
            self._watchers[key] = asyncio.create_task(self._watch(key), name=f"hold-{key[0]}-{key[1]}")
        return ticket

    def waited_too_long(self, ticket: Ticket) -> OpenAIError:
        ticket.leave(WAIT_EXCEEDED)
        return overloaded(
            503,
            f"AIModel '{ticket.key[1]}' has no ready pod after {self.limits.max_wait:g} s of waiting; try again "
            "shortly.",
            self.retry_after,
        )

    def _left(self, ticket: Ticket, reason: str | None) -> None:
        key = ticket.key
        tickets = self._held.get(key)
        if tickets is None or ticket not in tickets:
            return
        del tickets[ticket]
        if not tickets:
            del self._held[key]
            if (wake := self._wake.get(key)) is not None:
                wake.set()  # its watcher ends
        self._in_namespace[key[0]] -= 1
        if self._in_namespace[key[0]] <= 0:
            del self._in_namespace[key[0]]
        self.metrics.requests_held.labels(*key).dec()
        self.metrics.hold_seconds.labels(key[0]).observe(self.clock() - ticket.started)
        if reason is not None:
            self.metrics.hold_rejections.labels(key[0], reason).inc()

    # -- what wakes the watchers -----------------------------------------------------------------------

    def poke(self) -> None:
        """The pods changed (an EndpointSlice update): every watcher looks again now."""
        for event in self._wake.values():
            event.set()

    def table_changed(self, table: RouteTable) -> None:
        """A new route table: held models it says are ready are released; deleted ones, or ones that no
        longer wake (failed), fail their requests."""
        if not self._held:
            return
        state: dict[ModelKey, tuple[bool, bool]] = {}
        for route in table.routes.values():
            for backend in route.backends:
                key = model_key(backend)
                if key in self._held:
                    ready, wakes = state.get(key, (False, False))
                    state[key] = (ready or backend.ready, wakes or backend.wakes)
        for key in list(self._held):
            ready, wakes = state.get(key, (False, False))
            if ready:
                self._ready_in_table.add(key)
                self._wake[key].set()
            elif not wakes:
                self._fail(key, f"AIModel '{key[1]}' is gone or failed while requests waited for it.")

    def _fail(self, key: ModelKey, message: str) -> None:
        error = overloaded(503, message, self.retry_after)
        for ticket in list(self._held.get(key, ())):
            if not ticket.released.done():
                ticket.released.set_exception(error)
            ticket.leave(MODEL_GONE)

    def _release(self, key: ModelKey) -> None:
        for ticket in list(self._held.get(key, ())):
            if not ticket.released.done():
                ticket.released.set_result(ticket.backend)
            ticket.leave()

    # -- the watcher ---------------------------------------------------------------------------------------

    def _live(self, key: ModelKey, backend: Backend) -> bool:
        return key in self._ready_in_table or self.router.is_live(backend)

    async def _watch(self, key: ModelKey) -> None:
        wake = self._wake[key]
        next_signal = 0.0
        try:
            while tickets := self._held.get(key):
                backend = next(iter(tickets)).backend
                if self._live(key, backend):
                    self._release(key)
                    break
                now = self.clock()
                if now >= next_signal:
                    self.demand.signal(*key)
                    next_signal = now + self.limits.demand_renew
                wake.clear()
                asked = self.clock()
                answered = await self._probe_or_wake(backend, wake, max(0.0, next_signal - asked))
                if answered is None or (answered and self._live(key, backend)):
                    continue  # woken, a pod answered ready, or time to renew the demand: looked at again on top
                # Every pod answered "not ready" at once (or there is none to ask yet): ask again shortly.
                rest = self.limits.probe_interval - (self.clock() - asked)
                if rest > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), rest)
        except Exception:  # a bug must not strand the requests: they fail now instead of at their deadline
            log.exception("the hold watcher of %s/%s failed", *key)
            self._fail(key, f"The gateway failed while waiting for AIModel '{key[1]}'.")
        finally:
            self._watchers.pop(key, None)
            self._wake.pop(key, None)
            self._ready_in_table.discard(key)

    async def _probe_or_wake(self, backend: Backend, wake: asyncio.Event, within: float) -> bool | None:
        """The probe of `backend`'s starting pods raced against `wake` for `within` seconds: the probe's answer
        (True: a pod answered ready), or None when woken or out of time first (the probe is cancelled)."""
        probe = asyncio.ensure_future(self._probe(backend))
        woken = asyncio.ensure_future(wake.wait())
        try:
            await asyncio.wait({probe, woken}, timeout=within, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (probe, woken):
                task.cancel()
            await asyncio.gather(probe, woken, return_exceptions=True)
        if woken.cancelled() and not probe.cancelled():
            return bool(probe.result())
        return None

    async def _probe(self, backend: Backend) -> bool:
        """Asks each not-yet-ready target of `backend` for /ready?wait=; True as soon as one answers 200 (the
        others are cancelled), False once all answered otherwise."""
        targets = self.router.probe_targets(backend)
        asks = {asyncio.ensure_future(self._ready(url)): target for target, url in targets}
        pending = set(asks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                ready = [asks[task] for task in done if task.result()]
                for target in ready:
                    self.router.mark_probed(backend, target)
                if ready:
                    return True
            return False
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _ready(self, base_url: str) -> bool:
        if self._http is None:
            import httpx

            # A wait per starting pod of each held model: bounded, and a full pool is "not ready yet" at once.
            timeout = httpx.Timeout(
                READY_WAIT_SECONDS + PROBE_TIMEOUT_SECONDS, connect=PROBE_TIMEOUT_SECONDS, pool=PROBE_TIMEOUT_SECONDS
            )
            limits = httpx.Limits(max_connections=MAX_READY_WAITS, max_keepalive_connections=20)
            self._http = httpx.AsyncClient(timeout=timeout, limits=limits)
        try:
            response = await self._http.get(f"{base_url}{READY_PATH}?{READY_WAIT_PARAM}={READY_WAIT_SECONDS:g}")
        except Exception:  # refused, reset, timed out: not ready yet
            return False
        return bool(response.status_code == 200)

    async def aclose(self) -> None:
        for key in list(self._held):
            self._fail(key, "The gateway is shutting down.")
        for task in list(self._watchers.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._http is not None:
            await self._http.aclose()
        self.demand.close()
