"""Two teams on one gateway: namespaces team-a and team-b each hold AIModels `v1` and `v2` and an AIFeature
`chat`, under the same names. No request, metric, limit or canary verdict crosses between them, and an
attempt to take over the other team's names is refused or logged, never effective.

The same real pieces as e2e/test_canary_full.py (the fixtures and helpers of e2e/canary_stack.py): the local control
plane, a real Prometheus scraping the gateway, the operator reading it, real runtime processes serving the
tiny Llama behind --endpoint-override, and load from the official `openai` client. The gateway watches the
whole cluster, as the chart runs it by default, with team-a as its only serving namespace: a plain `chat`
is team-a's for a key without namespaces (ops), but each team's key resolves plain names in its own
namespace, so team-b's plain `chat` is team-b's. Each runtime serves a name that says whose it is ("a-v1", "b-v1"),
so every answer tells which namespace served it. Team-b's `v2` points at a port where nothing listens.
A second gateway over the same cluster has a small budget per feature and both teams as serving
namespaces (plain names held by both are ambiguous for a key without namespaces: refused, and logged).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from e2e import canary_stack, tenants
from e2e.canary_stack import CPU_MODEL, MIN_REQUESTS, RuntimeProcess, rollout, runtime_config, wait_served
from e2e.tenants import MODELS, GatewayProcess, Team, answered_by, keys_file, new_key, openai_error, select
from e2e.traffic import Load
from servlane_api import metric_names
from tests.support.cluster_harness import ARTIFACTS, Kube, OperatorProcess, wait_until
from tests.support.ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# The canary stack's module fixtures, instantiated for this module: the tiny model, a Prometheus scraping
# `gateway_port` (our `workdir` holds its data), and the operator reading that Prometheus.
model_dir = canary_stack.model_dir
gateway_port = canary_stack.gateway_port
prometheus = canary_stack.prometheus
canary_operator = canary_stack.canary_operator
teams = tenants.teams  # the two teams' namespaces (test_hostile_tenants.py uses them too)

OPS_KEY = new_key()  # an operator's key without scopes: may call everything
A_BATCH_KEY = new_key()  # team-a's second key: the same budget for team-a's features
FEATURE_RPM = 3  # the limited gateway's budget per feature


@pytest.fixture(scope="module")
def workdir() -> Path:
    path = ARTIFACTS / "namespaces"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def runtimes(model_dir: Path, workdir: Path, teams: tuple[Team, Team]) -> Iterator[dict[str, RuntimeProcess]]:
    """One process per served model that answers: a-v1, a-v2, b-v1 (team-b's v2 is the broken one)."""
    a, b = teams
    names = [a.served("v1"), a.served("v2"), b.served("v1")]
    started = {n: RuntimeProcess(runtime_config(model_dir, n), workdir).start() for n in names}
    try:
        for runtime in started.values():
            runtime.wait("ready")
            runtime.warm_up()  # a cold canary's first chats would fail maxP95RatioToStable on a busy machine
        yield started
    finally:
        for runtime in started.values():
            runtime.stop()


@pytest.fixture(scope="module")
def overrides(teams: tuple[Team, Team], runtimes: dict[str, RuntimeProcess]) -> list[str]:
    """--endpoint-override arguments: every AIModel's in-cluster endpoint to its runtime, and team-b's v2 and
    the shadowing test's impostor to a port nothing listens on (connections refused: 5xx)."""
    a, b = teams
    nothing = f"http://127.0.0.1:{free_port()}"
    targets = {a.endpoint(m): runtimes[a.served(m)].base_url for m in MODELS}
    targets |= {b.endpoint("v1"): runtimes[b.served("v1")].base_url, b.endpoint("v2"): nothing}
    targets[b.endpoint("impostor")] = nothing
    return [arg for source, target in targets.items() for arg in ("--endpoint-override", f"{source}={target}")]


@pytest.fixture(scope="module")
def served(kube: Kube, teams: tuple[Team, Team], canary_operator: OperatorProcess) -> tuple[Team, Team]:
    """Both teams' AIModels Ready and their `chat` features on v1, with the operator reading Prometheus."""
    for team in teams:
        for model in MODELS:
            kube.create_model(team.namespace, model, {**CPU_MODEL, "servedModelName": team.served(model)})
    for team in teams:
        for model in MODELS:

            def ready(ns: str = team.namespace, name: str = model) -> bool:
                return kube.phase(ns, name) == "Ready"

            wait_until(f"AIModel {team.namespace}/{model} Ready", ready, timeout=60)
        kube.create_feature(team.namespace, "chat", {"model": "v1", "rollout": rollout("3s")})
    for team in teams:

        def on_v1(ns: str = team.namespace) -> bool:
            return weights(kube, ns) == {"v1": 100}

        wait_until(f"{team.chat} on v1", on_v1)
    return teams


@pytest.fixture(scope="module")
def keys(workdir: Path, teams: tuple[Team, Team]) -> Path:
    a, b = teams
    entries = {
        "team-a": (a.key, f"{a.namespace}/*"),
        "team-a-batch": (A_BATCH_KEY, f"{a.namespace}/*"),
        "team-b": (b.key, f"{b.namespace}/*"),
        "ops": (OPS_KEY, ""),
    }
    return keys_file(workdir / "keys", entries)


@pytest.fixture(scope="module")
def gateway(
    kube: Kube, served: tuple[Team, Team], keys: Path, overrides: list[str], gateway_port: int, workdir: Path
) -> Iterator[GatewayProcess]:
    """The gateway Prometheus scrapes: plain names resolve in team-a only, no limits."""
    a, _ = served
    args = ["--serving-namespaces", a.namespace, "--keys-file", str(keys), *overrides]
    # The metrics port the module's Prometheus scrapes (e2e/canary_stack.py's).
    metrics_port = canary_stack.metrics_port_of(gateway_port)
    started = GatewayProcess.start(kube, gateway_port, workdir / "gateway.log", args, metrics_port=metrics_port)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def limited(
    kube: Kube, served: tuple[Team, Team], keys: Path, overrides: list[str], workdir: Path
) -> Iterator[GatewayProcess]:
    """A second gateway: a small budget per feature, and both teams as serving namespaces, team-a first (so a
    plain name held by both is team-a's, and the gateway says so)."""
    a, b = served
    args = ["--serving-namespaces", f"{a.namespace},{b.namespace}", "--keys-file", str(keys),
            "--feature-requests-per-minute", str(FEATURE_RPM), *overrides]  # fmt: skip
    started = GatewayProcess.start(kube, free_port(), workdir / "gateway-limited.log", args)
    yield started
    started.stop()


def status(kube: Kube, ns: str) -> dict[str, Any]:
    return kube.get_feature(ns, "chat").get("status") or {}


def weights(kube: Kube, ns: str) -> dict[str, int]:
    return {w["model"]: w["weight"] for w in status(kube, ns).get("weights", [])}


# --- scenarios ---


def test_each_key_reaches_only_its_own_teams_chat(gateway: GatewayProcess, served: tuple[Team, Team]) -> None:
    a, b = served
    assert answered_by(gateway.chat(a.key, a.chat)) == "a-v1"
    assert answered_by(gateway.chat(b.key, b.chat)) == "b-v1"
    # A plain `chat` is each team's own for its key (its scopes name its namespace), whatever the serving
    # namespaces say; a key that may call everything has no namespace: it gets the serving namespace's.
    assert answered_by(gateway.chat(a.key, "chat")) == "a-v1"
    assert answered_by(gateway.chat(b.key, "chat")) == "b-v1"
    assert answered_by(gateway.chat(OPS_KEY, "chat")) == "a-v1"
    assert answered_by(gateway.chat(OPS_KEY, b.chat)) == "b-v1"
    # Another team's feature is refused, with the very answer a name that exists nowhere gets: no team
    # learns which names another one holds.
    missing = f"{b.namespace}/no-such-feature"
    nowhere = openai_error(gateway.chat(a.key, missing), 404)
    for key, model in ((a.key, b.chat), (b.key, a.chat), (b.key, "a-v1"), (a.key, f"{b.namespace}/b-v1")):
        error = openai_error(gateway.chat(key, model), 404)
        assert error["message"].replace(f"'{model}'", "'X'") == nowhere["message"].replace(f"'{missing}'", "'X'")
        assert {**error, "message": ""} == {**nowhere, "message": ""}
    assert openai_error(gateway.chat(None, a.chat), 401)["code"] == "invalid_api_key"
    assert openai_error(gateway.chat(new_key(), a.chat), 401)["code"] == "invalid_api_key"
    assert openai_error(gateway.chat(OPS_KEY, "team-nobody/chat"), 404)["code"] == "model_not_found"
    # A name that only team-b holds is no plain name for a key without namespaces: team-b is not serving.
    assert openai_error(gateway.chat(OPS_KEY, b.served("v1")), 404)["code"] == "model_not_found"
    # Each key lists exactly what it may call, as it would call it.
    assert gateway.models(a.key) == ["a-v1", "a-v2", "chat"]
    assert gateway.models(b.key) == ["b-v1", "b-v2", "chat"]


def test_metrics_carry_the_namespace_and_one_teams_traffic_never_moves_the_others(
    gateway: GatewayProcess, served: tuple[Team, Team]
) -> None:
    a, b = served
    before = gateway.samples(metric_names.REQUESTS)
    for _ in range(5):
        assert answered_by(gateway.chat(a.key, a.chat)) == "a-v1"
    after = gateway.samples(metric_names.REQUESTS)
    a_ok = {"namespace": a.namespace, "feature": "chat", "model": "v1", "code": "200"}
    assert sum(select(after, **a_ok).values()) - sum(select(before, **a_ok).values()) == 5
    b_ok = {**a_ok, "namespace": b.namespace}
    assert select(after, **b_ok)  # team-b's `chat`/`v1` series exists, under the same label values but its namespace
    assert select(after, namespace=b.namespace) == select(before, namespace=b.namespace)
    # Every series of a feature says whose it is.
    assert all(dict(labels)["namespace"] for labels in after if dict(labels)["feature"])
    weight = gateway.samples(metric_names.WEIGHT)
    for team in served:
        assert select(weight, namespace=team.namespace, feature="chat") == {
            frozenset({"namespace": team.namespace, "feature": "chat", "model": "v1"}.items()): 100.0
        }


def test_one_teams_exhausted_limits_never_throttle_the_other(
    limited: GatewayProcess, served: tuple[Team, Team]
) -> None:
    a, b = served
    # One burst, so the budget is spent within moments whatever the machine's speed (it refills one request
    # per 20 s): `team-a/chat` and the plain `chat` (team-a's for team-a's keys) draw on team-a's one budget.
    burst = limited.concurrently([(a.key, a.chat)] * 3 + [(A_BATCH_KEY, "chat")] * 2)
    assert sorted(r.status_code for r in burst) == [200] * FEATURE_RPM + [429] * (len(burst) - FEATURE_RPM)
    assert {answered_by(r) for r in burst if r.status_code == 200} == {"a-v1"}
    for refused in (r for r in burst if r.status_code == 429):
        error = openai_error(refused, 429)
        assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
        assert "requests per minute for this feature" in error["message"]
        assert int(refused.headers["retry-after"]) >= 1
    # Team-b's `chat`, the same name in another namespace, has its whole budget.
    assert [answered_by(r) for r in limited.concurrently([(b.key, b.chat)] * FEATURE_RPM)] == ["b-v1"] * FEATURE_RPM
    requests = limited.samples(metric_names.REQUESTS)
    assert sum(select(requests, namespace=a.namespace, feature="chat", code="429").values()) == 2
    assert sum(select(requests, namespace=b.namespace, code="429").values()) == 0
    assert sum(select(requests, namespace=b.namespace, feature="chat", code="200").values()) == FEATURE_RPM


def test_an_attempt_to_shadow_is_refused_or_logged_never_effective(
    kube: Kube, gateway: GatewayProcess, limited: GatewayProcess, served: tuple[Team, Team]
) -> None:
    a, b = served
    # A served name with `/` would read as another namespace's `namespace/name`: the API server refuses it.
    with pytest.raises(ApiException) as refused:
        kube.create_model(b.namespace, "impostor", {**CPU_MODEL, "servedModelName": a.chat})
    assert refused.value.status == 422
    assert "servedModelName must not contain '/'" in str(refused.value.body)
    # Team-b serves a model under team-a's plain name. For everyone but team-b it is only ever team-b/a-v1
    # (nothing behind it: a takeover would answer 503); team-a's clients keep team-a's model.
    kube.create_model(b.namespace, "impostor", {**CPU_MODEL, "servedModelName": a.served("v1")})
    try:
        qualified = f"{b.namespace}/{a.served('v1')}"
        wait_until("the gateway routes the impostor", lambda: qualified in gateway.models(OPS_KEY), timeout=30)
        for _ in range(3):
            assert answered_by(gateway.chat(OPS_KEY, a.served("v1"))) == "a-v1"
            assert answered_by(gateway.chat(a.key, a.served("v1"))) == "a-v1"
        assert openai_error(gateway.chat(OPS_KEY, qualified), 503)["code"] == "service_overloaded"  # the impostor
        # Team-b's own key resolves the plain name in team-b: its own impostor, never team-a's model.
        assert openai_error(gateway.chat(b.key, a.served("v1")), 503)["code"] == "service_overloaded"
        assert gateway.logged(f"plain model names resolve in namespace(s) {a.namespace} for callers whose")
        # Where team-b is a serving namespace too, a name both hold is ambiguous for a key without
        # namespaces: refused (400), never given to the first listed, and logged; the teams keep their own.
        for name in ("chat", a.served("v1")):
            line = f"model name '{name}' is held by serving namespaces '{a.namespace}', '{b.namespace}'"

            def logged(line: str = line) -> bool:
                return limited.logged(line)

            wait_until(f"the ambiguity of {name!r} logged", logged, timeout=30)
        assert openai_error(limited.chat(OPS_KEY, a.served("v1")), 400)["code"] == "ambiguous_model"
        assert answered_by(limited.chat(a.key, a.served("v1"))) == "a-v1"
    finally:
        kube.delete_model(b.namespace, "impostor")


def test_concurrent_canaries_each_read_only_their_own_namespace(
    kube: Kube, gateway: GatewayProcess, served: tuple[Team, Team]
) -> None:
    """Team-b's canary fails (every connection refused) while team-a's, of the same feature and model names,
    runs healthy over the same gateway and Prometheus: team-b rolls back, team-a is promoted."""
    a, b = served
    load_a = Load(gateway.url + "/v1", feature=a.chat, api_key=a.key)
    load_b = Load(gateway.url + "/v1", feature=b.chat, api_key=b.key)
    with load_a, load_b:
        wait_served(load_a, "a-v1")
        wait_served(load_b, "b-v1")
        started = time.monotonic()
        kube.patch_feature(b.namespace, "chat", {"spec": {"model": "v2"}})
        kube.patch_feature(a.namespace, "chat", {"spec": {"model": "v2"}})
        ended: dict[str, float] = {}

        def both_decided() -> bool:
            sb, sa = status(kube, b.namespace), status(kube, a.namespace)
            if sb.get("phase") == "RolledBack":
                ended.setdefault("b", time.monotonic())
            if sa.get("phase") == "Stable" and sa.get("stableModel") == "v2":
                ended.setdefault("a", time.monotonic())
            assert sa.get("phase") != "RolledBack", f"team-a's healthy canary was rolled back: {sa}"
            assert sb.get("stableModel") != "v2", f"team-b's broken canary was promoted: {sb}"
            return len(ended) == 2

        wait_until("team-b rolled back and team-a promoted", both_decided, timeout=90, interval=0.1)
        wait_until("team-b back on v1", lambda: weights(kube, b.namespace) == {"v1": 100}, timeout=30)
        settled = time.monotonic()
        wait_until("team-a's clients on a-v2", lambda: load_a.only_answered_by("a-v2", settled), timeout=30)
        wait_until("team-b's clients on b-v1", lambda: load_b.only_answered_by("b-v1", settled), timeout=30)

    # The two ran at once: started together, team-b's canary failed (and was rolled back) while team-a's ran,
    # so team-b's errors fell inside team-a's analysis windows, under the same feature and model labels.
    assert ended["b"] < ended["a"]
    final_a, final_b = status(kube, a.namespace), status(kube, b.namespace)
    assert final_a["weights"] == [{"model": "v2", "weight": 100}]
    assert [x["verdict"] for x in final_a["analyses"]][-3:] == ["advance", "advance", "promote"]
    # Team-a's analyses never saw an error: not team-b's, under the same feature and model names.
    assert all(not x.get("canaryErrorRate") for x in final_a["analyses"]), final_a["analyses"]
    assert all(x["canaryRequests"] >= MIN_REQUESTS for x in final_a["analyses"][-3:])
    assert final_b["weights"] == [{"model": "v1", "weight": 100}]
    assert final_b["rolledBackModel"] == "v2"
    last_b = final_b["analyses"][-1]
    assert last_b["verdict"] == "rollback"
    assert last_b["canaryErrorRate"] > 0.9  # every attempt refused (extrapolated counts: not exactly 1.0)
    assert last_b["stableErrorRate"] == 0  # team-a's successes are not team-b's either
    degraded = next(c for c in final_b["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True"
    assert "maxErrorRate" in degraded["message"]
    assert not any(c["type"] == "Degraded" and c["status"] == "True" for c in final_a["conditions"])
    # The gateway counted team-b's refused canary attempts as team-b's only.
    errors = gateway.samples(metric_names.ERRORS)
    assert sum(select(errors, namespace=a.namespace).values()) == 0
    assert sum(select(errors, namespace=b.namespace, model="v2", reason="upstream_unavailable").values()) > 0
    # No client was answered by the other team's runtimes, nor failed (refused attempts are retried on v1).
    during_a, during_b = load_a.answered_since(started), load_b.answered_since(started)
    assert {o.model for o in during_a} == {"a-v1", "a-v2"}
    assert {o.model for o in during_b} == {"b-v1"}
    assert [o for o in during_a + during_b if o.error] == []
