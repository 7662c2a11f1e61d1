"""A canary on a local stack: runtime processes on the tiny CPU model, their config, the rollout steps and
analysis, and waiting until a model answers the load."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.canary_faults import PrometheusProcess, get_ok
from e2e.traffic import Load
from localcluster.cluster import stop_process_groups
from servlane_api.runtime_config import RuntimeConfig
from tests.support.cluster_harness import ARTIFACTS, ROOT, Kube, OperatorProcess, wait_until
from tests.support.ports import free_port

CPU_MODEL: dict[str, Any] = {"source": {"uri": "/models/tiny"}, "engine": "transformers", "resources": {"cpu": "1"}}
STEPS = [25, 50, 100]
MIN_REQUESTS = 3
WARM_UP_REQUESTS = 5
ANALYSIS = {"maxErrorRate": 0.1, "minRequests": MIN_REQUESTS}


class RuntimeProcess:
    """`python -m servlane_runtime` on a fixed loopback port, so it can be killed and started again there."""

    def __init__(self, config: RuntimeConfig, workdir: Path) -> None:
        self.port = free_port()
        # /metrics on a port of its own (the API port has none), free here: several runtimes share the machine.
        self.config = config.model_copy(update={"host": "127.0.0.1", "port": self.port, "metrics_port": free_port()})
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, **config_changes: Any) -> RuntimeProcess:
        config = self.config.model_copy(update=config_changes)
        path = self.workdir / f"runtime-{config.served_model_name}.json"
        path.write_text(config.to_env_value())
        with (self.workdir / f"runtime-{config.served_model_name}.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "servlane_runtime", "--config", str(path)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
            )  # fmt: skip
        return self

    def ready_state(self) -> str | None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"runtime {self.config.served_model_name} exited with {self.proc.returncode}")
        try:
            return str(httpx.get(self.base_url + "/ready", timeout=2).json()["status"])
        except (httpx.HTTPError, ValueError):
            return None

    def wait(self, state: str, timeout: float = 120) -> None:
        wait_until(f"runtime {self.config.served_model_name} {state}", lambda: self.ready_state() == state, timeout)

    def warm_up(self, requests: int = WARM_UP_REQUESTS) -> None:
        """A few chats straight to the runtime, so neither version is judged on its cold first requests: the
        runtime's own warm-up is one token, and its next few chats are still several times slower (seconds
        on a busy machine), which a 3 s window's p95 of a dozen canary requests would compare with a stable
        that has long been serving, and roll a healthy canary back (maxP95RatioToStable)."""
        name = self.config.served_model_name
        body = {"model": name, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 3}
        with httpx.Client(base_url=self.base_url, timeout=60, trust_env=False) as http:
            for _ in range(requests):
                http.post("/v1/chat/completions", json=body).raise_for_status()

    def wait_exit(self, timeout: float = 60) -> int:
        proc = self.proc
        assert proc is not None
        wait_until(f"runtime {self.config.served_model_name} to exit", lambda: proc.poll() is not None, timeout)
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL, as an OOM kill or a crash would: no graceful shutdown."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop_process_groups([self.proc.pid], timeout=15)
            self.proc.wait(timeout=5)
        self.proc = None


@dataclass
class Gateway:
    """A gateway process watching one namespace, its models' in-cluster addresses overridden to processes."""

    url: str
    proc: subprocess.Popen[bytes]
    metrics_url: str

    def route_weights(self, feature: str = "chat") -> dict[str, float]:
        text = httpx.get(self.metrics_url, timeout=5).text
        return {
            s.labels["model"]: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "servlane_gateway_route_weight" and s.labels.get("feature") == feature
        }


def start_gateway(kube: Kube, ns: str, port: int, backends: dict[str, str], workdir: Path) -> Gateway:
    """`python -m servlane_gateway --watch` on `port`, sending model `name` of `ns` to `backends[name]`."""
    overrides = [
        arg
        for model, url in backends.items()
        for arg in ("--endpoint-override", f"http://model-{model}.{ns}.svc.cluster.local:8000={url}")
    ]
    command = [sys.executable, "-m", "servlane_gateway", "--watch", "--namespaces", ns, "--host", "127.0.0.1",
               "--port", str(port), "--metrics-port", str(metrics_port_of(port)), "--first-byte-timeout", "10",
               *overrides]  # fmt: skip
    with (workdir / "gateway.log").open("ab") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT,
            env={**os.environ, "KUBECONFIG": str(kube.kubeconfig)},
        )  # fmt: skip
    gateway = Gateway(f"http://127.0.0.1:{port}", proc, f"http://127.0.0.1:{metrics_port_of(port)}/metrics")

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"gateway exited with {proc.returncode}; see {workdir / 'gateway.log'}")
        return get_ok(gateway.url + "/ready")

    wait_until("gateway ready", ready, timeout=30)
    return gateway


