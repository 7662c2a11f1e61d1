"""The gateway in front of real runtime processes (`python -m servlane_runtime`, tiny Llama, transformers
engine), called with the official openai client: split, stickiness, streaming, errors, dead backends, live
route changes. Three runtimes start once for the module, side by side; the dead-backend test kills the third.
"""

from __future__ import annotations

import math
import os
import signal
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.gateway_harness import Gateway, StartGateway, aifeature, aimodel, picked, route_in
from tests.support.polling import wait_until

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing downloads weights at test time

from servlane_api import metric_names as m
from servlane_api.runtime_config import RuntimeConfig
from tests.support import models as shared_models
from tests.support.servers import SubprocessServer

pytestmark = pytest.mark.slow
tiny_llama_dir = shared_models.tiny_llama_dir

HI: Any = [{"role": "user", "content": "Hello! How are you today?"}]
KEYS = "team-a: sk-alpha-00000000000000000000000\nteam-b: sk-bravo-00000000000000000000000 default/split\n"


class Runtime(SubprocessServer):
    """A runtime process that a test can kill outright (SIGKILL: no graceful shutdown, sockets just close)."""

    def kill(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGKILL)
        self._proc.wait(10)

    def in_flight(self) -> float:
        return self.metric("servlane_runtime_in_flight")


def runtime_config(model_dir: Path, served: str) -> RuntimeConfig:
    return RuntimeConfig(
        model_source=str(model_dir),
        served_model_name=served,
        engine="transformers",
        max_in_flight=4,
        max_queue=16,
        queue_timeout_seconds=30,
    )


@pytest.fixture(scope="module")
def runtimes(tiny_llama_dir: Path) -> Iterator[dict[str, Runtime]]:
    """Runtimes a and b for every test, and `doomed` for the one that kills it; started side by side."""
    names = ("a", "b", "doomed")
    servers = {name: Runtime(runtime_config(tiny_llama_dir, f"tiny-{name}")) for name in names}
    started: list[Runtime] = []

    def start(server: Runtime) -> None:
        server.__enter__()
        started.append(server)
        server.wait_ready()

    try:
        with ThreadPoolExecutor(max_workers=len(servers)) as pool:
            list(pool.map(start, servers.values()))
        yield servers
    finally:
        for server in started:
            server.__exit__(None, None, None)


def objects_for(runtimes: dict[str, Runtime], *features: dict[str, Any]) -> list[dict[str, Any]]:
    models = [aimodel(f"model-{n}", runtimes[n].v1, served=f"tiny-{n}") for n in ("a", "b")]
    return [*models, *features]


def answered_by(response: Any) -> str:
    """Which runtime answered: each reports its own served name as the response's `model`."""
    return str(response.model)


def test_weighted_split_holds_over_many_requests(runtimes: dict[str, Runtime], start_gateway: StartGateway) -> None:
    gw = start_gateway(objects_for(runtimes, aifeature("split", [("model-a", 80), ("model-b", 20)])))
    client = gw.client(timeout=60)
    total = 200

    def one(_: int) -> str:
        answer = client.chat.completions.create(model="split", messages=HI, max_tokens=1)
        return answered_by(answer)

    with ThreadPoolExecutor(max_workers=8) as pool:
        tally = Counter(pool.map(one, range(total)))
    assert set(tally) <= {"tiny-a", "tiny-b"}
    # Random picks by weight: a binomial count; 4.5 standard deviations (a false failure ~1 in 150 000).
    spread = 4.5 * math.sqrt(total * 0.8 * 0.2)
    assert abs(tally["tiny-a"] - total * 0.8) <= spread, tally
    assert gw.sample(m.REQUESTS, feature="split", model="model-a", code="200") == tally["tiny-a"]
    assert gw.sample(m.REQUESTS, feature="split", model="model-b", code="200") == tally["tiny-b"]
    assert gw.sample(m.WEIGHT, feature="split", model="model-a") == 80


def test_request_ids_stick_to_one_version(runtimes: dict[str, Runtime], start_gateway: StartGateway) -> None:
    gw = start_gateway(objects_for(runtimes, aifeature("split", [("model-a", 50), ("model-b", 50)])))
    client = gw.client(timeout=60)
    route = route_in(gw.state.table, "split")
    seen: dict[str, set[str]] = {}
    for i in range(12):
        rid = f"conversation-{i}"
        for _ in range(3):
            answer = client.chat.completions.create(
                model="split", messages=HI, max_tokens=1, extra_headers={"X-Request-ID": rid}
            )
            seen.setdefault(rid, set()).add(answered_by(answer))
    assert all(len(versions) == 1 for versions in seen.values()), seen
    assert {rid: versions.pop() for rid, versions in seen.items()} == {
        rid: "tiny-a" if picked(route, rid) == "model-a" else "tiny-b" for rid in seen
    }
    assert {picked(route, rid) for rid in seen} == {"model-a", "model-b"}  # the ids cover both versions


