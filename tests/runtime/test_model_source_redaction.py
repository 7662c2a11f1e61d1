"""A presigned download URL never reaches what the runtime shows: the Hugging Face Hub redirects a file to a CDN
URL whose query string signs it (X-Amz-Signature, X-Amz-Credential); a failed download quoted it in the model's
reason (the log, /ready, the termination message, so the AIModel's conditions and events), in an adapter's
reason (its 503 to callers), and huggingface_hub's HTTP client logged it at INFO on every download."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import cast

import pytest

from servlane_api.runtime_config import RuntimeConfig
from servlane_core.protocol.errors import OpenAIError
from servlane_runtime.adapters import AdapterHost
from servlane_runtime.engines.base import InferenceEngine
from servlane_runtime.model_host import ModelHost
from servlane_web.logs import HTTP_CLIENT_LOGGERS, quiet_http_clients, setup_logging

SIGNATURE = "FAKESIGNATURE0123456789abcdef"
CREDENTIAL = "AKIAFAKEACCESSKEY01"
COMMIT = "a" * 40


class SigningHub(BaseHTTPRequestHandler):
    """The Hub's API for one repository with one file, whose download redirects to a signed URL the CDN refuses."""

    def log_message(self, *_args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._answer()

    def do_HEAD(self) -> None:
        self._answer()

    def _send(self, code: int, body: bytes = b"", headers: tuple[tuple[str, str], ...] = ()) -> None:
        self.send_response(code)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _answer(self) -> None:
        linked = (("X-Repo-Commit", COMMIT), ("X-Linked-Etag", '"abc"'), ("X-Linked-Size", "10"), ("ETag", '"abc"'))
        if "/tree/" in self.path:
            listing = [{"type": "file", "path": "config.json", "size": 10, "oid": "b" * 40}]
            return self._send(200, json.dumps(listing).encode(), (("Content-Type", "application/json"),))
        if self.path.startswith("/api/models/"):
            info = {"id": "org/model", "sha": COMMIT, "siblings": [{"rfilename": "config.json"}]}
            return self._send(200, json.dumps(info).encode(), (("Content-Type", "application/json"),))
        if "/resolve/" in self.path:
            port = self.server.server_port  # type: ignore[attr-defined]
            signed = (
                f"http://127.0.0.1:{port}/cdn/config.json?X-Amz-Algorithm=AWS4-HMAC-SHA256"
                f"&X-Amz-Credential={CREDENTIAL}%2F20250101%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Signature={SIGNATURE}"
            )
            return self._send(302, b"", (("Location", signed), *linked))
        if self.path.startswith("/cdn/") and self.command == "HEAD":
            return self._send(200, b"", linked)
        if self.path.startswith("/cdn/"):
            return self._send(403, b"<Error><Code>AccessDenied</Code></Error>", (("Content-Type", "application/xml"),))
        return self._send(404)


@pytest.fixture
def signing_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), SigningHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")  # the classic download, which follows the CDN's redirect
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield
    server.shutdown()
    server.server_close()


def no_signature(text: str) -> bool:
    return SIGNATURE not in text and CREDENTIAL not in text


def test_a_failed_download_says_why_without_its_signed_url(
    signing_hub: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = RuntimeConfig.model_validate(
        {
            "model_source": "hf://org/model",
            "served_model_name": "m",
            "engine": "transformers",
            "cache_dir": str(tmp_path),
        }
    )
    host = ModelHost(config, lambda *_: cast(InferenceEngine, None))  # the download fails first
    quiet_http_clients()  # as the runtime's main does (setup_logging)
    with caplog.at_level(logging.INFO):
        asyncio.run(host.load())
    assert host.state == "failed"
    assert "403" in host.reason  # still says what went wrong
    assert "/cdn/config.json" in host.reason  # and where, without the query string
    assert no_signature(host.reason), host.reason
    assert no_signature(json.dumps(host.readiness()))
    assert no_signature(caplog.text), caplog.text


def test_an_adapter_that_fails_to_download_tells_callers_why_without_its_signed_url(
    signing_hub: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    listing = tmp_path / "adapters.json"
    listing.write_text(json.dumps([{"name": "tenant-lora", "source": "hf://org/model"}]))

    class Engine:
        async def load_adapter(self, name: str, path: str) -> None:
            pass

        async def unload_adapter(self, name: str) -> None:
            pass

    host = AdapterHost(str(listing), str(tmp_path))
    asyncio.run(host.sync_once(Engine()))  # type: ignore[arg-type]
    with pytest.raises(OpenAIError) as refused:
        host.check("tenant-lora")
    assert "failed to load" in str(refused.value.body())
    assert no_signature(json.dumps(refused.value.body()))
    assert no_signature(json.dumps(host.states()))
    assert no_signature(caplog.text), caplog.text


def test_the_servers_keep_the_http_clients_per_request_lines_out_of_their_logs() -> None:
    setup_logging("info")
    for name in HTTP_CLIENT_LOGGERS:
        assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