def runtime_config(model_dir: Path, name: str) -> RuntimeConfig:
    return RuntimeConfig(model_source=str(model_dir), served_model_name=name, engine="transformers", max_in_flight=4)


def wait_served(load: Load, model: str, since: float = 0, count: int = 5, timeout: float = 30) -> None:
    """Until `model` has answered `count` requests started after `since`; the failure names what clients got."""
    try:
        wait_until(f"{model} answers chat", lambda: answered_by(load, model, since, count), timeout=timeout)
    except AssertionError as exc:
        seen = Counter(o.model or f"error {o.error}" for o in load.answered_since(since))
        raise AssertionError(f"{exc}; clients got: {dict(seen)}") from None


def answered_by(load: Load, model: str, since: float, count: int = 5) -> bool:
    return sum(1 for o in load.answered_since(since) if o.model == model) >= count


def rollout(interval: str) -> dict[str, Any]:
    return {"steps": STEPS, "interval": interval, "analysis": ANALYSIS}


# CI scrapes every second and analyses every 0.5 s so the 3 s steps take seconds; the bench sets the shipped
# defaults (15 s scrapes as the chart assumes, a 10 s analysis timer) to measure what a user gets.
SCRAPE_INTERVAL_SECONDS = float(os.environ.get("CANARY_PROMETHEUS_SCRAPE_INTERVAL_SECONDS", "1"))
ANALYSIS_INTERVAL_SECONDS = float(os.environ.get("CANARY_ANALYSIS_INTERVAL_SECONDS", "0.5"))


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"canary e2e prerequisites missing in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def model_dir() -> Path:
    try:
        from tests.support.models import build_tiny_llama

        return build_tiny_llama()
    except ImportError as exc:
        _unavailable(f"the tiny model needs torch and transformers: {exc}")
        raise


@pytest.fixture(scope="module")
def gateway_port() -> int:
    """One port for every test's gateway, so the module's Prometheus scrapes whichever one runs."""
    return free_port()


@functools.cache
def metrics_port_of(gateway_port: int) -> int:
    """The metrics port of the gateways on `gateway_port` (one for the module, like gateway_port)."""
    return free_port()


@pytest.fixture(scope="module")
def prometheus(gateway_port: int, workdir: Path) -> Iterator[PrometheusProcess]:
    """The module's Prometheus, scraping the gateway. A scenario may kill it (a metrics outage); the next
    one that needs it calls ensure_running()."""
    binary = shutil.which("prometheus")
    if binary is None:
        _unavailable("the prometheus binary is missing: run scripts/install-prometheus.sh")
    assert binary is not None
    data = workdir / "prometheus"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir()
    every = f"{SCRAPE_INTERVAL_SECONDS:g}s"
    (data / "prometheus.yml").write_text(
        f"global:\n  scrape_interval: {every}\n  evaluation_interval: {every}\n"
        "scrape_configs:\n  - job_name: gateway\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{metrics_port_of(gateway_port)}']\n"
    )
    server = PrometheusProcess(binary, data, free_port())
    try:
        server.start()
        yield server
    finally:
        if server.proc is not None:
            stop_process_groups([server.proc.pid], timeout=15)
            server.proc.wait(timeout=5)


@pytest.fixture(scope="module")
def canary_operator(operator: OperatorProcess, prometheus: PrometheusProcess) -> Iterator[OperatorProcess]:
    """The operator reading canary metrics from Prometheus; the session's operator steps aside meanwhile."""
    operator.stop()
    env = {
        "SERVLANE_PROMETHEUS_URL": prometheus.url,
        "SERVLANE_ANALYSIS_INTERVAL_SECONDS": f"{ANALYSIS_INTERVAL_SECONDS:g}",
        # The Prometheus above scrapes every second (in CI): 3 s intervals are two scrapes and more, not raised.
        "SERVLANE_PROMETHEUS_SCRAPE_INTERVAL_SECONDS": f"{SCRAPE_INTERVAL_SECONDS:g}",
        "SERVLANE_PROMETHEUS_GATEWAY_JOB": "gateway",  # the job_name of the scrape config above
    }
    own = OperatorProcess(operator.kubeconfig, ARTIFACTS / "operator-canary-full.log", extra_env=env)
    try:
        own.start()
        yield own
    finally:
        own.stop()
        operator.start()
