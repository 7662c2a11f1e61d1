"""A property-based fuzz of the servers' own OpenAPI schemas (schemathesis on hypothesis), against real processes.

`servers(engine)` starts a runtime (`python -m servlane_runtime`, the transformers or the vLLM engine at its
defaults, the tiny Llama) and a gateway (`python -m servlane_gateway`) in front of it. `fuzz()` draws cases
from a server's /openapi.json for every operation, valid (positive) and invalid (negative), and sends them;
half of the bodies get the real model name so the engine runs, not just the 404 path. A watcher polls both
/health endpoints throughout. Used by tests/fuzz (default suite) and bench/fuzz_servers.py.

Bounded and repeatable. The cost of a case is the tokens it makes the engine generate, and a valid body may
ask for a lot: up to `max_list_items` prompts, `n` up to 16 choices each, `max_tokens` up to the whole
context (one such case took minutes on 2 cores, which is why tests/fuzz was once opt-in). So the runtime
takes at most MAX_LIST_ITEMS prompts (more is a 400, which the fuzz still reaches), and bodies sent to the
real model have `n` and `max_tokens`/`max_completion_tokens` lowered to N_CAP and MAX_TOKENS_CAP when they
hold a valid, larger value (invalid values are left alone: they must still be 400s): no case generates more
than MAX_LIST_ITEMS * N_CAP * MAX_TOKENS_CAP tokens. Those bodies also meet the rules a schema cannot state
(`meet_rules_the_schema_cannot_say`: cross-field ones, token ids within the model's vocabulary), else nearly no
valid case would reach the engine. Each case must answer within CASE_TIMEOUT_SECONDS. The cases are a function
of the seed alone (hypothesis's `seed`, no example database).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import Case, GenerationMode
from schemathesis.core.result import Err

from servlane_api.runtime_config import RuntimeConfig
from tests.support.gateway_harness import aifeature, aimodel
from tests.support.models import build_tiny_llama
from tests.support.polling import wait_until
from tests.support.ports import free_port
from tests.support.servers import SubprocessServer

RUNTIME_MODEL = "tiny-llama"
GATEWAY_FEATURE = "chat"
MAX_MODEL_LEN = 128
MAX_LIST_ITEMS = 8  # prompts (and messages) per request: more is a 400
N_CAP = 2
MAX_TOKENS_CAP = 8
CASE_TIMEOUT_SECONDS = 30.0  # one case, answered in full (a 2-core machine shared with other work)
HEALTH_BOUND_SECONDS = 2.0


@dataclass
class Server:
    name: str
    base_url: str
    model: str  # the name that reaches the engine


@dataclass
class FuzzResult:
    cases: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)  # "METHOD path status body" of each 5xx
    unsatisfiable: list[str] = field(default_factory=list)  # operation and mode with no case to draw
    generated: int = 0  # POSTs answered 200: the engine ran
    slowest: list[tuple[float, str]] = field(default_factory=list)  # (seconds, case) of the slowest cases

    def as_json(self) -> dict[str, Any]:
        return {
            "cases": self.cases,
            "status_counts": {str(k): v for k, v in sorted(self.statuses.items())},
            "posts_served": self.generated,
            "4xx": sum(v for k, v in self.statuses.items() if 400 <= k < 500),
            "5xx": sum(v for k, v in self.statuses.items() if k >= 500),
            "server_errors": self.server_errors[:20],
            "no_cases_for": self.unsatisfiable,
            "slowest_cases": [f"{seconds}s {case}" for seconds, case in reversed(self.slowest)],
        }


Engine = Literal["transformers", "vllm"]
ENGINES: tuple[Engine, ...] = ("transformers", "vllm")


def runtime_config(model_dir: Path, engine: Engine = "transformers") -> RuntimeConfig:
    return RuntimeConfig(
        model_source=str(model_dir),
        served_model_name=RUNTIME_MODEL,
        engine=engine,
        max_model_len=MAX_MODEL_LEN,
        max_list_items=MAX_LIST_ITEMS,
        max_in_flight=4,
        max_queue=16,
        queue_timeout_seconds=60,
    )


class GatewayProcess:
    """`python -m servlane_gateway --routes-file FILE` routing feature `chat` to one runtime, the Batch API on."""

    def __init__(self, runtime_url: str) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._dir = tempfile.TemporaryDirectory(prefix="servlane-fuzz-gateway-")
        routes = Path(self._dir.name) / "routes.json"
        objects = [aimodel("tiny", runtime_url, served=RUNTIME_MODEL), aifeature(GATEWAY_FEATURE, [("tiny", 100)])]
        routes.write_text(json.dumps(objects))
        self._log = Path(self._dir.name) / "gateway.log"
        self._command = [sys.executable, "-m", "servlane_gateway", "--routes-file", str(routes)]
        self._command += ["--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"]
        self._command += ["--metrics-port", str(free_port())]  # not the default: other gateways may run beside it
        # The Batch API on (its uploads, lists and ids are fuzzed too), one owner: no keys here.
        self._command += ["--batch-database-url", f"sqlite:///{Path(self._dir.name) / 'batch.db'}"]
        self._command += ["--batch-allow-without-keys", "true"]
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> GatewayProcess:
        with self._log.open("wb") as log:
            self._proc = subprocess.Popen(self._command, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until("the gateway's routes", self._ready, 30)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _ready(self) -> bool:
        assert self._proc is not None
        if self._proc.poll() is not None:
            raise AssertionError(f"the gateway exited:\n{self.log()}")
        try:
            return httpx.get(self.base_url + "/ready", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def log(self) -> str:
        return self._log.read_text(errors="replace")

    def __exit__(self, *_: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(30)
        self._dir.cleanup()


# vLLM takes a minute or more to start on 2 cores, several when the machine is shared.
RUNTIME_START_SECONDS = {"transformers": 120.0, "vllm": 540.0}


@contextmanager
def servers(engine: Engine = "transformers") -> Iterator[tuple[Server, Server]]:
    """The runtime on `engine` and the gateway in front of it, both ready."""
    runtime = SubprocessServer(runtime_config(build_tiny_llama(), engine), env={"HF_HUB_OFFLINE": "1"})
    # The gateway starts while the runtime loads its model: its routes do not wait for the backend.
    with runtime, GatewayProcess(runtime.base_url) as gateway:
        runtime.wait_ready(timeout=RUNTIME_START_SECONDS[engine])
        yield (
            Server("runtime", runtime.base_url, RUNTIME_MODEL),
            Server("gateway", gateway.base_url, GATEWAY_FEATURE),
        )


class HealthWatch:
    """Polls each server's /health from a thread; remembers the slowest answer and anything not a 200."""

    def __init__(self, servers: tuple[Server, ...], interval: float = 0.2) -> None:
        self._urls = [s.base_url + "/health" for s in servers]
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.polls = 0
        self.slowest = 0.0
        self.failures: list[str] = []

    def _run(self) -> None:
        with httpx.Client(timeout=HEALTH_BOUND_SECONDS * 5) as client:
            while not self._stop.wait(self._interval):
                for url in self._urls:
                    started = time.monotonic()
                    try:
                        status = client.get(url).status_code
                    except httpx.HTTPError as exc:
                        self.failures.append(f"{url}: {exc!r}")
                        continue
                    self.slowest = max(self.slowest, time.monotonic() - started)
                    self.polls += 1
                    if status != 200:
                        self.failures.append(f"{url}: {status}")

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def as_json(self) -> dict[str, Any]:
        return {"polls": self.polls, "slowest_seconds": round(self.slowest, 3), "failures": self.failures[:20]}


