"""/metrics on the runtime's metrics port only (#28 item 3): the model's API answers without a key, so a
scraper admitted to the pods must get the metrics without getting the API, and the API's clients (the
gateway) no metrics: the operator's NetworkPolicy admits each on its own port."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from servlane_api.runtime_config import DEFAULT_METRICS_PORT, RuntimeConfig
from tests.support.servers import InProcessServer, SubprocessServer, tiny_config


def metrics_port_url(server: InProcessServer | SubprocessServer, path: str) -> str:
    return server.metrics_url.removesuffix("/metrics") + path


def test_the_api_port_has_no_metrics_and_the_metrics_port_nothing_else(chat_server: InProcessServer) -> None:
    assert chat_server.get("/v1/models").status_code == 200  # a request the metrics count
    on_api = chat_server.get("/metrics")
    assert on_api.status_code == 404
    assert "servlane_runtime" not in on_api.text

    scraped = httpx.get(chat_server.metrics_url, timeout=10)
    assert scraped.status_code == 200
    assert 'servlane_runtime_requests_total{code="200",endpoint="/v1/models"}' in scraped.text
    for path in ("/v1/models", "/health", "/ready", "/metrics/x"):
        answer = httpx.get(metrics_port_url(chat_server, path), timeout=10)
        assert answer.status_code == 404, path
        assert answer.json()["error"]["code"] == "not_found"
    chat = httpx.post(metrics_port_url(chat_server, "/v1/chat/completions"), json={"model": "tiny-llama"}, timeout=10)
    assert chat.status_code == 404


def test_the_runtime_process_listens_on_both_ports(tiny_llama_dir: Path) -> None:
    with SubprocessServer(tiny_config(tiny_llama_dir)) as server:
        assert server.get("/metrics").status_code == 404
        assert "servlane_runtime_in_flight" in httpx.get(server.metrics_url, timeout=10).text


def test_the_metrics_port_defaults_apart_from_the_api_port_and_never_on_it() -> None:
    config = RuntimeConfig(model_source="/m", served_model_name="m", engine="transformers")
    assert config.metrics_port == DEFAULT_METRICS_PORT != config.port
    with pytest.raises(ValidationError, match="metrics_port"):
        RuntimeConfig(model_source="/m", served_model_name="m", engine="transformers", port=9000, metrics_port=9000)
