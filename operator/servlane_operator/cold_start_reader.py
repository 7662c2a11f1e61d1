"""Reads each model pod's cold start once it is Ready and writes it to its AIModel's status.coldStart.

The thin part: it fetches the pod's Events and its runtime's GET /startup (metrics port) and writes the
status; servlane_core.cold_start decides the breakdown and what status keeps. Each pod is read once (and
again a few times while its first token is still missing); writes to one model are one at a time, each on
the AIModel's latest status, so two pods turning Ready together both land.

The pod may run an image its tenant chose (spec.image), so its answer is untrusted: one GET, no redirects,
at most STARTUP_MAX_BYTES within STARTUP_TIMEOUT_SECONDS, parsed into times only (RuntimeStartup). A pod
reaches only its own AIModel's status: the model is the pod's label in the pod's own namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from kubernetes.client.exceptions import ApiException
from prometheus_client import Histogram
from pydantic import ValidationError

from servlane_api import GROUP, VERSION
from servlane_api.cold_start import COLD_START_FIELDS, STARTUP_PATH, ColdStartStatus, RuntimeStartup
from servlane_api.runtime_config import DEFAULT_METRICS_PORT
from servlane_core.cold_start import breakdown, needs_sample, record_start
from servlane_operator.kube import Kube
from servlane_operator.labels import MODEL_LABEL

log = logging.getLogger(__name__)

COLD_START_SECONDS = Histogram(
    "servlane_model_cold_start_seconds",
    "Each step of a model pod's start (phase; total: created to Ready), once per pod",
    ["namespace", "model", "phase"],
    buckets=(0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 120, 300, 600, 1800),
)
STARTUP_TIMEOUT_SECONDS = 2.0
STARTUP_MAX_BYTES = 16 << 10
# After a pod's start is recorded without a first token, its runtime is asked again after these delays.
FIRST_TOKEN_RECHECKS_SECONDS = (2.0, 10.0, 60.0, 300.0)
# Pods whose start is recorded, remembered so that pod events do not ask again (bounded, oldest forgotten).
_MAX_REMEMBERED = 50_000
_AIMODEL_API = f"{GROUP}/{VERSION}"


def is_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class ColdStartReader:
    def __init__(
        self,
        kube: Kube,
        client: httpx.AsyncClient | None = None,
        metrics_port: int = DEFAULT_METRICS_PORT,
        rechecks: Sequence[float] = FIRST_TOKEN_RECHECKS_SECONDS,
    ) -> None:
        self._kube = kube
        self._client = client or httpx.AsyncClient(timeout=STARTUP_TIMEOUT_SECONDS, follow_redirects=False)
        self._metrics_port = metrics_port
        self._rechecks = tuple(rechecks)
        self._done: OrderedDict[str, None] = OrderedDict()  # pod uids whose start is complete in status
        self._busy: set[str] = set()  # pod uids being read now
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def observe(self, pod: Mapping[str, Any]) -> None:
        """A pod event: a Ready pod not yet recorded is read in the background (this returns at once)."""
        meta = pod.get("metadata") or {}
        uid, model = str(meta.get("uid", "")), (meta.get("labels") or {}).get(MODEL_LABEL)
        if not uid or not model or meta.get("deletionTimestamp") or not is_ready(pod):
            return
        if uid in self._done or uid in self._busy:
            return
        self._busy.add(uid)
        task = asyncio.create_task(self._read(dict(pod), str(meta.get("namespace", "")), model, uid))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read(self, pod: dict[str, Any], namespace: str, model: str, uid: str) -> None:
        try:
            for delay in (0.0, *self._rechecks):
                if delay:
                    await asyncio.sleep(delay)  # a recheck's schedule, not a synchronisation
                if await self.record(pod, namespace, model):
                    self._remember(uid)
                    return
        except asyncio.CancelledError:
            raise
        except Exception:  # the next event of another pod is unaffected; this one's start stays unrecorded
            log.exception("reading the cold start of pod %s/%s failed", namespace, pod["metadata"].get("name"))
        finally:
            self._busy.discard(uid)

    async def record(self, pod: Mapping[str, Any], namespace: str, model: str) -> bool:
        """Reads and writes the pod's start; True once it is complete in status (first token included), or
        there is nothing more to do (the AIModel is gone)."""
        name = str(pod["metadata"].get("name", ""))
        async with self._locks.setdefault((namespace, model), asyncio.Lock()):
            body = await self._kube.get(_AIMODEL_API, "AIModel", namespace, model)
            if body is None:
                return True
            status = _cold_start_status(body)
            if not needs_sample(status, name):
                return True
            events = await self._kube.list_events(
                namespace, f"involvedObject.kind=Pod,involvedObject.name={name},involvedObject.uid={pod_uid(pod)}"
            )
            startup = await self.startup(pod)
            sample = breakdown(pod, events, startup)
            if sample is None:
                return True
            known = next((s for s in (status.recent if status else []) if s.pod == name), None)
            updated = record_start(status, sample)
            if known is not None and known == sample:
                return sample.first_token is not None
            try:
                await self._kube.patch_status(
                    _AIMODEL_API,
                    "AIModel",
                    namespace,
                    model,
                    {"coldStart": updated.model_dump(by_alias=True, mode="json")},
                )
            except ApiException as exc:
                if exc.status == 404:
                    return True
                raise
            self._observe_metrics(namespace, model, sample, first_time=known is None)
            return sample.first_token is not None

    async def startup(self, pod: Mapping[str, Any]) -> RuntimeStartup | None:
        """What the pod's runtime answers at /startup; None when it cannot be had (logged, not raised)."""
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            return None
        host = f"[{ip}]" if ":" in str(ip) else str(ip)
        url = f"http://{host}:{self._metrics_port}{STARTUP_PATH}"
        try:
            async with self._client.stream("GET", url) as response:
                if response.status_code != 200:
                    log.info(
                        "%s answered %d: the cold start is told without the runtime's steps", url, response.status_code
                    )
                    return None
                body = b""
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > STARTUP_MAX_BYTES:
                        log.warning("%s answered more than %d bytes: ignored", url, STARTUP_MAX_BYTES)
                        return None
            return RuntimeStartup.model_validate_json(body)
        except (httpx.HTTPError, ValidationError) as exc:
            log.info("reading %s failed (%s): the cold start is told without the runtime's steps", url, exc)
            return None

    def _observe_metrics(self, namespace: str, model: str, sample: Any, *, first_time: bool) -> None:
        for phase in COLD_START_FIELDS:
            if not first_time and phase != "first_token":
                continue  # the rest was observed when the pod's start was first recorded
            value = getattr(sample, phase)
            if value is not None:
                COLD_START_SECONDS.labels(namespace, model, phase).observe(value)

    def _remember(self, uid: str) -> None:
        self._done[uid] = None
        while len(self._done) > _MAX_REMEMBERED:
            self._done.popitem(last=False)

    def forget_model(self, namespace: str, model: str) -> None:
        """A deleted AIModel: its metric series and its lock go."""
        self._locks.pop((namespace, model), None)
        for phase in COLD_START_FIELDS:
            with contextlib.suppress(KeyError):
                COLD_START_SECONDS.remove(namespace, model, phase)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self._client.aclose()


def pod_uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid", ""))


def _cold_start_status(body: Mapping[str, Any]) -> ColdStartStatus | None:
    raw = (body.get("status") or {}).get("coldStart")
    if not raw:
        return None
    try:
        return ColdStartStatus.model_validate(raw)
    except ValidationError:
        return None  # written by someone else in a shape we do not know: start afresh
