"""A small HTTP/1.1 load generator for the router benchmarks, run as its own process (asyncio on uvloop).

Used where `wrk` is not installed, and for the streaming benchmark (wrk cannot time single SSE events).
It writes pre-built requests on raw keep-alive connections and parses just enough of the answers
(status, Content-Length or chunked framing, SSE events), so one process drives thousands of requests or
streams per second without an HTTP client library's per-request cost. Two modes:

- `closed`: `--connections` connections, each sending the next request as soon as the previous answer has
  ended (like wrk), for `--seconds`; prints JSON with wrk's fields (p50/p99 ms, requests/s, non-2xx, socket
  errors, requests) plus status counts, body bytes and SSE data events received; with `--timeline`, every
  request's send time and latency to a file (bench/route_rebuild_bench.py lines them up with its changes).
- `streams`: `--streams` streaming requests at once (each on its own connection, started at random offsets
  within `--ramp-seconds`); every SSE event carrying the stub's send stamp (`t=<monotonic ns>` in its text)
  is timed on arrival. Writes the per-token gaps minus `--spacing-ms` and the stamp-to-arrival delays (ms,
  float32) to `--samples`, and prints JSON with counts. CLOCK_MONOTONIC is one clock for every process of
  the machine, so the stub's stamp and this process's arrival time are comparable.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import itertools
import json
import random
import re
import statistics
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

STAMP = re.compile(rb"t=(\d+)")


def build_request(url: str, body: bytes, api_key: str) -> tuple[str, int, bytes]:
    parts = urlsplit(url)
    head = (
        f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\n"
        f"Content-Type: application/json\r\nAuthorization: Bearer {api_key}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return parts.hostname or "127.0.0.1", parts.port or 80, head.encode() + body


async def read_response(reader: asyncio.StreamReader, on_data: Any = None) -> tuple[int, bytes, bool]:
    """One response: (status, body, keep-alive). `on_data(bytes)` sees each piece of the body as it arrives."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    keep_alive = b"connection: close" not in lower
    pieces: list[bytes] = []
    found = re.search(rb"content-length:\s*(\d+)", lower)
    if found:
        piece = await reader.readexactly(int(found.group(1)))
        pieces.append(piece)
        if on_data:
            on_data(piece)
    elif b"transfer-encoding: chunked" in lower:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            piece = (await reader.readexactly(size + 2))[:-2]
            if size == 0:  # the last chunk (no trailers expected)
                break
            pieces.append(piece)
            if on_data:
                on_data(piece)
    else:  # no framing: the body ends with the connection
        while piece := await reader.read(65536):
            pieces.append(piece)
            if on_data:
                on_data(piece)
        keep_alive = False
    return status, b"".join(pieces), keep_alive


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def closed_loop(
    url: str, body: bytes, api_key: str, connections: int, seconds: float, timeline: array.array[float] | None = None
) -> dict[str, Any]:
    """`timeline`, when given, gets each counted request's send time (CLOCK_MONOTONIC seconds, the clock every
    process of the machine shares) and latency (ms), in pairs."""
    host, port, request = build_request(url, body, api_key)
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    totals = {"body_bytes": 0, "events": 0, "socket_errors": 0, "timeouts": 0}
    start = time.perf_counter()
    deadline = start + seconds

    async def client() -> None:
        reader: asyncio.StreamReader | None = None
        writer: asyncio.StreamWriter | None = None
        while time.perf_counter() < deadline:
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection(host, port)
                assert reader is not None
                sent = time.perf_counter()
                writer.write(request)
                status, answer, keep_alive = await asyncio.wait_for(read_response(reader), 10)
            except TimeoutError:
                totals["timeouts"] += 1
                writer = None
                continue
            except (OSError, asyncio.IncompleteReadError, ValueError):
                totals["socket_errors"] += 1
                writer = None
                await asyncio.sleep(0.01)
                continue
            done = time.perf_counter()
            if done > deadline:  # like wrk: an answer that ends after the run is not counted
                break
            latencies.append((done - sent) * 1000)
            if timeline is not None:
                timeline.extend((sent, (done - sent) * 1000))
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            totals["body_bytes"] += len(answer)
            totals["events"] += answer.count(b"data: ")
            if not keep_alive:
                writer.close()
                writer = None
        if writer is not None:
            writer.close()

    tasks = [asyncio.create_task(client()) for _ in range(connections)]
    await asyncio.wait(tasks, timeout=seconds + 1)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    result: dict[str, Any] = {
        "rps": len(latencies) / seconds,
        "requests": float(len(latencies)),
        "non_2xx": float(sum(n for s, n in statuses.items() if not s.startswith("2"))),
        "socket_errors": float(totals["socket_errors"] + totals["timeouts"]),
        "statuses": statuses,
        "body_bytes": totals["body_bytes"],
        "events": totals["events"],
    }
    if latencies:
        result |= {"p50_ms": _percentile(latencies, 0.50), "p99_ms": _percentile(latencies, 0.99)}
    return result


