"""LoRA adapters end to end in standalone mode, through the gateway with the `openai` SDK.

One runtime (tiny-a) with adapters; a feature targets one adapter (`tiny-a:v1`) and a manifest edit moves
it to another (`tiny-a:v2`), which runs the same canary as between models. Adapters added to or removed
from the manifest reach the running runtime without a restart (its pid stays the same).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from servlane_api.aifeature import AIFeatureStatus
from servlane_devtools.tiny_model import build_tiny_adapter, build_tiny_llama
from tests.standalone.standalone_harness import FAST_ROLLOUT, Serve, ai_feature, ai_model, write_manifests
from tests.support.polling import wait_until

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "Hello"}]


def _write(manifests: Path, adapters: dict[str, Path], target: str) -> None:
    listed = [{"name": name, "source": str(path)} for name, path in adapters.items()]
    write_manifests(manifests / "models.yaml", [ai_model("tiny-a", str(build_tiny_llama()), adapters=listed)])
    write_manifests(manifests / "features.yaml", [ai_feature("assist", target, rollout=FAST_ROLLOUT)])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Serve, Path]]:
    root = tmp_path_factory.mktemp("adapters")
    manifests = root / "manifests"
    manifests.mkdir()
    _write(manifests, {"v1": build_tiny_adapter(1), "v2": build_tiny_adapter(2)}, "tiny-a:v1")
    serve = Serve(manifests, root / "state")
    try:
        serve.wait_ready(["tiny-a"])
        yield serve, manifests
    finally:
        serve.kill_everything()


def _status(serve: Serve) -> AIFeatureStatus:
    found = serve.must_state().feature("assist")
    assert found is not None
    return found.status


def _runtime_pid(serve: Serve) -> int | None:
    return next(m.pid for m in serve.must_state().models if m.name == "tiny-a")


def _answers(client: openai.OpenAI, model: str) -> str:
    return client.chat.completions.create(model=model, messages=HELLO, max_tokens=2).model  # type: ignore[arg-type]


def test_a_canary_between_adapters_promotes(served: tuple[Serve, Path]) -> None:
    serve, manifests = served
    client = serve.client()
    wait_until("the feature to answer", lambda: _answers(client, "assist") == "v1", 30, tolerate=_not_yet)
    assert _answers(client, "v2") == "v2"  # an adapter is callable by its own name too

    _write(manifests, {"v1": build_tiny_adapter(1), "v2": build_tiny_adapter(2)}, "tiny-a:v2")
    wait_until("the canary to start", lambda: _status(serve).canary_model == "tiny-a:v2", 10)
    answered: Counter[str] = Counter()

    def one_request_then_check() -> AIFeatureStatus | None:
        answered[_answers(client, "assist")] += 1
        status = _status(serve)
        # A rollback is final: say why at once instead of waiting out the deadline.
        assert status.phase != "RolledBack", status.last_analysis
        return status if status.phase == "Stable" and status.canary_model is None else None

    try:
        status = wait_until("the canary to be promoted", one_request_then_check, 60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_status(serve)}\nanswered: {answered}\n{serve.log()[-3000:]}") from None
    assert status.stable_model == "tiny-a:v2"
    assert [w.model_dump() for w in status.weights] == [{"model": "tiny-a:v2", "weight": 100}]
    assert status.analyses[-1].verdict == "promote"
    assert answered["v1"] > 0, answered  # the traffic was split between the adapters on the way
    assert answered["v2"] > 0, answered
    wait_until("the gateway to apply it", lambda: serve.gateway_weights("assist") == {"tiny-a:v2": 100}, 10)
    assert {_answers(client, "assist") for _ in range(4)} == {"v2"}


def test_adapters_come_and_go_without_a_restart(served: tuple[Serve, Path]) -> None:
    serve, manifests = served
    client = serve.client()
    pid = _runtime_pid(serve)
    _write(manifests, {"v2": build_tiny_adapter(2), "v3": build_tiny_adapter(3)}, "tiny-a:v2")
    wait_until("v3 to answer", lambda: _answers(client, "v3") == "v3", 60, tolerate=_not_yet)

    def v1_gone() -> bool:
        try:
            _answers(client, "v1")
        except openai.NotFoundError:
            return True
        return False

    wait_until("v1 to be gone", v1_gone, 60)
    assert _runtime_pid(serve) == pid, "the runtime restarted"
    assert _answers(client, "assist") == "v2"
    assert "v3" in {m.id for m in client.models.list()}


def _not_yet(exc: Exception) -> bool:
    # Until the gateway's routes and the runtime's adapters file have caught up: 404 or 503 (loading).
    return isinstance(exc, openai.NotFoundError) or (isinstance(exc, openai.APIStatusError) and exc.status_code == 503)
