"""One request, one trace: the gateway's spans, the runtime's under them, and vLLM's own under those, found in
a real Jaeger (tests/support/jaeger.py). Tracing is configured as the chart configures it: OTel's variables.

The gateway and the runtimes run as processes with OTEL_EXPORTER_OTLP_ENDPOINT set; the test reads each
response's `x-trace-id` and polls Jaeger's query API for that trace.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from servlane_api.runtime_config import RuntimeConfig
from tests.support import jaeger as jaeger_fixtures
from tests.support import models as shared_models
from tests.support.gateway_harness import aifeature, aimodel
from tests.support.jaeger import Jaeger, Span
from tests.support.polling import wait_until
from tests.support.ports import free_port
from tests.support.servers import SubprocessServer
from tests.support.vllm import MAX_MODEL_LEN, VLLM_START_SECONDS, require_vllm

pytestmark = pytest.mark.slow
tiny_llama_dir = shared_models.tiny_llama_dir
jaeger = jaeger_fixtures.jaeger
HI: Any = [{"role": "user", "content": "Hello!"}]


def traced_env(jaeger: Jaeger) -> dict[str, str]:
    # Export every 100 ms rather than every 5 s, so the test waits for Jaeger, not for a batch timer.
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "HF_HUB_OFFLINE": "1",
    }


class GatewayProcess:
    def __init__(self, workdir: Path, objects: list[dict[str, Any]], env: dict[str, str]) -> None:
        routes = workdir / "routes.json"
        routes.write_text(json.dumps(objects))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        metrics_port = free_port()
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"  # its own port: the API port has none
        argv = [sys.executable, "-m", "servlane_gateway", "--routes-file", str(routes), "--port", str(self.port)]
        argv += ["--metrics-port", str(metrics_port)]
        # One worker: exemplars (asserted below) are not kept by prometheus_client's multiprocess files.
        argv += ["--host", "127.0.0.1", "--log-level", "warning", "--workers", "1"]
        self.log = workdir / "gateway.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(argv, env=os.environ | env, stdout=out, stderr=out)
        wait_until("the gateway to be ready", self._ready, 60, tolerate=lambda e: isinstance(e, httpx.HTTPError))

    def _ready(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()[-3000:]
        return httpx.get(self.url + "/ready", timeout=2).status_code == 200

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(20)


@pytest.fixture(scope="module")
def gateway(jaeger: Jaeger, tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = RuntimeConfig(model_source=str(tiny_llama_dir), served_model_name="tiny", engine="transformers")
    with SubprocessServer(config, traced_env(jaeger)) as runtime:
        runtime.wait_ready()
        objects = [aimodel("model-tiny", runtime.v1, served="tiny"), aifeature("chat", [("model-tiny", 100)])]
        process = GatewayProcess(tmp_path_factory.mktemp("gateway"), objects, traced_env(jaeger))
        try:
            yield process
        finally:
            process.stop()


def wait_for_trace(jaeger: Jaeger, trace_id: str, names: set[tuple[str, str]]) -> list[Span]:
    """The trace once it holds every (service, span name) in `names` (spans arrive in export batches)."""

    def complete() -> list[Span] | None:
        spans = jaeger.spans(trace_id)
        return spans if names <= {(s.service, s.name) for s in spans} else None

    return wait_until(f"trace {trace_id} with {sorted(names)}", complete, timeout=30, interval=0.2)


def one(spans: list[Span], service: str, name: str) -> Span:
    (found,) = [s for s in spans if s.service == service and s.name == name]
    return found


GATEWAY, RUNTIME = "servlane-gateway", "servlane-runtime"
CHAT = "POST /v1/chat/completions"


def test_a_chat_through_the_gateway_is_one_trace(gateway: GatewayProcess, jaeger: Jaeger) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="chat", messages=HI, max_tokens=4)
    assert raw.status_code == 200
    trace_id = raw.headers["x-trace-id"]
    assert len(trace_id) == 32
    wanted = {(GATEWAY, n) for n in (CHAT, "auth", "route", "pick", "upstream")}
    wanted |= {(RUNTIME, n) for n in (CHAT, "admission", "tokenize", "generate")}
    spans = wait_for_trace(jaeger, trace_id, wanted)

    root = one(spans, GATEWAY, CHAT)
    assert root.parent_id is None
    assert root.tags["servlane.feature"] == "chat"
    assert root.tags["http.response.status_code"] == 200
    for name in ("auth", "route", "pick", "upstream"):
        assert one(spans, GATEWAY, name).parent_id == root.span_id, name
    upstream = one(spans, GATEWAY, "upstream")
    assert upstream.tags["servlane.model"] == "model-tiny"
    assert "first_byte" in upstream.events
    # The runtime continued the gateway's trace under the call that reached it.
    served = one(spans, RUNTIME, CHAT)
    assert served.parent_id == upstream.span_id
    assert served.tags["gen_ai.request.model"] == "tiny"
    for name in ("admission", "tokenize", "generate"):
        assert one(spans, RUNTIME, name).parent_id == served.span_id, name
    assert "first_token" in one(spans, RUNTIME, "generate").events

    # The metrics link to the trace: the request's latency bucket carries it as an OpenMetrics exemplar.
    scraped = httpx.get(gateway.metrics_url, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert scraped.headers["content-type"].startswith("application/openmetrics-text")
    linked = [line for line in scraped.text.splitlines() if f'trace_id="{trace_id}"' in line]
    assert linked, "no exemplar names the trace"
    assert all('feature="chat"' in line and "_bucket{" in line for line in linked), linked
    assert f'trace_id="{trace_id}"' not in httpx.get(gateway.metrics_url).text  # the classic format has none


def test_an_error_names_its_trace(gateway: GatewayProcess, jaeger: Jaeger) -> None:
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json={"model": "no-such-model", "messages": HI})
    assert response.status_code == 404
    trace_id = response.headers["x-trace-id"]
    spans = wait_for_trace(jaeger, trace_id, {(GATEWAY, CHAT), (GATEWAY, "route")})
    assert one(spans, GATEWAY, CHAT).tags["http.response.status_code"] == 404
    assert one(spans, GATEWAY, "route").tags.get("otel.status_code") == "ERROR"  # where it failed
    assert not [s for s in spans if s.service == RUNTIME]  # no backend was called


def test_a_chat_through_the_gateway_to_vllm_is_one_trace_down_to_the_engine(
    jaeger: Jaeger, tiny_llama_dir: Path, tmp_path: Path
) -> None:
    require_vllm()
    config = RuntimeConfig(
        model_source=str(tiny_llama_dir),
        served_model_name="tiny",
        engine="vllm",
        dtype="bfloat16",
        max_model_len=MAX_MODEL_LEN,
        extra_args=["--enforce-eager"],
    )
    env = traced_env(jaeger) | {"VLLM_CPU_KVCACHE_SPACE": "1", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}
    with SubprocessServer(config, env) as runtime:
        runtime.wait_ready(timeout=VLLM_START_SECONDS)
        objects = [aimodel("model-tiny", runtime.v1, served="tiny"), aifeature("chat", [("model-tiny", 100)])]
        gateway = GatewayProcess(tmp_path, objects, traced_env(jaeger))
        try:
            body = {"model": "chat", "messages": HI, "max_tokens": 4}
            response = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=120)
        finally:
            gateway.stop()
    assert response.status_code == 200
    trace_id = response.headers["x-trace-id"]

    def with_engine_spans() -> list[Span] | None:
        spans = jaeger.spans(trace_id)
        names = {(s.service, s.name) for s in spans}
        wanted = {(GATEWAY, "upstream"), (RUNTIME, "generate")}
        return spans if wanted <= names and "llm_request" in {s.name for s in spans} else None

    spans = wait_until("the gateway's, the runtime's and vLLM's spans", with_engine_spans, timeout=30, interval=0.2)
    (engine,) = [s for s in spans if s.name == "llm_request"]
    assert engine.parent_id == one(spans, RUNTIME, "generate").span_id
    assert one(spans, RUNTIME, CHAT).parent_id == one(spans, GATEWAY, "upstream").span_id
    assert one(spans, GATEWAY, CHAT).parent_id is None  # one trace, rooted at the gateway