def _describe(case: Case[Any], status: int, body: bytes | None = None) -> str:
    sent = json.dumps(case.body, default=repr)[:300] if case.body is not None else ""
    answer = f": {body[:300]!r}" if body is not None else ""
    return f"{case.method} {case.path} -> {status}{answer} (sent {sent})"


def bound_work(body: dict[str, Any]) -> None:
    """Lower a body's valid but costly generation settings (see the module docstring); invalid ones stay."""
    for key, cap in (("n", N_CAP), ("max_tokens", MAX_TOKENS_CAP), ("max_completion_tokens", MAX_TOKENS_CAP)):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > cap:
            body[key] = cap
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = MAX_TOKENS_CAP  # absent (or null), it would be the rest of the context


# The tiny Llama's vocabulary: token ids below it (ids of a drawn prompt or logit_bias are taken modulo it).
TINY_VOCAB = 500


def meet_rules_the_schema_cannot_say(body: dict[str, Any]) -> None:
    """Rules an OpenAPI schema cannot state, met on bodies sent to the real model, so that valid cases reach the
    engine (each refuses about half of the drawn bodies; together, nearly all): stream_options only with
    `stream: true`, top_logprobs only with `logprobs: true`, content on every message but an assistant's, a
    tool_call_id on a tool's (cross-field rules), no suffix (no engine here fills in the middle), token ids
    within the model's vocabulary, embeddings at the model's own size (the model's). Values of a wrong type are
    left alone: they must still be 400s."""
    if isinstance(body.get("stream_options"), dict) and body.get("stream") is not True:
        del body["stream_options"]
    if isinstance(body.get("top_logprobs"), int) and body["top_logprobs"] and body.get("logprobs") in (None, False):
        body["logprobs"] = True
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, dict) and message.get("role") != "assistant" and message.get("content") is None:
            message["content"] = "hi"
        if isinstance(message, dict) and message.get("role") == "tool" and message.get("tool_call_id") is None:
            message["tool_call_id"] = "call_1"
    if isinstance(body.get("suffix"), str):  # no engine here fills in the middle: any suffix is refused
        del body["suffix"]
    bias = body.get("logit_bias")
    if isinstance(bias, dict) and all(isinstance(k, str) and k.isdigit() for k in bias):
        body["logit_bias"] = {str(int(k) % TINY_VOCAB): v for k, v in bias.items()}
    for name in ("prompt", "input"):  # completions' prompt, embeddings' input
        if name in body:
            body[name] = _within_vocabulary(body[name])
    if isinstance(body.get("dimensions"), int) and not isinstance(body["dimensions"], bool):
        del body["dimensions"]


