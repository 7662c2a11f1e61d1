"""The Batch API through a gateway in this process: a request line, a batch submitted and waited for, its JSONL."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Literal

import openai

from tests.support.gateway_harness import Gateway, StartGateway, Upstream, aifeature, aimodel
from tests.support.polling import wait_until

KEYS = (
    "team-a: sk-alpha-00000000000000000000000\n"
    "team-b: sk-bravo-00000000000000000000000\n"
    "narrow: sk-narrow-0000000000000000000000 default/chat\n"
)
CHAT: Literal["/v1/chat/completions"] = "/v1/chat/completions"


def objects(upstreams: dict[str, Upstream]) -> list[dict[str, Any]]:
    return [
        aimodel("chat-v1", upstreams["v1"].url),
        aifeature("chat", [("chat-v1", 100)]),
        aimodel("other-v2", upstreams["v2"].url),
        aifeature("other", [("other-v2", 100)]),
    ]


def request_line(custom_id: str, text: str = "hi", model: str = "chat") -> str:
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body})


def gateway(start: StartGateway, upstreams: dict[str, Upstream], tmp_path: Path, **settings: Any) -> Gateway:
    settings.setdefault("batch_database_url", f"sqlite:///{tmp_path / 'batch.db'}")
    return start(objects(upstreams), keys=KEYS, batch_poll_seconds=0.05, **settings)


def submit(client: openai.OpenAI, lines: list[str]) -> openai.types.Batch:
    upload = client.files.create(file=("in.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch")
    return client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")


def finished(client: openai.OpenAI, batch_id: str, timeout: float = 30) -> openai.types.Batch:
    def ended() -> openai.types.Batch | None:
        batch = client.batches.retrieve(batch_id)
        return batch if batch.status in ("completed", "failed", "cancelled", "expired") else None

    return wait_until(f"batch {batch_id} to end", ended, timeout)


def jsonl_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]