def test_stream_first_chunk_arrives_while_the_runtime_still_generates(
    runtimes: dict[str, Runtime], start_gateway: StartGateway
) -> None:
    gw = start_gateway(objects_for(runtimes, aifeature("only-a", [("model-a", 100)])))
    runtime = runtimes["a"]
    wait_until("runtime a to be idle", lambda: runtime.in_flight() == 0, 30)
    stream = gw.client(timeout=60).chat.completions.create(
        model="only-a", messages=HI, max_tokens=400, stream=True, extra_body={"ignore_eos": True},
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = iter(stream)
    first = next(chunks)
    assert first.model == "tiny-a"
    # The gateway relayed a chunk while the runtime is still generating the 400 tokens: nothing is buffered.
    assert runtime.in_flight() == 1
    rest = list(chunks)
    usage = [c.usage for c in rest if c.usage is not None]
    assert [u.completion_tokens for u in usage] == [400]
    assert sum(1 for c in [first, *rest] if c.choices and c.choices[0].delta.content) > 1
    wait_until("the runtime to finish", lambda: runtime.in_flight() == 0, 30)
    assert gw.sample(m.TOKENS, feature="only-a", model="model-a", kind="completion") == 400


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_stream_without_include_usage_is_charged_and_shows_no_usage_chunk(
    runtimes: dict[str, Runtime], start_gateway: StartGateway, endpoint: str
) -> None:
    gw = start_gateway(objects_for(runtimes, aifeature("only-a", [("model-a", 100)])), feature_tokens_per_minute=10**6)
    client = gw.client(timeout=60)
    extra = {"ignore_eos": True}
    if endpoint == "chat":
        chunks: list[Any] = list(
            client.chat.completions.create(model="only-a", messages=HI, max_tokens=5, stream=True, extra_body=extra)
        )
    else:
        chunks = list(
            client.completions.create(model="only-a", prompt="Hello", max_tokens=5, stream=True, extra_body=extra)
        )
    # The gateway asked the runtime for its usage chunk (choices: []) and cut it out: the client did not ask.
    assert all(c.choices and c.usage is None for c in chunks)
    wait_until(
        "the stream's tokens counted",
        lambda: gw.sample(m.TOKENS, feature="only-a", model="model-a", kind="completion") == 5,
        30,
    )
    assert gw.sample(m.TOKENS, feature="only-a", model="model-a", kind="prompt") > 0


def kept_at_least(gw: Gateway, count: int) -> bool:
    return gw.sample("servlane_gateway_response_cache_stores_total", feature="cached") >= count


def test_deterministic_answers_are_replayed_from_the_response_cache(
    runtimes: dict[str, Runtime], start_gateway: StartGateway
) -> None:
    """The runtime's real answers (a stream's last chunk says why it finished) are kept and replayed."""
    feature = aifeature("cached", [("model-a", 100)])
    feature["spec"]["responseCache"] = {"enabled": True}
    gw = start_gateway(objects_for(runtimes, feature))
    body = {"model": "cached", "messages": HI, "max_tokens": 8, "temperature": 0}
    for kept, stream in enumerate((False, True), start=1):
        first = httpx.post(gw.url + "/v1/chat/completions", json={**body, "stream": stream}, timeout=60)
        assert first.status_code == 200, first.text
        assert first.headers["x-servlane-cache"] == "miss"
        wait_until("the answer kept", partial(kept_at_least, gw, kept), 10)
        again = httpx.post(gw.url + "/v1/chat/completions", json={**body, "stream": stream}, timeout=60)
        assert again.headers["x-servlane-cache"] == "hit"
        assert again.content == first.content
    assert gw.sample(m.REQUESTS, feature="cached", model="model-a", code="200") == 2


def test_client_errors_never_reach_the_runtimes(runtimes: dict[str, Runtime], start_gateway: StartGateway) -> None:
    features = [aifeature("split", [("model-a", 50), ("model-b", 50)]), aifeature("other", [("model-b", 100)])]
    gw = start_gateway(objects_for(runtimes, *features), keys=KEYS, max_body_bytes=4096)
    before = sum(r.metric("servlane_runtime_requests_total") for r in runtimes.values())
    with pytest.raises(openai.NotFoundError) as not_found:
        gw.client("sk-alpha-00000000000000000000000").chat.completions.create(
            model="no-such-model", messages=HI, max_tokens=1
        )
    assert not_found.value.code == "model_not_found"
    with pytest.raises(openai.AuthenticationError) as unauthenticated:
        gw.client("sk-wrong-00000000000000000000000").chat.completions.create(model="split", messages=HI, max_tokens=1)
    assert unauthenticated.value.code == "invalid_api_key"
    with pytest.raises(openai.NotFoundError) as forbidden:  # out of the key's scope: as if it did not exist
        gw.client("sk-bravo-00000000000000000000000").chat.completions.create(model="other", messages=HI, max_tokens=1)
    assert forbidden.value.code == "model_not_found"
    huge: Any = [{"role": "user", "content": "x" * 5000}]
    with pytest.raises(openai.APIStatusError) as too_large:
        gw.client("sk-alpha-00000000000000000000000").chat.completions.create(
            model="split", messages=huge, max_tokens=1
        )
    assert too_large.value.status_code == 413
    after = sum(r.metric("servlane_runtime_requests_total") for r in runtimes.values())
    assert after == before
    allowed = gw.client("sk-bravo-00000000000000000000000").chat.completions.create(
        model="split", messages=HI, max_tokens=1
    )
    assert answered_by(allowed) in {"tiny-a", "tiny-b"}


def test_rate_limit_is_429_with_retry_after(runtimes: dict[str, Runtime], start_gateway: StartGateway) -> None:
    objects = objects_for(runtimes, aifeature("split", [("model-a", 100)]))
    gw = start_gateway(objects, key_requests_per_minute=2, keys=KEYS)
    client = gw.client("sk-alpha-00000000000000000000000")
    for _ in range(2):
        client.chat.completions.create(model="split", messages=HI, max_tokens=1)
    with pytest.raises(openai.RateLimitError) as limited:
        client.chat.completions.create(model="split", messages=HI, max_tokens=1)
    assert limited.value.code == "rate_limit_exceeded"
    assert int(limited.value.response.headers["Retry-After"]) >= 1
    assert gw.sample(m.REQUESTS, feature="split", model="", code="429") == 1


def test_killed_runtime_is_retried_once_on_another(runtimes: dict[str, Runtime], start_gateway: StartGateway) -> None:
    doomed = runtimes["doomed"]
    models = [aimodel("doomed", doomed.v1, served="tiny-doomed"), aimodel("model-a", runtimes["a"].v1, served="tiny-a")]
    feature = aifeature("f", [("doomed", 99), ("model-a", 1)])
    gw = start_gateway([*models, feature, aifeature("only-doomed", [("doomed", 100)])])
    client = gw.client(timeout=60)
    assert picked(route_in(gw.state.table, "f"), "u1") == "doomed"
    first = client.chat.completions.create(model="f", messages=HI, max_tokens=1, user="u1")
    assert answered_by(first) == "tiny-doomed"
    doomed.kill()
    # The same id lands on the dead process first (its pooled connection is gone, a new one is refused);
    # the gateway retries once, on model-a.
    answer = client.chat.completions.create(model="f", messages=HI, max_tokens=1, user="u1")
    assert answered_by(answer) == "tiny-a"
    assert gw.sample(m.REQUESTS, feature="f", model="model-a", code="200") == 1
    with pytest.raises(openai.APIStatusError) as unavailable:  # nothing else to try: 503, not a hang
        client.chat.completions.create(model="only-doomed", messages=HI, max_tokens=1)
    assert unavailable.value.status_code == 503
    assert unavailable.value.response.headers["Retry-After"]


def test_rewritten_routes_file_moves_traffic_live(runtimes: dict[str, Runtime], start_gateway: StartGateway) -> None:
    objects = objects_for(runtimes, aifeature("live", [("model-a", 100)]))
    gw: Gateway = start_gateway(objects)
    client = gw.client(timeout=60)
    assert answered_by(client.chat.completions.create(model="live", messages=HI, max_tokens=1)) == "tiny-a"
    objects[-1] = aifeature("live", [("model-b", 100)])
    gw.write_routes(objects)
    wait_until("routes reload", lambda: route_in(gw.state.table, "live").backends[0].model == "model-b")
    assert answered_by(client.chat.completions.create(model="live", messages=HI, max_tokens=1)) == "tiny-b"
    response = httpx.get(f"{gw.url}/v1/models", timeout=10)
    assert {"live", "tiny-a", "tiny-b"} <= {entry["id"] for entry in response.json()["data"]}
