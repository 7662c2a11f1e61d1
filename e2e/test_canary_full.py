"""AIFeature canaries with every real piece: the local control plane, the operator reading a real
Prometheus, the gateway watching the cluster and scraped by that Prometheus, real runtime processes
serving a tiny Llama, and load from the official `openai` client through the gateway (`model: chat`).

KWOK pods become Ready without running, so the AIModels' in-cluster endpoints are rewritten by the
gateway's --endpoint-override to the runtime processes on loopback. The rollback scenario writes its
measurements (time from the first canary failure to all traffic on the stable, failed client requests
meanwhile) to .artifacts/canary-rollback.json, or to $CANARY_RESULTS (bench/canary_bench.py sets it).
Two more faults (e2e/canary_faults.py): a canary that answers every chat with its own 400 (no chat template),
and the module's Prometheus killed mid-rollout until the progress deadline acts.

bench/canary_bench.py also measures that scenario at the shipped defaults, through environment variables
that only it sets (unset, everything runs as in CI): CANARY_ROLLBACK_ROLLOUT (the rollout as JSON; `{}`
leaves every field to the CRD's defaults), CANARY_ROLLBACK_TIMEOUT_SECONDS, and the module's
CANARY_PROMETHEUS_SCRAPE_INTERVAL_SECONDS and CANARY_ANALYSIS_INTERVAL_SECONDS.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from e2e import canary_stack
from e2e.canary_faults import PrometheusProcess, counter_value, feature_events, without_chat_template
from e2e.canary_stack import (
    ANALYSIS,
    ANALYSIS_INTERVAL_SECONDS,
    CPU_MODEL,
    MIN_REQUESTS,
    SCRAPE_INTERVAL_SECONDS,
    STEPS,
    RuntimeProcess,
    rollout,
    runtime_config,
    start_gateway,
    wait_served,
)
from e2e.traffic import Load
from localcluster.cluster import stop_process_groups
from servlane_api.runtime_exit import MODEL_SOURCE_FAILED
from servlane_core.rollout import ROLLOUT_ANNOTATION
from tests.support.cluster_harness import ARTIFACTS, Kube, OperatorProcess, wait_until

# The canary stack's module fixtures (test_namespaces.py and test_hostile_tenants.py instantiate them too).
model_dir = canary_stack.model_dir
gateway_port = canary_stack.gateway_port
prometheus = canary_stack.prometheus
canary_operator = canary_stack.canary_operator

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


# --- fixtures ---


@pytest.fixture(scope="module")
def workdir() -> Path:
    path = ARTIFACTS / "canary-full"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def runtimes(model_dir: Path, workdir: Path) -> Iterator[dict[str, RuntimeProcess]]:
    started = {n: RuntimeProcess(runtime_config(model_dir, n), workdir).start() for n in ("v1", "v2")}
    try:
        for runtime in started.values():
            runtime.wait("ready")
            runtime.warm_up()
        yield started
    finally:
        for runtime in started.values():
            runtime.stop()


@pytest.fixture
def stack(
    kube: Kube, namespace: str, canary_operator: OperatorProcess, prometheus: PrometheusProcess, gateway_port: int,
    workdir: Path,
) -> Iterator[dict[str, Any]]:  # fmt: skip
    """What each scenario fills in: a gateway (started once the scenario knows its backends), cleaned up.
    Prometheus is up at the start, whatever an earlier scenario did to it."""
    prometheus.ensure_running()
    parts: dict[str, Any] = {}
    try:
        yield parts
    finally:
        if "gateway" in parts:
            stop_process_groups([parts["gateway"].proc.pid], timeout=10)
            parts["gateway"].proc.wait(timeout=5)


# --- helpers ---


def status(kube: Kube, ns: str) -> dict[str, Any]:
    return kube.get_feature(ns, "chat").get("status") or {}


def serve_chat(kube: Kube, ns: str, stable: str, canary: str, rollout: dict[str, Any]) -> None:
    for name in (stable, canary):
        kube.create_model(ns, name, CPU_MODEL)
    for name in (stable, canary):

        def ready(name: str = name) -> bool:
            return kube.phase(ns, name) == "Ready"

        wait_until(f"AIModel {name} Ready", ready, timeout=60)
    kube.create_feature(ns, "chat", {"model": stable, "rollout": rollout})
    wait_until(f"{stable} stable", lambda: status(kube, ns).get("weights") == [{"model": stable, "weight": 100}])


def rollback_rollout() -> dict[str, Any]:
    """The rollback scenario's rollout: CI's 3 s one, or the bench's (`{}`: the CRD's defaults)."""
    text = os.environ.get("CANARY_ROLLBACK_ROLLOUT")
    return rollout("3s") if text is None else dict(json.loads(text))


ROLLBACK_TIMEOUT_SECONDS = float(os.environ.get("CANARY_ROLLBACK_TIMEOUT_SECONDS", "60"))


# --- scenarios ---


def test_a_healthy_canary_is_promoted_step_by_step_under_real_traffic(
    kube: Kube, namespace: str, runtimes: dict[str, RuntimeProcess], stack: dict[str, Any], gateway_port: int,
    workdir: Path,
) -> None:  # fmt: skip
    serve_chat(kube, namespace, "v1", "v2", rollout("3s"))
    backends = {name: runtime.base_url for name, runtime in runtimes.items()}
    stack["gateway"] = gateway = start_gateway(kube, namespace, gateway_port, backends, workdir)
    with Load(gateway.url + "/v1") as load:
        wait_served(load, "v1")
        started = time.monotonic()
        kube.patch_feature(namespace, "chat", {"spec": {"model": "v2"}})
        weights_seen: list[int] = []

        def promoted() -> bool:
            s = status(kube, namespace)
            weight = s.get("canaryWeight")
            if weight and (not weights_seen or weights_seen[-1] != weight):
                weights_seen.append(weight)
            return s.get("phase") == "Stable" and s.get("stableModel") == "v2"

        wait_until("v2 promoted", promoted, timeout=90, interval=0.1)
        assert weights_seen == STEPS
        promoted_at = time.monotonic()
        wait_until("only v2 answers", lambda: load.only_answered_by("v2", promoted_at), timeout=30)

    final = status(kube, namespace)
    assert final["weights"] == [{"model": "v2", "weight": 100}]
    verdicts = [a["verdict"] for a in final["analyses"]]
    assert verdicts[-3:] == ["advance", "advance", "promote"]
    assert all(a["canaryRequests"] >= MIN_REQUESTS for a in final["analyses"][-3:])
    during = load.answered_since(started)
    assert {o.model for o in during} >= {"v1", "v2"}  # both served while the canary ran
    assert [o for o in during if o.error] == []  # a healthy rollout loses no request


def test_a_canary_whose_runtime_dies_is_rolled_back(
    kube: Kube, namespace: str, runtimes: dict[str, RuntimeProcess], stack: dict[str, Any], gateway_port: int,
    workdir: Path, model_dir: Path,
) -> None:  # fmt: skip
    bad = RuntimeProcess(runtime_config(model_dir, "bad"), workdir).start()
    try:
        bad.wait("ready")
        bad.warm_up()  # its rollback must come from the kill below, not from its cold first requests
        serve_chat(kube, namespace, "v1", "bad", rollback_rollout())
        backends = {"v1": runtimes["v1"].base_url, "bad": bad.base_url}
        stack["gateway"] = gateway = start_gateway(kube, namespace, gateway_port, backends, workdir)
        with Load(gateway.url + "/v1") as load:
            wait_served(load, "v1")
            kube.patch_feature(namespace, "chat", {"spec": {"model": "bad"}})
            wait_served(load, "bad", count=MIN_REQUESTS, timeout=60)
            at_failure = status(kube, namespace)
            weight_at_failure = at_failure.get("canaryWeight")
            # The canary's process dies and comes back broken (its model folder is gone: it exits), as a
            # crash-looping pod would: the gateway gets 5xx for the canary's share of the traffic.
            killed_at = time.monotonic()
            killed_wall = time.time()
            bad.kill()
            bad.start(model_source=str(workdir / "missing-model"))
            assert bad.wait_exit(timeout=60) == MODEL_SOURCE_FAILED  # its model folder is gone

            def rolled_back() -> dict[str, Any] | None:
                s = status(kube, namespace)
                return s if s.get("phase") == "RolledBack" else None

            final = wait_until("rollback", rolled_back, timeout=ROLLBACK_TIMEOUT_SECONDS, interval=0.1)
            status_at = time.monotonic()
            wait_until("gateway on v1 only", lambda: gateway.route_weights() == {"v1": 100.0}, 30, interval=0.05)
            stable_at = time.monotonic()
            wait_until("clients served by v1 again", lambda: load.only_answered_by("v1", stable_at), timeout=30)
        outcomes = load.snapshot()
        applied_rollout = kube.get_feature(namespace, "chat")["spec"]["rollout"]
    finally:
        bad.stop()

    assert final["weights"] == [{"model": "v1", "weight": 100}]
    assert final["rolledBackModel"] == "bad"
    degraded = next(c for c in final["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True"
    assert "maxErrorRate" in degraded["message"]
    failures = [o for o in outcomes if o.error is not None and o.ended >= killed_at]
    # Clients may see no failure at all: the gateway retries a refused connection once on the stable, and the
    # rollback can land before the broken restart answers any 503. The analysis still counts every refused
    # canary attempt (the Degraded message above), and whatever did fail started before the rollback.
    assert all(o.started < stable_at for o in failures)  # nothing fails once all traffic is on the stable
    # With no client-visible failure, the failure starts at the kill.
    first_failure = min((o.ended for o in failures), default=killed_at)
    record = {
        "scenario": "canary runtime SIGKILLed at its first step, restarted broken (5xx); Prometheus-read analysis",
        "rollout": applied_rollout,  # as the API server stored it, CRD defaults filled in
        "canary_weight_when_killed": weight_at_failure,
        "canary_weight_at_rollback": final["analyses"][-1]["canaryWeight"],
        "prometheus_scrape_interval_seconds": SCRAPE_INTERVAL_SECONDS,
        "operator_analysis_interval_seconds": ANALYSIS_INTERVAL_SECONDS,
        "step_started_at_when_killed": at_failure.get("stepStartedAt"),
        "seconds_step_started_to_kill": _seconds_since(at_failure.get("stepStartedAt"), killed_wall),
        "seconds_kill_to_first_failure": round(first_failure - killed_at, 3),
        "seconds_first_failure_to_rolled_back_status": round(status_at - first_failure, 3),
        "seconds_first_failure_to_all_traffic_on_stable": round(stable_at - first_failure, 3),
        "seconds_kill_to_all_traffic_on_stable": round(stable_at - killed_at, 3),
        "client_requests_between_failure_and_stable": sum(1 for o in outcomes if first_failure <= o.ended <= stable_at),
        "failed_client_requests": len(failures),
        "failed_by_error": dict(Counter(str(o.error) for o in failures)),
        "analyses": [
            {k: a.get(k) for k in ("time", "verdict", "canaryWeight", "canaryRequests", "canaryErrorRate")}
            for a in final["analyses"]
        ],
    }  # fmt: skip
    out = Path(os.environ.get("CANARY_RESULTS", ARTIFACTS / "canary-rollback.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print("\ncanary rollback:", json.dumps(record, indent=2))


def _seconds_since(rfc3339: str | None, wall: float) -> float | None:
    """Wall seconds from a status timestamp (whole seconds) to `wall`; None when the status had none."""
    if not rfc3339:
        return None
    return round(wall - datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp(), 3)


def test_operator_killed_mid_rollout_resumes_without_a_traffic_jump(
    kube: Kube, namespace: str, runtimes: dict[str, RuntimeProcess], stack: dict[str, Any], gateway_port: int,
    workdir: Path, canary_operator: OperatorProcess,
) -> None:  # fmt: skip
    # A longer interval than the operator's restart takes, so the restart itself is not also a step.
    serve_chat(kube, namespace, "v1", "v2", rollout("8s"))
    backends = {name: runtime.base_url for name, runtime in runtimes.items()}
    stack["gateway"] = gateway = start_gateway(kube, namespace, gateway_port, backends, workdir)
    with Load(gateway.url + "/v1") as load:
        wait_served(load, "v1")
        kube.patch_feature(namespace, "chat", {"spec": {"model": "v2"}})
        before = wait_until("canary at 50%", lambda: (s := status(kube, namespace)).get("canaryWeight") == 50 and s,
                            timeout=60, interval=0.1)  # fmt: skip
        canary_operator.kill()
        killed_at = before_restart = time.monotonic()
        # Nobody steers meanwhile: the gateway keeps the split it was given.
        assert gateway.route_weights() == {"v1": 50.0, "v2": 50.0}
        canary_operator.start()
        restarted = time.monotonic()
        weights_seen: list[int] = []

        def promoted() -> bool:
            s = status(kube, namespace)
            if s.get("canaryWeight") and (not weights_seen or weights_seen[-1] != s["canaryWeight"]):
                weights_seen.append(s["canaryWeight"])
            return s.get("phase") == "Stable" and s.get("stableModel") == "v2"

        promoted()
        after = status(kube, namespace)
        wait_until("v2 promoted after the restart", promoted, timeout=60, interval=0.1)
        promoted_at = time.monotonic()
        wait_until("only v2 answers", lambda: load.only_answered_by("v2", promoted_at), timeout=30)

    # The first status the restarted operator serves is the one it was killed with: same step, same weight.
    analysed_after_restart = [a for a in after.get("analyses", []) if a not in before.get("analyses", [])]
    assert analysed_after_restart == [] or analysed_after_restart[0]["verdict"] == "advance"
    if not analysed_after_restart:
        assert (after["canaryWeight"], after["stepIndex"]) == (before["canaryWeight"], before["stepIndex"])
        assert after["stepStartedAt"] == before["stepStartedAt"]  # the step's clock did not restart either
    # Later steps continue from there, one at a time: 50 -> 100 -> promoted, never back to 0 or 25.
    assert weights_seen == ([50, 100] if not analysed_after_restart else [100])
    final = status(kube, namespace)
    assert [a["verdict"] for a in final["analyses"]][-2:] == ["advance", "promote"]
    print(f"\noperator restart took {restarted - before_restart:.1f}s (killed at step {before['stepIndex']})")
    assert [o for o in load.answered_since(killed_at) if o.error] == []


def _condition(s: dict[str, Any], kind: str) -> dict[str, Any]:
    found: dict[str, Any] | None = next((c for c in s.get("conditions", []) if c["type"] == kind), None)
    assert found is not None, f"no {kind} condition in {s.get('conditions')}"
    return found


def _until_phase_leaves(kube: Kube, ns: str, phase: str, seen: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The status once its phase is no longer `phase`; every status read meanwhile goes into `seen`."""
    s = status(kube, ns)
    seen.append(s)
    return s if s.get("phase") != phase else None


