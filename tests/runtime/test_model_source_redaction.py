"""A presigned download URL never reaches what the runtime shows: the Hugging Face Hub redirects a file to a CDN
URL whose query string signs it (X-Amz-Signature, X-Amz-Credential); a failed download quoted it in the model's
reason (the log, /ready, the termination message, so the AIModel's conditions and events), in an adapter's
reason (its 503 to callers), and huggingface_hub's HTTP client logged it at INFO on every download."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from servlane_web.logs import HTTP_CLIENT_LOGGERS, setup_logging

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
            port = self.headers.get("Host", "").rpartition(":")[2]  # the Hub's own port
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
def signing_hub() -> Iterator[dict[str, str]]:
    """The environment of a runtime that downloads from the signing Hub (in a child process: huggingface_hub
    reads its endpoint and offline mode once, when imported, and the tests' own process is offline)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), SigningHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{server.server_port}"
    env["HF_HUB_DISABLE_XET"] = "1"  # the classic download, which follows the CDN's redirect
    yield env
    server.shutdown()
    server.server_close()


# What a runtime shows of a model (or an adapter) whose download fails: its reason, /ready, and its log as the
# runtime's main sets logging up.
MODEL = """
import asyncio, json, sys
from servlane_api.runtime_config import RuntimeConfig
from servlane_runtime.model_host import ModelHost
from servlane_web.logs import setup_logging

setup_logging("info")
config = RuntimeConfig.model_validate(
    {"model_source": "hf://org/model", "served_model_name": "m", "engine": "transformers", "cache_dir": sys.argv[1]}
)
host = ModelHost(config, lambda *_: None)
asyncio.run(host.load())
print(json.dumps({"state": host.state, "reason": host.reason, "ready": host.readiness()}))
"""
ADAPTER = """
import asyncio, json, pathlib, sys
from servlane_core.protocol.errors import OpenAIError
from servlane_runtime.adapters import AdapterHost
from servlane_web.logs import setup_logging

setup_logging("info")
listing = pathlib.Path(sys.argv[1]) / "adapters.json"
listing.write_text(json.dumps([{"name": "tenant-lora", "source": "hf://org/model"}]))

class Engine:
    async def load_adapter(self, name, path): pass
    async def unload_adapter(self, name): pass

host = AdapterHost(str(listing), sys.argv[1])
asyncio.run(host.sync_once(Engine()))
try:
    host.check("tenant-lora")
except OpenAIError as refused:
    print(json.dumps({"answer": refused.body(), "states": host.states()}))
"""


def run(script: str, env: dict[str, str], where: Path) -> tuple[dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, "-c", script, str(where)], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def no_signature(text: str) -> bool:
    return SIGNATURE not in text and CREDENTIAL not in text


def test_a_failed_download_says_why_without_its_signed_url(signing_hub: dict[str, str], tmp_path: Path) -> None:
    shown, log = run(MODEL, signing_hub, tmp_path)
    assert shown["state"] == "failed"
    assert "403" in shown["reason"]  # still says what went wrong
    assert "/cdn/config.json" in shown["reason"]  # and where, without the query string
    assert no_signature(json.dumps(shown)), shown
    assert "model m failed" in log
    assert no_signature(log), log


def test_an_adapter_that_fails_to_download_tells_callers_why_without_its_signed_url(
    signing_hub: dict[str, str], tmp_path: Path
) -> None:
    shown, log = run(ADAPTER, signing_hub, tmp_path)
    assert "failed to load" in shown["answer"]["error"]["message"]
    assert no_signature(json.dumps(shown)), shown
    assert "adapter tenant-lora" in log
    assert no_signature(log), log


def test_the_servers_keep_the_http_clients_per_request_lines_out_of_their_logs() -> None:
    setup_logging("info")
    for name in HTTP_CLIENT_LOGGERS:
        assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
