"""bench/relay_token_bench.py measures the relay the gateway runs: it fails (AssertionError) unless every chunk went
from the upstream connection's callback straight to the client, so a change of the relay that queues chunks, or
of the internals the bench drives, shows here rather than as a figure measuring something else."""

import asyncio

from bench.relay_token_bench import per_token_us


def test_every_chunk_goes_straight_to_the_client() -> None:
    assert asyncio.run(per_token_us(500)) > 0.0
