"""A minimal, deterministic OpenAI-speaking upstream for the gateway's tests and benchmark.

It answers with its own name as the content, so a test sees which backend answered, and records each
body it received. Words in the last message (or the prompt) steer it:
  status=500   answer with that HTTP status       delay=0.5  wait before answering (seconds)
  chunks=3     stream that many content chunks     gap=0.01   wait between chunks
  cut=2        abort the connection after 2 chunks hold      after the first chunk (a stream) or before
                                                                answering (otherwise), wait for `released`
  partial=mid  with cut=: send half of the next event first (partial=line: its data line, not its blank one)
  retry_after=7  with status=: send that Retry-After header (the runtime's 429/503 overload answers)
  linger=1      stream: end the body that long after `data: [DONE]`
It records each request's headers too (lower-case names), e.g. to see what the gateway forwards.
Run alone: `python tests/support/gateway_upstream.py --port 9000 --name v1` (used by the benchmark).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.responses import Response


@dataclass
class UpstreamState:
    name: str
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    streams_completed: int = 0
    streams_disconnected: int = 0
    abandoned: int = 0  # non-streamed requests whose caller left during `delay`
    released: threading.Event = field(default_factory=threading.Event)


class CutStream(Exception):
    """Raised mid-stream: uvicorn then drops the connection without ending the chunked body."""


def directives(body: dict[str, Any]) -> dict[str, str]:
    if isinstance(body.get("messages"), list) and body["messages"]:
        text = str(body["messages"][-1].get("content", ""))
    else:
        text = str(body.get("prompt", body.get("input", "")))
    found: dict[str, str] = {}
    for word in text.split():
        key, _, value = word.partition("=")
        found[key] = value
    return found


def _usage(body: dict[str, Any], completion: int) -> dict[str, int]:
    prompt = len(json.dumps(body.get("messages", body.get("prompt", body.get("input", "")))).split())
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def create_upstream(name: str) -> tuple[FastAPI, UpstreamState]:
    app = FastAPI()
    state = UpstreamState(name)

    async def stream(body: dict[str, Any], steer: dict[str, str], chat: bool) -> AsyncIterator[bytes]:
        chunks, gap = int(steer.get("chunks", "3")), float(steer.get("gap", "0"))
        cut = int(steer["cut"]) if "cut" in steer else None
        done = False
        try:
            for i in range(chunks):
                if cut is not None and i == cut:
                    line = b'data: {"id": "x", "object": "chat.completion.chunk", "choices": []}\n'
                    if steer.get("partial") == "mid":
                        yield line[: len(line) // 2]
                    elif steer.get("partial") == "line":
                        yield line
                    raise CutStream(f"cut after {cut} chunks")
                if steer.get("fail") == str(i):  # an error event inside the 200 stream, as vLLM sends one
                    error = {"error": {"message": "engine failed", "type": "server_error", "code": 500}}
                    yield b"data: " + json.dumps(error).encode() + b"\n\n"
                    break
                finish = "stop" if i == chunks - 1 else None  # the last chunk says why it ended, as the runtime's
                if chat:
                    choice: dict[str, Any] = {"index": 0, "delta": {"content": f"{name} "}, "finish_reason": finish}
                else:
                    choice = {"index": 0, "text": f"{name} ", "finish_reason": finish}
                kind = "chat.completion.chunk" if chat else "text_completion"
                event = {"id": "x", "object": kind, "created": 0, "model": body["model"], "choices": [choice]}
                yield b"data: " + json.dumps(event).encode() + b"\n\n"
                if i == 0 and "hold" in steer:
                    await asyncio.to_thread(state.released.wait, 10)
                if gap:
                    await asyncio.sleep(gap)
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": body["model"]}
                usage |= {"choices": [], "usage": _usage(body, chunks)}
                yield b"data: " + json.dumps(usage).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
            if "linger" in steer:  # the body's end comes later than its last event
                await asyncio.sleep(float(steer["linger"]))
            done = True
        finally:
            if done:
                state.streams_completed += 1
            elif cut is None:
                state.streams_disconnected += 1

    async def answer(request: Request, kind: str) -> Response:
        body = await request.json()
        state.bodies.append(body)
        state.headers.append({name.lower(): value for name, value in request.headers.items()})
        steer = directives(body)
        if "delay" in steer:
            deadline = time.monotonic() + float(steer["delay"])
            while time.monotonic() < deadline:  # a slow backend that notices when its caller leaves
                if await request.is_disconnected():
                    state.abandoned += 1
                    return Response(status_code=499)
                await asyncio.sleep(0.01)
        if "hold" in steer and not body.get("stream"):
            await asyncio.to_thread(state.released.wait, 30)  # bounded: a test that forgot to release still ends
        if "status" in steer:
            error = {"message": f"{name} failed on purpose", "type": "server_error", "param": None, "code": None}
            retry = {"Retry-After": steer["retry_after"]} if "retry_after" in steer else None
            return JSONResponse({"error": error}, status_code=int(steer["status"]), headers=retry)
        if body.get("stream"):
            return StreamingResponse(stream(body, steer, kind == "chat"), media_type="text/event-stream")
        if kind == "embeddings":
            inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
            data = [{"object": "embedding", "index": i, "embedding": [0.5, float(i)]} for i in range(len(inputs))]
            usage = _usage(body, 0)
            return JSONResponse({"object": "list", "data": data, "model": body["model"], "usage": usage})
        if kind == "chat":
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": name}}
        else:
            choice = {"index": 0, "text": name}
        choice["finish_reason"] = "stop"
        obj = "chat.completion" if kind == "chat" else "text_completion"
        response = {"id": "x", "object": obj, "created": int(time.time()), "model": body["model"]}
        return JSONResponse(response | {"choices": [choice], "usage": _usage(body, 1)})

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await answer(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await answer(request, "completions")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        return await answer(request, "embeddings")

    return app, state


if __name__ == "__main__":
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="upstream")
    args = parser.parse_args()
    upstream_app, _ = create_upstream(args.name)
    uvicorn.run(upstream_app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