def _within_vocabulary(prompt: Any) -> Any:
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [t % TINY_VOCAB if t >= 0 else t for t in prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        return [_within_vocabulary(p) for p in prompt]
    return prompt


def fuzz(server: Server, max_examples: int, seed: int = 0, timeout: float = CASE_TIMEOUT_SECONDS) -> FuzzResult:
    """`max_examples` cases per operation and generation mode, drawn from the server's OpenAPI schema."""
    schema = schemathesis.openapi.from_url(server.base_url + "/openapi.json")
    result = FuzzResult()
    session = requests.Session()

    def send(case: Case[Any]) -> None:
        started = time.monotonic()
        response = case.call(base_url=server.base_url, session=session, timeout=timeout)
        took = time.monotonic() - started
        result.cases += 1
        result.statuses[response.status_code] += 1
        result.slowest = sorted([*result.slowest, (round(took, 2), _describe(case, response.status_code))])[-5:]
        if case.method.upper() == "POST" and response.status_code == 200:
            result.generated += 1
        if response.status_code >= 500:
            result.server_errors.append(_describe(case, response.status_code, response.content))

    result.unsatisfiable = draw_cases(schema, max_examples, seed, server.model, send)
    return result


def draw_cases(schema: Any, max_examples: int, seed: int, model: str, visit: Callable[[Case[Any]], None]) -> list[str]:
    """Calls `visit` on each case drawn for every operation and generation mode; returns those with none.

    Half the bodies name `model` (and have their work bounded), the rest keep what was drawn.
    """
    unsatisfiable: list[str] = []
    for found in schema.get_all_operations():
        if isinstance(found, Err):
            raise AssertionError(f"the server's OpenAPI schema is invalid: {found.err()}")
        operation = found.ok()
        for mode in GenerationMode:
            cases = st.tuples(operation.as_strategy(generation_mode=mode), st.booleans())

            @settings(
                max_examples=max_examples,
                database=None,  # no examples replayed from earlier runs: the seed alone decides
                # Not hypothesis's deadline: it only judges a case after it has ended, and a slow case on a
                # loaded machine would be re-run to confirm. The HTTP timeout bounds each case instead.
                deadline=None,
                derandomize=False,  # `seed` decides (derandomize would ignore it)
                phases=[Phase.generate],  # every case counted once: no shrinking replays
                suppress_health_check=list(HealthCheck),
            )
            @given(drawn=cases)
            def one(drawn: tuple[Case[Any], bool]) -> None:
                case, real_model = drawn
                if real_model and isinstance(case.body, dict):
                    case.body["model"] = model
                    bound_work(case.body)
                    meet_rules_the_schema_cannot_say(case.body)
                visit(case)

            try:
                hypothesis_seed(seed)(one)()
            except Unsatisfiable:  # e.g. no invalid request exists for a GET without parameters
                unsatisfiable.append(f"{operation.method.upper()} {operation.path} {mode.value}")
    return unsatisfiable