def _warning_events(kube: Kube, ns: str, reason: str) -> list[Any] | None:
    found = [e for e in feature_events(kube, ns, "chat") if e.reason == reason and e.type == "Warning"]
    return found or None


def test_a_canary_answering_only_4xx_is_rolled_back_against_the_stables_4xx_rate(
    kube: Kube, namespace: str, runtimes: dict[str, RuntimeProcess], stack: dict[str, Any], gateway_port: int,
    workdir: Path, model_dir: Path, canary_operator: OperatorProcess,
) -> None:  # fmt: skip
    # The canary is Ready and never fails on the server side: its tokenizer has no chat template, so it
    # answers every chat with its own 400, while the stable answers the very same requests with 200.
    no_template = without_chat_template(model_dir, workdir / "tiny-llama-no-chat-template")
    canary = RuntimeProcess(runtime_config(no_template, "notpl"), workdir).start()
    try:
        canary.wait("ready")
        hello = {"model": "notpl", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 3}
        direct = httpx.post(canary.base_url + "/v1/chat/completions", json=hello, timeout=30)
        assert direct.status_code == 400, direct.text
        assert "chat template" in direct.json()["error"]["message"]
        serve_chat(kube, namespace, "v1", "notpl", rollout("3s"))
        backends = {"v1": runtimes["v1"].base_url, "notpl": canary.base_url}
        stack["gateway"] = gateway = start_gateway(kube, namespace, gateway_port, backends, workdir)
        with Load(gateway.url + "/v1") as load:
            wait_served(load, "v1")
            patched_at = time.monotonic()
            kube.patch_feature(namespace, "chat", {"spec": {"model": "notpl"}})
            seen: list[dict[str, Any]] = []
            wait_until("rollout started", lambda: status(kube, namespace).get("phase") == "Progressing", 30, 0.1)
            final = wait_until("rollback", lambda: _until_phase_leaves(kube, namespace, "Progressing", seen), 60, 0.1)
            wait_until("gateway on v1 only", lambda: gateway.route_weights() == {"v1": 100.0}, 30, interval=0.05)
            stable_at = time.monotonic()
            wait_until("clients served by v1 again", lambda: load.only_answered_by("v1", stable_at), timeout=30)
        outcomes = load.snapshot()
        metrics_text = canary_operator.metrics()
    finally:
        canary.stop()

    assert final["phase"] == "RolledBack", final
    assert final["weights"] == [{"model": "v1", "weight": 100}]
    assert final["rolledBackModel"] == "notpl"
    assert {s.get("canaryWeight") for s in seen if s.get("phase") == "Progressing"} <= {0, STEPS[0]}  # no step up
    last = final["lastAnalysis"]
    assert (last["canaryModel"], last["verdict"], last["outcome"]) == ("notpl", "rollback", "fail")
    # Judged on 4xx alone, relative to the stable in the same window: no server error on either side, the
    # canary refused (nearly) everything (Prometheus' increase() extrapolates), the stable nothing.
    assert last["canaryErrorRate"] == 0
    assert last["canaryClientErrorRate"] > 0.9
    assert last["canaryFailureRate"] > ANALYSIS["maxErrorRate"]
    assert last["stableRequests"] >= MIN_REQUESTS
    assert (last["stableErrorRate"], last["stableClientErrorRate"]) == (0, 0)
    degraded = _condition(final, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "AnalysisFailed")
    message = degraded["message"]
    assert "maxErrorRate " in message, message
    assert "maxErrorRateIncrease " in message, message
    # Both sides' numbers, as an operator reads them: the canary's 4xx rate against the stable's.
    canary_part = re.search(r"canary: \d+ requests, failures [\d.]+% \(server errors 0\.00%, 4xx ([\d.]+)%\)", message)
    stable_part = re.search(r"stable \(this window\): (\d+) requests, server errors 0\.00%, 4xx 0\.00%", message)
    assert canary_part is not None, message
    assert stable_part is not None, message
    assert float(canary_part[1]) > 90, message
    assert int(stable_part[1]) >= MIN_REQUESTS, message
    assert _condition(final, "Progressing")["reason"] == "RolledBack"
    # The same explanation as a Warning Event on the AIFeature (kopf posts Events in the background).
    events = wait_until("RolledBack event", lambda: _warning_events(kube, namespace, "RolledBack"), timeout=30)
    assert any("notpl" in str(e.message) and "4xx" in str(e.message) for e in events), [e.message for e in events]
    rollbacks = counter_value(
        metrics_text, "servlane_operator_feature_rollbacks_total", namespace=namespace, feature="chat"
    )
    assert rollbacks == 1
    failures = [o for o in outcomes if o.error is not None]
    assert failures, "no client ever got the canary's 400: the fault did not happen"
    assert {o.error for o in failures} == {"400"}  # the canary's own answer, passed through; never a 5xx
    assert all(patched_at <= o.started < stable_at for o in failures)  # only while the canary had traffic
    print(f"\n4xx canary: {len(failures)} client requests got 400 before the rollback; {message}")


