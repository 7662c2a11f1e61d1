"""Canary rollouts in standalone mode: the operator's plan() fed by the local gateway's real metrics.

Four runtimes: tiny-a (the stable), tiny-b (a good new version), tiny-bad (a corrupted checkpoint
that answers sampled requests with 500, see conftest.nan_llama_dir) and tiny-c (a good model whose runtime
the test kills whenever it is back: a crash loop). Three features start on tiny-a; editing the manifest
points them at a new model, which starts a canary as it would in a cluster.
Every response names the AIModel that answered, so the tests see the split and the final owner.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from servlane_api.aifeature import AIFeatureStatus
from tests.standalone.standalone_harness import FAST_ROLLOUT, Serve, ai_feature, ai_model, write_manifests
from tests.support.polling import wait_until

pytestmark = pytest.mark.slow


def _features(good: str, bad: str, crashing: str = "tiny-a") -> list[dict[str, object]]:
    names = {"good": good, "bad": bad, "crashing": crashing}
    return [ai_feature(feature, model, rollout=FAST_ROLLOUT) for feature, model in names.items()]


@pytest.fixture(scope="module")
def served(tiny_llama_dir: Path, nan_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    root = tmp_path_factory.mktemp("canary")
    manifests = root / "manifests"
    manifests.mkdir()
    models = [ai_model("tiny-a", str(tiny_llama_dir)), ai_model("tiny-b", str(tiny_llama_dir))]
    models.append(ai_model("tiny-bad", str(nan_llama_dir)))
    models.append(ai_model("tiny-c", str(tiny_llama_dir)))
    write_manifests(manifests / "models.yaml", models)
    write_manifests(manifests / "features.yaml", _features("tiny-a", "tiny-a"))
    serve = Serve(manifests, root / "state")
    try:
        serve.wait_ready(["tiny-a", "tiny-b", "tiny-bad", "tiny-c"])
        yield serve
    finally:
        serve.kill_everything()


def _status(served: Serve, feature: str) -> AIFeatureStatus:
    found = served.must_state().feature(feature)
    assert found is not None
    return found.status


def _drive(served: Serve, feature: str, answered: Counter[str], until: str) -> AIFeatureStatus:
    """Send requests (sampled, a few tokens) until the feature's phase is `until`; count who answered."""
    client = served.client()

    def one_request_then_check() -> AIFeatureStatus | None:
        try:
            reply = client.chat.completions.create(
                model=feature, messages=[{"role": "user", "content": "Hello"}], max_tokens=2, temperature=1.0
            )
            answered[reply.model] += 1
        except openai.InternalServerError as exc:
            answered[f"error {exc.status_code}"] += 1
        status = _status(served, feature)
        # Promoted and rolled back are both final: the other one ends the wait at once, with the analysis.
        assert status.phase not in {"Stable", "RolledBack"} - {until}, status.last_analysis
        return status if status.phase == until else None

    try:
        return wait_until(f"feature {feature} to reach {until}", one_request_then_check, 60)
    except AssertionError as exc:
        story = f"{_status(served, feature)}\nanswered: {answered}\n{served.log()[-3000:]}"
        raise AssertionError(f"{exc}\n{story}") from None


def _switch(served: Serve, good: str, bad: str, crashing: str = "tiny-a") -> None:
    write_manifests(Path(served.must_state().inputs[0]) / "features.yaml", _features(good, bad, crashing))


def test_a_good_canary_is_promoted(served: Serve) -> None:
    assert _status(served, "good").stable_model == "tiny-a"
    _switch(served, good="tiny-b", bad="tiny-a")
    wait_until("the canary to start", lambda: _status(served, "good").canary_model == "tiny-b", 10)

    answered: Counter[str] = Counter()
    status = _drive(served, "good", answered, until="Stable")
    assert status.stable_model == "tiny-b"
    assert status.canary_model is None
    assert [w.model_dump() for w in status.weights] == [{"model": "tiny-b", "weight": 100}]
    verdicts = [a.verdict for a in status.analyses]
    assert "advance" in verdicts, verdicts
    assert verdicts[-1] == "promote", verdicts
    assert answered["tiny-a"] > 0, answered  # traffic was split on the way
    assert answered["tiny-b"] > 0, answered
    assert not [k for k in answered if k.startswith("error")], answered

    wait_until("the gateway to apply the promotion", lambda: served.gateway_weights("good") == {"tiny-b": 100}, 10)
    after: Counter[str] = Counter()
    for _ in range(6):
        reply = served.client().chat.completions.create(
            model="good", messages=[{"role": "user", "content": "Hi"}], max_tokens=1
        )
        after[reply.model] += 1
    assert after == Counter({"tiny-b": 6})


def test_a_failing_canary_is_rolled_back(served: Serve) -> None:
    assert _status(served, "bad").stable_model == "tiny-a"
    _switch(served, good="tiny-b", bad="tiny-bad")
    wait_until("the canary to start", lambda: _status(served, "bad").canary_model == "tiny-bad", 10)

    answered: Counter[str] = Counter()
    status = _drive(served, "bad", answered, until="RolledBack")
    assert answered["error 500"] > 0, answered  # the canary really failed requests
    assert status.stable_model == "tiny-a"
    assert status.rolled_back_model == "tiny-bad"
    assert [w.model_dump() for w in status.weights] == [{"model": "tiny-a", "weight": 100}]
    last = status.last_analysis
    assert last is not None
    assert last.verdict == "rollback"
    assert last.canary_error_rate is not None
    assert last.canary_error_rate > 0.05
    degraded = [c for c in status.conditions if c.type == "Degraded"]
    assert degraded
    assert degraded[0].status == "True"

    shown = served.cli("status")
    assert "rollback" in shown.stdout, shown.stdout
    assert "tiny-bad" in shown.stdout, shown.stdout
    wait_until("the gateway to apply the rollback", lambda: served.gateway_weights("bad") == {"tiny-a": 100}, 10)
    after: Counter[str] = Counter()
    for _ in range(6):  # sampled requests, which the corrupted model cannot answer
        reply = served.client().chat.completions.create(
            model="bad", messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=1.0
        )
        after[reply.model] += 1
    assert after == Counter({"tiny-a": 6})


def test_a_canary_whose_runtime_keeps_crashing_is_rolled_back(served: Serve) -> None:
    """A canary that is down sends the gateway elsewhere, so its window has too few requests for a verdict:
    what rolls it back is its own word (the supervisor's, as an AIModel's Degraded condition in a cluster)."""
    _switch(served, good="tiny-b", bad="tiny-bad", crashing="tiny-c")
    wait_until("the canary to take traffic", lambda: _status(served, "crashing").canary_weight == 50, 30)
    kills = 0

    def kill_whenever_running() -> AIFeatureStatus | None:
        nonlocal kills
        model = served.must_state().model("tiny-c")
        if model is not None and model.pid is not None:
            try:
                os.kill(model.pid, signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass
        status = _status(served, "crashing")
        return status if status.phase == "RolledBack" else None

    status = wait_until("the crashing canary to be rolled back", kill_whenever_running, 60, interval=0.2)
    assert kills >= 1
    assert status.rolled_back_model == "tiny-c"
    assert [w.model_dump() for w in status.weights] == [{"model": "tiny-a", "weight": 100}]
    last = status.last_analysis
    assert last is not None
    assert (last.outcome, last.verdict) == ("fail", "rollback")
    assert "canary tiny-c is not Ready: RuntimeCrashLoop: the runtime exited with code -9" in last.message, last.message
