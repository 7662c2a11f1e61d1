"""A canary from a transformers model to the same model on the llama.cpp engine (its GGUF), through the local
gateway: `servlane serve` runs both, the feature moves on the analysis of real traffic, and once promoted every
answer comes from the llama.cpp runtime."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from servlane_devtools.tiny_model import gguf_of
from tests.standalone.standalone_harness import Serve, ai_feature, ai_model, write_manifests
from tests.support.polling import wait_until

pytestmark = pytest.mark.slow

ROLLOUT = {"steps": [50, 100], "interval": "1s", "analysis": {"minRequests": 3, "maxErrorRate": 0.05}}


@pytest.fixture(scope="module")
def served(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    root = tmp_path_factory.mktemp("llamacpp-canary")
    manifests = root / "manifests"
    manifests.mkdir()
    gguf = gguf_of(tiny_llama_dir)
    models = [ai_model("tiny-hf", str(tiny_llama_dir)), ai_model("tiny-gguf", str(gguf.parent), engine="llamacpp")]
    write_manifests(manifests / "models.yaml", models)
    write_manifests(manifests / "features.yaml", [ai_feature("chat", "tiny-hf", rollout=ROLLOUT)])
    serve = Serve(manifests, root / "state")
    try:
        serve.wait_ready(["tiny-hf", "tiny-gguf"])
        yield serve
    finally:
        serve.kill_everything()


def test_a_canary_onto_the_llamacpp_engine_is_promoted_under_traffic(served: Serve) -> None:
    inputs = Path(served.must_state().inputs[0])
    write_manifests(inputs / "features.yaml", [ai_feature("chat", "tiny-gguf", rollout=ROLLOUT)])
    client = served.client()
    answered: Counter[str] = Counter()

    def one_request_then_check() -> str | None:
        reply = client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "Hello"}], max_tokens=2, temperature=1.0
        )
        answered[reply.model] += 1
        feature = served.must_state().feature("chat")
        assert feature is not None
        return feature.status.phase if feature.status.stable_model == "tiny-gguf" else None

    try:
        assert wait_until("chat promoted to tiny-gguf", one_request_then_check, 90) == "Stable"
    except AssertionError as exc:
        feature = served.must_state().feature("chat")
        raise AssertionError(
            f"{exc}\n{feature.status if feature else None}\n{answered}\n{served.log()[-3000:]}"
        ) from None
    assert answered["tiny-hf"] > 0, answered  # the split was real
    assert answered["tiny-gguf"] > 0, answered
    feature = served.must_state().feature("chat")
    assert feature is not None
    assert [a.verdict for a in feature.status.analyses][-1] == "promote"
    wait_until("the gateway to apply the promotion", lambda: served.gateway_weights("chat") == {"tiny-gguf": 100}, 10)
    after = Counter(
        client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "Hi"}], max_tokens=1).model
        for _ in range(6)
    )
    assert after == Counter({"tiny-gguf": 6})
