"""Whatever a batch's lines hold, the batch ends and accounts for every line: a property-based fuzz of input files
(JSON values of any shape where a request line is expected, wrong methods, URLs and models, text that is not JSON)
through the `openai` SDK against an in-process gateway (SQLite). A file is refused with a 4xx or its batch ends
completed or failed, never stuck, never a 5xx, and a completed batch's counts are its output and error files'
lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from tests.support.batch import CHAT, finished, gateway, jsonl_of, submit
from tests.support.gateway_harness import StartGateway, Upstream

EXAMPLES = 60  # about 5 s here; bench-sized runs of 400 found nothing more

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
bodies = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["chat", "other", "missing", 5]),
        "messages": st.one_of(st.just([{"role": "user", "content": "hi"}]), json_values),
    },
    optional={"max_tokens": json_values, "n": st.integers(-3, 5), "stream": st.booleans(), "temperature": json_values},
)
request_lines = st.fixed_dictionaries(
    {
        "custom_id": st.one_of(st.text(max_size=20), json_values),
        "method": st.sampled_from(["POST", "GET", 1]),
        "url": st.sampled_from([CHAT, "/v1/completions", "/v1/embeddings", "/v1/other", None]),
        "body": st.one_of(bodies, json_values),
    }
)
lines = st.one_of(request_lines.map(json.dumps), json_values.map(json.dumps), st.text(max_size=40))


def test_any_input_file_is_refused_or_ends_its_batch_with_every_line_accounted_for(
    upstreams: dict[str, Upstream], start_gateway: StartGateway, tmp_path: Path
) -> None:
    gw = gateway(start_gateway, upstreams, tmp_path)
    client = gw.client("sk-alpha-00000000000000000000000")
    problems: list[Any] = []

    @seed(33)
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(drawn=st.lists(lines, min_size=1, max_size=6))
    def one(drawn: list[str]) -> None:
        content = [line.replace("\n", " ") for line in drawn]  # one line each
        try:
            batch = submit(client, content)
        except openai.APIStatusError as exc:
            if exc.status_code >= 500:
                problems.append(("refused with a 5xx", exc.status_code, exc.message, content))
            return
        done = finished(client, batch.id, timeout=60)
        if done.status not in ("completed", "failed"):
            problems.append(("ended", done.status, content))
        if done.status == "completed":
            counts = done.request_counts
            assert counts is not None
            output = len(jsonl_of(client, done.output_file_id)) if done.output_file_id else 0
            errors = len(jsonl_of(client, done.error_file_id)) if done.error_file_id else 0
            if (counts.total, counts.completed, counts.failed) != (output + errors, output, errors):
                problems.append(("counts", counts, output, errors, content))

    one()
    assert problems == [], json.dumps(problems[:5], indent=1, default=str)[:5000]