PROGRESS_DEADLINE_SECONDS = 15


@pytest.mark.parametrize("on_deadline", ["Rollback", "Pause"])
def test_a_metrics_outage_holds_the_canary_until_the_progress_deadline(
    on_deadline: str, kube: Kube, namespace: str, runtimes: dict[str, RuntimeProcess], stack: dict[str, Any],
    gateway_port: int, workdir: Path, canary_operator: OperatorProcess, prometheus: PrometheusProcess,
) -> None:  # fmt: skip
    spec = {
        **rollout("3s"),
        # What is under test is the metrics' absence, not the canary's speed: on a busy CI machine a p95
        # of a few requests can be several times the stable's, which would roll back the resumed canary.
        "analysis": {**ANALYSIS, "maxP95RatioToStable": 100},
        "progressDeadlineSeconds": PROGRESS_DEADLINE_SECONDS,
        "onProgressDeadline": on_deadline,
    }
    serve_chat(kube, namespace, "v1", "v2", spec)
    backends = {name: runtime.base_url for name, runtime in runtimes.items()}
    stack["gateway"] = gateway = start_gateway(kube, namespace, gateway_port, backends, workdir)
    held_split = {"v1": float(100 - STEPS[0]), "v2": float(STEPS[0])}
    with Load(gateway.url + "/v1") as load:
        wait_served(load, "v1")
        kube.patch_feature(namespace, "chat", {"spec": {"model": "v2"}})
        # A healthy canary, at its first step: its first analysis is due one interval later.
        wait_until("canary at its first step", lambda: status(kube, namespace).get("canaryWeight") == STEPS[0], 60, 0.1)
        try:
            prometheus.kill()
            killed_at = time.monotonic()
            at_outage = status(kube, namespace)
            seen: list[dict[str, Any]] = []
            final = wait_until(
                f"the progress deadline ({on_deadline})",
                lambda: _until_phase_leaves(kube, namespace, "Progressing", seen),
                timeout=PROGRESS_DEADLINE_SECONDS + 30, interval=0.2,
            )  # fmt: skip
            acted_at = time.monotonic()
            if on_deadline == "Rollback":
                wait_until("gateway on v1 only", lambda: gateway.route_weights() == {"v1": 100.0}, 30, 0.05)
                stable_at = time.monotonic()
                # Serving needs no metrics: the rollback reached the clients with Prometheus still down.
                wait_until("clients served by v1 again", lambda: load.only_answered_by("v1", stable_at), 30)
            else:
                assert gateway.route_weights() == held_split  # a pause keeps the split it had
            metrics_text = canary_operator.metrics()
            events = wait_until(
                "ProgressDeadlineExceeded event",
                lambda: _warning_events(kube, namespace, "ProgressDeadlineExceeded"), timeout=30,
            )  # fmt: skip
        finally:
            prometheus.ensure_running()
        if on_deadline == "Pause":
            # Metrics are back: resuming continues the same rollout, which now reaches its verdicts.
            resumed_at = time.monotonic()
            kube.patch_feature(namespace, "chat", {"metadata": {"annotations": {ROLLOUT_ANNOTATION: "resume"}}})
            promoted = wait_until(
                "v2 promoted after the resume",
                lambda: (s := status(kube, namespace)).get("phase") == "Stable" and s.get("stableModel") == "v2" and s,
                timeout=60, interval=0.1,
            )  # fmt: skip
            wait_until("only v2 answers", lambda: load.only_answered_by("v2", resumed_at), timeout=30)
    outcomes = load.snapshot()

    # Nothing moved while the metrics were out: same step, same weight, until the deadline acted.
    in_outage = [s for s in [at_outage, *seen] if s.get("phase") == "Progressing"]
    assert {(s.get("stepIndex"), s.get("canaryWeight")) for s in in_outage} == {(0, STEPS[0])}
    earlier = at_outage.get("analyses", [])
    during = [a for a in final["analyses"] if a not in earlier]
    assert len(during) >= 2, during  # the deadline is several intervals: it held through analyses
    assert all((a["verdict"], a["outcome"]) == ("hold", "inconclusive") for a in during), during
    assert all(a["message"].startswith("No verdict: metrics unavailable: ") for a in during), during
    # The deadline counted from the last verdict (entering the step), not from the outage, and no sooner.
    awaiting = datetime.fromisoformat(at_outage["awaitingVerdictSince"].replace("Z", "+00:00"))
    if on_deadline == "Rollback":
        assert final["phase"] == "RolledBack", final
        assert final["weights"] == [{"model": "v1", "weight": 100}]
        assert final["rolledBackModel"] == "v2"
        acted = _condition(final, "Degraded")
        assert (acted["status"], acted["reason"]) == ("True", "ProgressDeadlineExceeded")
        assert _condition(final, "Progressing")["reason"] == "RolledBack"
    else:
        assert final["phase"] == "Paused", final
        assert (final["canaryModel"], final["canaryWeight"]) == ("v2", STEPS[0])
        acted = _condition(final, "Progressing")
        assert (acted["status"], acted["reason"]) == ("False", "ProgressDeadlineExceeded")
        assert _condition(final, "Degraded")["status"] == "False"
    message = acted["message"]
    assert f"(progressDeadlineSeconds {PROGRESS_DEADLINE_SECONDS}): metrics unavailable: " in message, message
    transition = datetime.fromisoformat(acted["lastTransitionTime"].replace("Z", "+00:00"))
    assert (transition - awaiting).total_seconds() >= PROGRESS_DEADLINE_SECONDS
    assert acted_at - killed_at <= PROGRESS_DEADLINE_SECONDS + 10  # and not long after it either
    assert any("metrics unavailable" in str(e.message) for e in events), [e.message for e in events]
    # The operator's own metrics say so too: every failed read counted, the deadline's action once.
    unavailable = counter_value(
        metrics_text, "servlane_operator_canary_metrics_unavailable_total", namespace=namespace, feature="chat"
    )
    assert unavailable >= len(during)
    exceeded = counter_value(
        metrics_text, "servlane_operator_feature_progress_deadline_exceeded_total",
        namespace=namespace, feature="chat", action=on_deadline,
    )  # fmt: skip
    assert exceeded == 1
    if on_deadline == "Pause":
        after = [a for a in promoted["analyses"] if a not in final["analyses"]]
        assert [a["verdict"] for a in after if a["verdict"] != "hold"] == ["advance", "advance", "promote"]
    # The canary was healthy and the gateway needs no Prometheus: no client request failed.
    assert [o for o in outcomes if o.error and o.started >= killed_at] == []
    print(f"\nmetrics outage ({on_deadline}): deadline acted {acted_at - killed_at:.1f}s after the kill; {message}")
