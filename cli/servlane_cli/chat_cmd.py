"""`servlane chat FEATURE`: a small streaming chat client for the local gateway (the `openai` package).

Interactive by default (history kept, `/exit` or Ctrl-D to leave); `--message TEXT` sends one message,
prints the streamed answer and exits, which makes it scriptable.

"Ready" means routable: the state file says when a model has loaded, but the gateway reloads the routes file
on its own clock, so a feature is ready only once the gateway's own route table gives one of its models
weight (the `servlane_gateway_route_weight` gauge on its /metrics, set together with the table). That gauge
has features only: a model called by its own name is ready once the AIModel the gateway loaded with its
table is Ready (its console's state, /console/api/state, which lists the objects of the table in use).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Literal, TextIO

import httpx
from openai import APIError, OpenAI
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from servlane_api.metric_names import WEIGHT
from servlane_api.targets import parse_target
from servlane_cli.state import SupervisorState, pid_alive

EXIT_COMMANDS = ("/exit", "/quit")
PROGRESS_SECONDS = 2.0
STARTUP_GRACE_SECONDS = 30.0


# (namespace, feature) -> the percent of its traffic the gateway routes to ready models now
RouteWeights = dict[tuple[str, str], float]
# AIModel name -> its phases in the objects of the gateway's route table (one per namespace holding it)
GatewayModels = dict[str, set[str]]
CONSOLE_STATE = "/console/api/state"
NoConsole = Literal["no console"]
NO_CONSOLE: NoConsole = "no console"


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


def gateway_models(console_state: object) -> GatewayModels:
    """The AIModels in the gateway's route table and their phases, from its console's state."""
    models = console_state.get("models") if isinstance(console_state, dict) else None
    phases: GatewayModels = {}
    for model in models if isinstance(models, list) else []:
        if isinstance(model, dict) and isinstance(model.get("name"), str):
            phases.setdefault(model["name"], set()).add(str(model.get("phase")))
    return phases


def read_gateway_models(gateway_url: str) -> GatewayModels | NoConsole | None:
    """The gateway's AIModels now; None while it does not answer (starting, restarting); NO_CONSOLE when it
    serves no console (SERVLANE_GATEWAY_CONSOLE_ENABLED=false)."""
    try:
        response = httpx.get(gateway_url + CONSOLE_STATE, timeout=5)
        if response.status_code == 404:
            return NO_CONSOLE
        return gateway_models(response.json()) if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def _backends(state: SupervisorState, name: str) -> list[str] | None:
    """The AIModels that answer `name` (a feature, or a served model name); None if nothing does."""
    feature = state.feature(name)
    if feature is not None:
        targets = [w.model for w in feature.status.weights] or [m for m in [feature.target] if m]
        return [parse_target(t).model for t in targets]  # an adapter (x:sql) is served by its AIModel's pods
    direct = [m.name for m in state.models if m.served_model_name == name]
    return direct or None


def _routable(
    state: SupervisorState,
    name: str,
    backends: list[str],
    read_weights: Callable[[str], RouteWeights | None],
    read_models: Callable[[str], GatewayModels | NoConsole | None],
) -> bool:
    """A feature: the gateway routes some of its traffic now. A model's own name (not in the weights gauge):
    one of its AIModels is Ready in the table the gateway routes by; without the gateway's console nothing
    says so, and it counts as routable once the gateway answers (its table may lag by one reload)."""
    feature = state.feature(name)
    if feature is None:
        models = read_models(state.gateway.url)
        if models == NO_CONSOLE:
            return read_weights(state.gateway.metrics_url) is not None
        return isinstance(models, dict) and any("Ready" in models.get(model, ()) for model in backends)
    weights = read_weights(state.gateway.metrics_url)
    return weights is not None and weights.get((feature.namespace, feature.name), 0.0) > 0


def wait_until_served(
    read: Callable[[], SupervisorState | None],
    name: str,
    timeout: float,
    out: TextIO = sys.stderr,
    read_weights: Callable[[str], RouteWeights | None] = read_route_weights,
    read_models: Callable[[str], GatewayModels | NoConsole | None] = read_gateway_models,
) -> str | None:
    """Wait until a model behind `name` is Ready and the gateway routes `name` to it, showing what it is
    doing; an error message, or None."""
    start = time.monotonic()
    last_shown: float | None = None
    while True:
        state = read()
        elapsed = time.monotonic() - start
        if state is None and elapsed < STARTUP_GRACE_SECONDS:
            if last_shown is None:  # a `serve` just started writes its state in a moment; none may be coming
                last_shown = elapsed
                print(f"waiting up to {STARTUP_GRACE_SECONDS:.0f}s for `servlane serve` to start", file=out)
            time.sleep(0.5)  # `serve` was just started and has not written its state yet
            continue
        if state is None or not state.running or not pid_alive(state.supervisor_pid):
            return "`servlane serve` is not running for these manifests"
        backends = _backends(state, name)
        if backends is None:
            return f"no feature or model named {name!r}"
        models = [m for m in state.models if m.name in backends]
        if backends and not models:
            return f"{name} routes to {', '.join(sorted(set(backends)))}, which no AIModel of these manifests defines"
        loaded = any(m.phase == "Ready" for m in models)
        if loaded and _routable(state, name, backends, read_weights, read_models):
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
