"""The gateway on several processes: how many, and how they share one port, their settings and metrics.

uvicorn's supervisor binds the port once and starts the workers (spawned: fresh interpreters, each building
the app through `worker_app` from the settings the supervisor passes in its environment); the kernel hands
each new connection to one of them, and restarts of a dead worker are uvicorn's. What stays consistent
across the processes, and how:
- the route table and the pods behind each model: every worker follows the same source (the routes file or
  the cluster watch), so they agree within that source's own delay;
- rate limits and quotas: in Redis when one is set, shared by processes and replicas alike; limits kept in
  memory allow one process only (the settings refuse more; the automatic count picks 1);
- metrics: prometheus_client's multiprocess files (one per process in a directory emptied at start), each
  worker counting in its memory and writing its files in batches, and all of them just before a scrape
  (servlane_gateway.worker_metrics), so /metrics (on the metrics port, which every worker accepts on as on
  the API port) in any worker reports the pod's sums, every request answered before it counted (and drops
  the in-flight gauges of dead workers).
  With several workers there are no exemplars (trace links),
  and the series of a removed route or pod stay until the gateway restarts (the weights are filtered to
  the models routed to now: gateway_metrics._PodSums).
Per worker, on purpose: the in-flight counts least-load picks by, the upstream connection pools, a response
cache kept in memory (with Redis it is shared), and the console's list of recent requests.
"""

from __future__ import annotations

import ctypes
import gc
import json
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from pydantic import SecretStr
from uvicorn.supervisors import Multiprocess

from servlane_gateway import worker_metrics
from servlane_gateway.app import create_app
from servlane_gateway.http.metrics_listener import APP_FACTORY, bind_listeners
from servlane_gateway.settings import GatewaySettings
from servlane_web.http_server import ServlaneHttpProtocol
from servlane_web.logs import setup_logging
from servlane_web.open_files import raise_open_files_limit

STARTUP_FAILURE = 3  # uvicorn's own exit status for an app that failed to start

log = logging.getLogger(__name__)

# Each worker holds its own watches and connection pools: more processes than this cost memory and API
# server connections for little gain, so a big node without a CPU limit does not get one per core.
MAX_AUTO_WORKERS = 8
SETTINGS_ENV = "SERVLANE_GATEWAY_WORKER_SETTINGS"
SUPERVISOR_ENV = "SERVLANE_GATEWAY_SUPERVISOR_PID"
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
CGROUP = Path("/sys/fs/cgroup")
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def cpu_limit(cpu_max: str | None, cfs_quota_us: str | None = None, cfs_period_us: str | None = None) -> float | None:
    """The CPUs a cgroup allows: from v2's cpu.max ("max 100000", "150000 100000") or else v1's
    cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us; None when there is no limit or it does not parse."""
    try:
        if cpu_max is not None:
            quota, _, period = cpu_max.strip().partition(" ")
            return None if quota == "max" else int(quota) / int(period or "100000")
        if cfs_quota_us is not None and cfs_period_us is not None:
            quota_us = int(cfs_quota_us)
            return None if quota_us <= 0 else quota_us / int(cfs_period_us)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def read_cpu_limit() -> float | None:
    """This process's cgroup CPU limit (a container's `resources.limits.cpu`), v2 or v1."""
    v1 = CGROUP / "cpu"
    return cpu_limit(_read(CGROUP / "cpu.max"), _read(v1 / "cpu.cfs_quota_us"), _read(v1 / "cpu.cfs_period_us"))


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0))


def worker_count(settings: GatewaySettings, limit: float | None, cpus: int) -> tuple[int, str]:
    """How many processes serve, and why (for the start-up log)."""
    if settings.workers:
        return settings.workers, "--workers"
    if settings.one_process_only:
        return 1, settings.one_process_only
    given = cpus if limit is None else max(1, min(cpus, math.ceil(limit)))
    where = f"a CPU limit of {limit:g}" if limit is not None else f"{cpus} usable CPUs"
    count = min(given, MAX_AUTO_WORKERS)
    capped = f", at most {MAX_AUTO_WORKERS}" if given > MAX_AUTO_WORKERS else ""
    return count, f"one per CPU given ({where}{capped})"


