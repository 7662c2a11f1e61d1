"""Nothing lost, nothing twice: a gateway (a real process) killed with SIGKILL in the middle of a batch of
1,000 requests, started again on the same database, completes it with exactly one result per custom_id,
and the bad lines in the error file. Against PostgreSQL and SQLite."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Literal

import httpx
import openai
import pytest

from tests.support.batch_databases import Postgres
from tests.support.gateway_harness import Upstream, aifeature, aimodel
from tests.support.polling import wait_until
from tests.support.ports import free_port

KEYS = "team-a: sk-alpha-00000000000000000000000\n"
CHAT: Literal["/v1/chat/completions"] = "/v1/chat/completions"
TOTAL = 1000
# Requests from this one on are held at the backend until the test releases them, so the first gateway is
# killed mid-batch however fast it runs (it once finished 999 of 1,000 before the test saw a tenth done).
HELD_FROM = 200
BAD = ["not json", json.dumps({"custom_id": "u", "method": "POST", "url": "/v1/embeddings", "body": {"model": "chat"}})]
BAD += [json.dumps({"method": "POST", "url": CHAT, "body": {"model": "chat"}})]


class GatewayProcess:
    """`python -m servlane_gateway` with the Batch API on `database_url`; SIGKILL-able."""

    def __init__(self, tmp_path: Path, upstream: Upstream, database_url: str) -> None:
        routes, keys = tmp_path / "routes.json", tmp_path / "keys"
        routes.write_text(json.dumps([aimodel("chat-v1", upstream.url), aifeature("chat", [("chat-v1", 100)])]))
        keys.write_text(KEYS)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "servlane_gateway", "--routes-file", str(routes), "--keys-file", str(keys)]
        argv += ["--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"]
        argv += ["--metrics-port", str(free_port())]  # not the default: other gateways may run beside it
        argv += ["--batch-lease-seconds", "2", "--batch-poll-seconds", "0.1", "--batch-concurrency-per-feature", "16"]
        env = os.environ | {"SERVLANE_GATEWAY_BATCH_DATABASE_URL": database_url}  # as the chart passes it
        self.process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_until("the gateway to be ready", self._ready, 60, tolerate=lambda e: isinstance(e, httpx.HTTPError))

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            stderr = self.process.stderr.read().decode() if self.process.stderr else ""
            raise AssertionError(f"the gateway exited: {stderr}")
        return httpx.get(self.url + "/ready", timeout=2).status_code == 200

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.url}/v1", api_key="sk-alpha-00000000000000000000000", max_retries=0, timeout=20
        )

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        if self.process.stderr is not None:
            self.process.stderr.close()


@pytest.fixture(params=["postgresql", "sqlite"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'batch.db'}"
    server: Postgres = request.getfixturevalue("postgres")
    return server.new_database(f"restart_{request.node.name[-12:-1].replace('-', '_')}_{os.getpid()}")


def completed(client: openai.OpenAI, batch_id: str) -> int:
    counts = client.batches.retrieve(batch_id).request_counts
    return counts.completed if counts is not None else 0


def held(i: int) -> str:
    return " hold" if i >= HELD_FROM else ""


def test_a_gateway_killed_mid_batch_finishes_it_after_a_restart_with_one_result_per_request(
    upstreams: dict[str, Upstream], tmp_path: Path, database_url: str
) -> None:
    upstream = upstreams["v1"]
    upstream.state.released.clear()
    tag = tmp_path.name  # this run's requests, among everything the shared stub has seen
    lines = [
        json.dumps(
            {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": CHAT,
                "body": {"model": "chat", "messages": [{"role": "user", "content": f"{tag} {i}{held(i)}"}]},
            }
        )
        for i in range(TOTAL)
    ]
    lines[10:10] = BAD[:1]
    lines[500:500] = BAD[1:]
    first = GatewayProcess(tmp_path, upstream, database_url)
    try:
        client = first.client()
        upload = client.files.create(file=("in.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
        at_kill = wait_until(
            "the batch to be partly done",
            lambda: (n := completed(client, batch.id)) >= TOTAL // 10 and n,
            60,
            interval=0.05,
        )
        first.kill()
    finally:
        first.kill()
        upstream.state.released.set()  # what the killed gateway left at the backend ends; nothing is held after
    assert at_kill <= HELD_FROM, f"{at_kill} done before the kill, though requests from {HELD_FROM} on were held"

    second = GatewayProcess(tmp_path, upstream, database_url)
    try:
        client = second.client()

        def ended() -> openai.types.Batch | None:
            found = client.batches.retrieve(batch.id)
            return found if found.status in ("completed", "failed", "expired") else None

        done = wait_until("the batch to complete", ended, 90, interval=0.2)
        assert done.status == "completed", done
        assert done.request_counts is not None
        assert (done.request_counts.total, done.request_counts.completed) == (TOTAL + len(BAD), TOTAL)
        assert done.request_counts.failed == len(BAD)
        assert done.output_file_id is not None
        assert done.error_file_id is not None
        output = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
        ids = Counter(o["custom_id"] for o in output)
        assert len(output) == TOTAL
        assert set(ids) == {f"req-{i}" for i in range(TOTAL)}
        assert max(ids.values()) == 1
        for o in output:  # each result is the answer to its own request
            assert o["response"]["status_code"] == 200
        errors = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
        codes = sorted((e["custom_id"] or "", e["error"]["code"]) for e in errors)
        assert codes == [("", "invalid_json_line"), ("", "missing_required_parameter"), ("u", "invalid_url")]
        sent = Counter(
            body["messages"][-1]["content"]
            for body in list(upstream.state.bodies)
            if str(body.get("messages", [{}])[-1].get("content", "")).startswith(tag + " ")
        )
        assert len(sent) == TOTAL  # every request reached the backend, those cut off by the kill maybe twice
    finally:
        second.kill()