async def streams(
    url: str, body: bytes, api_key: str, count: int, spacing_ms: float, ramp: float
) -> tuple[dict[str, Any], array.array[float], array.array[float]]:
    host, port, request = build_request(url, body, api_key)
    gaps = array.array("f")
    delays = array.array("f")
    outcome = {"completed": 0, "errors": 0, "non_200": 0, "tokens": 0, "short": 0}
    first_token_ms: list[float] = []

    async def one(offset: float, expected: int) -> None:
        await asyncio.sleep(offset)
        arrivals: list[int] = []
        pending = b""

        def on_data(piece: bytes) -> None:
            nonlocal pending
            now = time.monotonic_ns()
            pending += piece
            *events, pending = pending.split(b"\n\n")
            for event in events:
                stamp = STAMP.search(event)
                if stamp:
                    arrivals.append(now)
                    delays.append((now - int(stamp.group(1))) / 1e6)

        sent = time.monotonic_ns()
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(request)
            status, _, _ = await asyncio.wait_for(read_response(reader, on_data), 120)
            writer.close()
        except (OSError, asyncio.IncompleteReadError, ValueError, TimeoutError):
            outcome["errors"] += 1
            return
        if status != 200:
            outcome["non_200"] += 1
            return
        outcome["completed"] += 1
        outcome["tokens"] += len(arrivals)
        outcome["short"] += len(arrivals) < expected
        if arrivals:
            first_token_ms.append((arrivals[0] - sent) / 1e6)
        for before, after in itertools.pairwise(arrivals):
            gaps.append((after - before) / 1e6 - spacing_ms)

    expected = int(json.loads(body).get("max_tokens", 0))
    cpu = time.process_time()
    start = time.perf_counter()
    await asyncio.gather(*(one(random.uniform(0, ramp), expected) for _ in range(count)))
    summary: dict[str, Any] = outcome | {
        "wall_s": time.perf_counter() - start,
        "cpu_s": time.process_time() - cpu,
        "first_token_p50_ms": statistics.median(first_token_ms) if first_token_ms else None,
    }
    return summary, gaps, delays


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["closed", "streams"])
    parser.add_argument("--url", required=True, help="the full URL to POST to")
    parser.add_argument("--body", required=True, help="the JSON request body")
    parser.add_argument("--api-key", default="unused")
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--spacing-ms", type=float, default=20)
    parser.add_argument("--ramp-seconds", type=float, default=1)
    parser.add_argument("--samples", type=Path, help="streams: where to write gaps and delays (float32)")
    parser.add_argument("--timeline", type=Path, help="closed: where to write (send time, latency ms) pairs (float64)")
    args = parser.parse_args()
    import uvloop

    body = args.body.encode()
    if args.mode == "closed":
        cpu = time.process_time()
        timeline = array.array("d") if args.timeline else None
        result = uvloop.run(closed_loop(args.url, body, args.api_key, args.connections, args.seconds, timeline))
        if args.timeline and timeline is not None:
            with args.timeline.open("wb") as out:
                timeline.tofile(out)
        print(json.dumps(result | {"loadgen_cpu_s": time.process_time() - cpu}))
        return
    summary, gaps, delays = uvloop.run(
        streams(args.url, body, args.api_key, args.streams, args.spacing_ms, args.ramp_seconds)
    )
    if args.samples:
        with args.samples.open("wb") as out:
            array.array("q", [len(gaps), len(delays)]).tofile(out)
            gaps.tofile(out)
            delays.tofile(out)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