def settings_json(settings: GatewaySettings) -> str:
    """The settings as the workers rebuild them: secrets in clear (they travel in the workers' environment,
    readable only by this user, as the flags' own environment variables are); never logged."""
    values = settings.model_dump()
    for name, value in values.items():
        if isinstance(value, SecretStr):
            values[name] = value.get_secret_value()
    return json.dumps(values, default=str)


def fresh_metrics_dir() -> Path:
    """The multiprocess metrics directory, emptied: the deployer's (PROMETHEUS_MULTIPROC_DIR) or a new one.
    Files of an earlier run would add its counts to this one's."""
    given = os.environ.get(METRICS_DIR_ENV)
    path = Path(given) if given else Path(tempfile.mkdtemp(prefix="servlane-gateway-metrics-"))
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink()
    return path


def server_options() -> dict[str, Any]:
    """uvicorn's settings for the gateway, single process or workers alike.
    - the gateway's protocol: one write per response, no watcher task per request (servlane_web.http_server);
    - no X-Forwarded-* rewriting of the client address: the gateway never uses it, and it cost a middleware
      call per request;
    - no access log: a line per request; the metrics count requests instead;
    - no `server: uvicorn` header: it tells a caller what to attack, and is one header line more per response
      (its Date header stays)."""
    return {"http": ServlaneHttpProtocol, "proxy_headers": False, "access_log": False, "server_header": False}


def tune_garbage_collection() -> None:
    """Called once the app is built, before it serves: what exists now (the imported libraries, the app) is
    moved out of the cyclic collector's sight, so its full collections no longer walk all of it; 0.94-0.97x
    CPU per request (bench/README.md). A larger young generation saved another ~5% of plain requests' CPU
    but made long streams' inter-token p99 worse (fewer, longer pauses hit every open stream at once), so
    the thresholds stay Python's."""
    gc.collect()
    gc.freeze()


def serve(settings: GatewaySettings) -> None:
    raise_open_files_limit()  # before the workers start: they inherit it
    count, why = worker_count(settings, read_cpu_limit(), usable_cpus())
    log.info(
        "serving on %s:%d (/metrics on port %d) from %d process(es): %s",
        settings.host,
        settings.port,
        settings.metrics_port,
        count,
        why,
    )
    # Every process accepts on both sockets; the app answers each by the port a request arrived on.
    sockets = bind_listeners(settings.host, settings.port, settings.metrics_port)
    if count == 1:
        app = create_app(settings)
        tune_garbage_collection()
        server = uvicorn.Server(uvicorn.Config(app, log_level=settings.log_level, **server_options()))
        server.run(sockets=sockets)
        if not server.started:  # the app's startup failed: exit non-zero, as uvicorn.run does
            sys.exit(STARTUP_FAILURE)
        return
    metrics_dir = fresh_metrics_dir()
    os.environ[METRICS_DIR_ENV] = str(metrics_dir)
    os.environ[SETTINGS_ENV] = settings_json(settings)
    os.environ[SUPERVISOR_ENV] = str(os.getpid())
    try:
        config = uvicorn.Config(
            APP_FACTORY, factory=True, workers=count, log_level=settings.log_level, **server_options()
        )
        Multiprocess(config, sockets=sockets).run()
    finally:
        os.environ.pop(SETTINGS_ENV, None)
        if metrics_dir.name.startswith("servlane-gateway-metrics-"):  # ours, not the deployer's
            shutil.rmtree(metrics_dir, ignore_errors=True)


def die_with_the_supervisor() -> None:
    """A worker goes when its supervisor dies without stopping it (SIGKILL, the OOM killer), as it would with
    the container: an orphan would keep serving on the port and renewing its places in Redis. The
    supervisor's orderly stops end the workers themselves, so this signal only mirrors a sudden death."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        log.warning("this worker may outlive its supervisor: prctl failed (errno %d)", ctypes.get_errno())
    if os.getppid() != int(os.environ[SUPERVISOR_ENV]):  # it died before the line above took effect
        os._exit(1)


def worker_app() -> FastAPI:
    """One worker's app (uvicorn's factory, in a spawned process): the supervisor's settings."""
    die_with_the_supervisor()
    settings = GatewaySettings.model_validate(json.loads(os.environ[SETTINGS_ENV]))
    setup_logging(settings.log_level)
    worker_metrics.FILES.start(os.environ[METRICS_DIR_ENV])  # before the app makes its metrics
    app = create_app(settings)
    tune_garbage_collection()
    return app
