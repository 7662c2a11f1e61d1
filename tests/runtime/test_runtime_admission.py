"""Admission control: bounded in-flight and queue, priorities, deadlines, disconnects free slots."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import httpx
import pytest

from servlane_core.protocol.errors import OpenAIError
from servlane_runtime.admission import AdmissionController
from tests.support.polling import wait_until
from tests.support.servers import InProcessServer, tiny_config

LONG = 2000  # tokens: far longer than any step of these tests takes


# ---- the controller itself ------------------------------------------------------------------


async def test_waiters_are_admitted_by_priority_then_arrival() -> None:
    admission = AdmissionController(max_in_flight=1, max_queue=10, queue_timeout=30)
    holder = await admission.acquire()
    order: list[str] = []

    async def wait(name: str, priority: str) -> None:
        slot = await admission.acquire(priority)  # type: ignore[arg-type]
        order.append(name)
        slot.release()

    tasks = []
    for name, priority in [("low", "low"), ("normal-1", "normal"), ("high", "high"), ("normal-2", "normal")]:
        tasks.append(asyncio.create_task(wait(name, priority)))
        await asyncio.sleep(0)  # let it enqueue: arrival order is part of the contract
    assert admission.queue_depth == 4
    holder.release()
    await asyncio.gather(*tasks)
    assert order == ["high", "normal-1", "normal-2", "low"]
    assert admission.in_flight == 0


async def test_full_queue_is_429_and_deadline_is_503() -> None:
    admission = AdmissionController(max_in_flight=1, max_queue=1, queue_timeout=0.2)
    holder = await admission.acquire()
    waiter = asyncio.create_task(admission.acquire())
    await asyncio.sleep(0)
    with pytest.raises(OpenAIError) as full:
        await admission.acquire()
    assert full.value.status == 429
    assert full.value.headers()["Retry-After"] == "1"
    with pytest.raises(OpenAIError) as late:
        await waiter
    assert late.value.status == 503
    assert late.value.code == "service_overloaded"
    assert admission.queue_depth == 0
    holder.release()
    assert admission.in_flight == 0


async def test_cancelled_waiter_leaves_the_queue() -> None:
    admission = AdmissionController(max_in_flight=1, max_queue=1, queue_timeout=30)
    holder = await admission.acquire()
    waiter = asyncio.create_task(admission.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert admission.queue_depth == 0
    holder.release()
    assert admission.in_flight == 0


# ---- through HTTP ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_slot_server(tiny_llama_dir: Path) -> Iterator[InProcessServer]:
    config = tiny_config(tiny_llama_dir, max_in_flight=1, max_queue=3, queue_timeout_seconds=60)
    with InProcessServer(config) as server:
        server.wait_ready()
        yield server


@contextmanager
def holding_the_slot(server: InProcessServer) -> Iterator[None]:
    """A long streaming request that is generating (first token received) until the block ends."""
    body = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": LONG, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.v1 + "/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        # Keep the iterator referenced: dropping it would close the connection at once.
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data: {"):
                break
        yield
    # leaving the `with` closes the connection: the client is gone


def in_flight_and_queued(server: InProcessServer) -> tuple[float, float]:
    return server.metric("servlane_runtime_in_flight"), server.metric("servlane_runtime_queue_depth")


def queued_is(server: InProcessServer, depth: int) -> bool:
    return in_flight_and_queued(server)[1] == depth


def short_request(server: InProcessServer, priority: str = "normal", max_tokens: int = 2) -> httpx.Response:
    body = {"model": "tiny-llama", "prompt": "Hi", "max_tokens": max_tokens, "ignore_eos": True}
    return httpx.post(server.v1 + "/completions", json=body, headers={"X-Priority": priority}, timeout=120)


def test_full_queue_429_then_disconnect_frees_the_slot(one_slot_server: InProcessServer) -> None:
    server = one_slot_server
    generated_before = server.metric("servlane_runtime_tokens_total", 'kind="completion"')
    with ThreadPoolExecutor(4) as pool:
        with holding_the_slot(server):
            assert in_flight_and_queued(server) == (1, 0)
            queued = [pool.submit(short_request, server) for _ in range(3)]
            wait_until("three queued requests", lambda: in_flight_and_queued(server) == (1, 3), 30)
            rejected = short_request(server)
            assert rejected.status_code == 429
            assert int(rejected.headers["Retry-After"]) >= 1
            assert rejected.json()["error"]["code"] == "service_overloaded"
        # The holder hung up: its slot passes on and the queue drains.
        assert [f.result(timeout=60).status_code for f in queued] == [200, 200, 200]
    wait_until("an idle server", lambda: in_flight_and_queued(server) == (0, 0), 30)
    generated = server.metric("servlane_runtime_tokens_total", 'kind="completion"') - generated_before
    assert generated < LONG, "the abandoned stream should have stopped generating"


def test_a_client_that_leaves_before_its_answer_stops_the_generation(one_slot_server: InProcessServer) -> None:
    """A non-streamed request whose client hangs up while it generates: cancelled at the disconnect (a 499
    in the server's count, its tokens so far), not generated to its end (a 200)."""
    server = one_slot_server

    def left() -> float:
        return server.metric("servlane_runtime_requests_total", 'endpoint="/v1/completions",code="499"')

    left_before = left()
    generated_before = server.metric("servlane_runtime_tokens_total", 'kind="completion"')
    body = json.dumps({"model": "tiny-llama", "prompt": "Hello", "max_tokens": LONG, "ignore_eos": True}).encode()
    head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(body)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as conn:
        conn.sendall(head.encode() + body)
        wait_until("the request generating", lambda: in_flight_and_queued(server) == (1, 0), 30)
    # The connection is closed: the client is gone before its answer.
    wait_until("the abandoned request counted as 499", lambda: left() == left_before + 1, 30)
    wait_until("an idle server", lambda: in_flight_and_queued(server) == (0, 0), 30)
    generated = server.metric("servlane_runtime_tokens_total", 'kind="completion"') - generated_before
    assert generated < LONG, "the abandoned request should have stopped generating"
    assert short_request(server).status_code == 200


def test_high_priority_goes_first(one_slot_server: InProcessServer) -> None:
    server = one_slot_server
    finished: list[str] = []
    lock = threading.Lock()

    def run(priority: str) -> int:
        response = short_request(server, priority, max_tokens=40)
        with lock:
            finished.append(priority)
        return response.status_code

    with ThreadPoolExecutor(3) as pool:
        futures: list[Future[int]] = []
        with holding_the_slot(server):
            for depth, priority in enumerate(["low", "normal", "high"], start=1):
                futures.append(pool.submit(run, priority))
                wait_until(f"{depth} queued", partial(queued_is, server, depth), 30)
        assert [f.result(timeout=60) for f in futures] == [200, 200, 200]
    assert finished == ["high", "normal", "low"]


def test_queue_deadline_is_503(tiny_llama_dir: Path) -> None:
    config = tiny_config(tiny_llama_dir, max_in_flight=1, max_queue=2, queue_timeout_seconds=0.5)
    with InProcessServer(config) as server:
        server.wait_ready()
        with holding_the_slot(server):
            start = time.monotonic()
            response = short_request(server)
            waited = time.monotonic() - start
        assert response.status_code == 503
        assert response.headers["Retry-After"] == "1"
        assert response.json()["error"]["code"] == "service_overloaded"
        assert waited >= 0.5
