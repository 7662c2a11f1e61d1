"""`servlane chat FEATURE`: a small streaming chat client for the local gateway (the `openai` package).

Interactive by default (history kept, `/exit` or Ctrl-D to leave); `--message TEXT` sends one message,
prints the streamed answer and exits, which makes it scriptable.

"Ready" means routable: the state file says when a model has loaded, but the gateway reloads the routes file
on its own clock, so a feature is ready only once the gateway's own route table gives one of its models
weight (the `servlane_gateway_route_weight` gauge on its /metrics, set together with the table).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

import httpx
from openai import APIError, OpenAI
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from servlane_api.metric_names import WEIGHT
from servlane_cli.state import SupervisorState, pid_alive

EXIT_COMMANDS = ("/exit", "/quit")
PROGRESS_SECONDS = 2.0
STARTUP_GRACE_SECONDS = 30.0


# (namespace, feature) -> the percent of its traffic the gateway routes to ready models now
RouteWeights = dict[tuple[str, str], float]


def route_weights(metrics_text: str) -> RouteWeights:
    """Each feature's routable share from the gateway's metrics: above 0 exactly when a request for the
    feature would find a ready backend (the gauge is the route table's effective weights)."""
    shares: RouteWeights = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == WEIGHT:
                key = (sample.labels.get("namespace", ""), sample.labels.get("feature", ""))
                shares[key] = shares.get(key, 0.0) + sample.value
    return shares


def read_route_weights(metrics_url: str) -> RouteWeights | None:
    """The gateway's route weights now (from its /metrics URL); None while it does not answer (starting,
    restarting)."""
    try:
        response = httpx.get(metrics_url, timeout=5)
    except httpx.HTTPError:
        return None
    return route_weights(response.text) if response.status_code == 200 else None


def _backends(state: SupervisorState, name: str) -> list[str] | None:
    """The AIModels that answer `name` (a feature, or a served model name); None if nothing does."""
    feature = state.feature(name)
    if feature is not None:
        weighted = [w.model for w in feature.status.weights]
        return weighted or [m for m in [feature.target] if m]
    direct = [m.name for m in state.models if m.served_model_name == name]
    return direct or None


def _routable(state: SupervisorState, name: str, weights: RouteWeights | None) -> bool:
    """A feature: the gateway routes some of its traffic now. A model's own name is not in the gauge; it
    counts as routable once the gateway answers (the table it loaded may still lag by one reload)."""
    if weights is None:
        return False
    feature = state.feature(name)
    return feature is None or weights.get((feature.namespace, feature.name), 0.0) > 0


def wait_until_served(
    read: Callable[[], SupervisorState | None],
    name: str,
    timeout: float,
    out: TextIO = sys.stderr,
    read_weights: Callable[[str], RouteWeights | None] = read_route_weights,
) -> str | None:
    """Wait until a model behind `name` is Ready and the gateway routes `name` to it, showing what it is
    doing; an error message, or None."""
    start = time.monotonic()
    last_shown: float | None = None
    while True:
        state = read()
        elapsed = time.monotonic() - start
        if state is None and elapsed < STARTUP_GRACE_SECONDS:
            time.sleep(0.5)  # `serve` was just started and has not written its state yet
            continue
        if state is None or not state.running or not pid_alive(state.supervisor_pid):
            return "`servlane serve` is not running for these manifests"
        backends = _backends(state, name)
        if backends is None:
            return f"no feature or model named {name!r}"
        models = [m for m in state.models if m.name in backends]
        loaded = any(m.phase == "Ready" for m in models)
        if loaded and _routable(state, name, read_weights(state.gateway.metrics_url)):
            return None
        if elapsed > timeout:
            return f"{name} is not ready after {timeout:.0f}s; see `servlane status`"
        if last_shown is None or elapsed - last_shown >= PROGRESS_SECONDS:
            last_shown = elapsed
            doing = "; ".join(f"{m.name} {m.phase}: {m.reason}" for m in models) or "waiting for its models"
            if loaded:
                doing = "loaded, waiting for the gateway to route to it"
            print(f"waiting for {name} ({elapsed:.0f}s): {doing}", file=out)
        time.sleep(0.5)


def _reply(
    client: OpenAI, feature: str, history: list[ChatCompletionMessageParam], max_tokens: int, out: TextIO
) -> str:
    stream = client.chat.completions.create(model=feature, messages=history, stream=True, max_tokens=max_tokens)
    parts: list[str] = []
    for chunk in stream:
        for choice in chunk.choices:
            text = choice.delta.content or ""
            parts.append(text)
            out.write(text)
            out.flush()
    out.write("\n")
    return "".join(parts)


def chat(base_url: str, feature: str, message: str | None, max_tokens: int, out: TextIO = sys.stdout) -> int:
    # Access control is off in standalone mode; the client insists on some key.
    client = OpenAI(base_url=base_url, api_key="standalone", max_retries=0)
    history: list[ChatCompletionMessageParam] = []
    if message is not None:
        history.append({"role": "user", "content": message})
        try:
            _reply(client, feature, history, max_tokens, out)
        except APIError as exc:
            print(f"error: {exc.message}", file=sys.stderr)
            return 1
        return 0
    print(f"chatting with {feature} at {base_url} (/exit to leave)", file=out)
    while True:
        try:
            line = input("> ").strip()
        except (EOFError, KeyboardInterrupt):
            print(file=out)
            return 0
        if line in EXIT_COMMANDS:
            return 0
        if not line:
            continue
        history.append({"role": "user", "content": line})
        try:
            answer = _reply(client, feature, history, max_tokens, out)
        except APIError as exc:
            history.pop()
            print(f"error: {exc.message}", file=sys.stderr)
            continue
        except KeyboardInterrupt:
            history.pop()
            print("\n(interrupted)", file=out)
            continue
        history.append({"role": "assistant", "content": answer})
