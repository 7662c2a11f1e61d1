"""The Python share of a relayed token's CPU: how long the gateway's own code takes per streamed chunk, with the
sockets and the event loop left out.

`bench/stream_bench.py` measures the whole cost per token against vllm-router (the kernel's recv and send, the
event loop, our code). This one feeds the chunks a backend sends (the stream bench stub's, chunked) into an
upstream connection's `data_received` with a relay attached, as in a stream relayed to a client that keeps up:
httptools parses the chunk, the relay's sink times, scans and frames it, and writes it to a transport that drops
it. The difference between the two tells whether what is left is our code or the loop and the kernel.

Run: .venv/bin/python bench/relay_token_bench.py [--tokens N] [--repeats R]; prints JSON (microseconds per token,
median and range over the repeats). A profile figure of one process, not a claim against a peer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)] + [str(ROOT / layer) for layer in ("api", "core", "gateway")]

# What bench/stream_bench.py's stub sends: its stream's head, and each token's event, chunked.
from bench.stream_bench import _EVENT, _STREAM_HEAD, _chunked  # noqa: E402
from servlane_gateway.http.proxy import RelayResponse, StreamResult, Timeouts, UsageScanner  # noqa: E402
from servlane_gateway.http.upstream import UpstreamPool, UpstreamResponse, _Connection  # noqa: E402
from servlane_web.http_server import BodyWriter, HeadHoldingTransport  # noqa: E402


class _DroppingTransport:
    """Takes writes and drops them: the socket's cost is not this benchmark's."""

    written = 0

    def write(self, data: bytes) -> None:
        self.written += 1

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def is_closing(self) -> bool:
        return False

    def close(self) -> None: ...


class _Cycle:  # a response in the middle of its chunked body, its client there (what BodyWriter.ready reads)
    response_started = True
    response_complete = False
    disconnected = False
    chunked_encoding = True


class _Flow:
    write_paused = False


async def per_token_us(tokens: int) -> float:
    connection = _Connection()
    connection.connection_made(_DroppingTransport())  # type: ignore[arg-type]
    connection.data_received(_STREAM_HEAD)
    upstream = UpstreamResponse(UpstreamPool(1.0), ("stub", 1), connection)
    relay = RelayResponse(upstream, Timeouts(1.0, 10.0, 10.0), {"content-type": "text/event-stream"}, lambda _: None)
    client = _DroppingTransport()
    writer = BodyWriter(_Cycle(), _Flow(), HeadHoldingTransport(client))  # type: ignore[arg-type]
    upstream.relay_to(partial(relay._pass_on, writer, StreamResult(), UsageScanner(strip_usage=False)))
    connection.waiter = asyncio.get_running_loop().create_future()  # the relay's wait for queued chunks
    chunks = [_chunked(_EVENT % (1_733_500_000_000_000_000 + i)) for i in range(tokens)]
    started = time.perf_counter()
    for chunk in chunks:
        connection.data_received(chunk)
    elapsed = time.perf_counter() - started
    if connection.chunks or client.written != tokens:  # every chunk went straight to the client
        raise AssertionError(f"{len(connection.chunks)} chunks queued, {client.written} of {tokens} written")
    return elapsed / tokens * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    samples = [asyncio.run(per_token_us(args.tokens)) for _ in range(args.repeats)]
    print(
        json.dumps(
            {
                "what": "CPU of the gateway's Python code per relayed token (parse, relay, frame), no socket",
                "tokens": args.tokens,
                "repeats": args.repeats,
                "us_per_token": {
                    "median": round(statistics.median(samples), 3),
                    "min": round(min(samples), 3),
                    "max": round(max(samples), 3),
                },
            }
        )
    )


if __name__ == "__main__":
    main()
