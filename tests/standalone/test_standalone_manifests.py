"""Reading manifests for standalone mode and mapping them to runtime processes (no processes started)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from servlane_api.runtime_contract import build_runtime_config
from servlane_cli.local_config import local_runtime
from servlane_cli.main import default_inputs
from servlane_cli.manifests import ManifestError, files_signature, load_manifests
from servlane_cli.ports import local_url, port_free
from tests.standalone.standalone_harness import ai_feature, ai_model, write_manifests

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_local_example_loads_with_its_sources_resolved() -> None:
    assert default_inputs() == [REPO_ROOT / "examples" / "local"]
    manifests = load_manifests(default_inputs())
    assert sorted(manifests.models) == ["minilm", "tiny-chat"]
    assert sorted(manifests.features) == ["chat", "embeddings"]
    minilm = manifests.models["minilm"].model
    assert (Path(minilm.spec.source.uri) / "config.json").is_file()  # pkg:// -> the installed package's folder
    tiny = manifests.models["tiny-chat"]
    assert tiny.create_tiny_model
    assert tiny.model.spec.source.uri == str(Path.home() / ".cache/servlane/models/tiny-chat")


def test_relative_sources_are_relative_to_the_manifest(tmp_path: Path) -> None:
    write_manifests(tmp_path / "m.yaml", [ai_model("local", "./weights/x"), ai_model("hub", "hf://org/name@v1")])
    models = load_manifests([tmp_path]).models
    assert models["local"].model.spec.source.uri == str(tmp_path / "weights" / "x")
    assert models["hub"].model.spec.source.uri == "hf://org/name@v1"


@pytest.mark.parametrize(
    ("documents", "message"),
    [
        ([ai_model("a", "/m"), ai_model("a", "/n")], "defined twice"),
        ([ai_model("a", "pkg://no_such_package_here/x")], "not installed"),
        ([ai_feature("f", "a", split=[{"model": "a", "weight": 60}])], "exactly one of model"),
        ([ai_model("a", "/m", replicas=1, autoscaling={"maxReplicas": 2})], "either replicas or autoscaling"),
        # Refused as the API server refuses them (they were read as they came: a path `5`, a crash, a served name
        # no cluster admits, an object of an API version that does not exist).
        ([ai_model("a", 5)], "spec.source.uri: must be a string"),  # type: ignore[arg-type]
        ([{**ai_model("a", "/m"), "spec": {"source": "hf://org/name"}}], "spec.source: must be an object"),
        ([{**ai_model("a", "/m"), "spec": "hello"}], "spec: must be an object"),
        ([{**ai_model("a", "/m"), "metadata": {"name": "a", "annotations": ["x"]}}], "metadata.annotations"),
        ([ai_feature("Chat", "a")], "metadata.name: 'Chat' is not a DNS subdomain"),
        ([ai_feature("default/chat", "a")], "metadata.name: 'default/chat' is not a DNS subdomain"),
        ([{**ai_model("a", "/m"), "apiVersion": "servlane.dev/v9"}], "apiVersion: must be servlane.dev/v1alpha1"),
        ([{**ai_model("a", "/m"), "kind": "AIModle"}], "kind 'AIModle'"),
        ([{k: v for k, v in ai_model("a", "/m").items() if k != "kind"}], "kind None"),
    ],
)
def test_bad_manifests_are_refused_with_the_reason(
    tmp_path: Path, documents: list[dict[str, object]], message: str
) -> None:
    write_manifests(tmp_path / "m.yaml", documents)
    with pytest.raises(ManifestError, match=message):
        load_manifests([tmp_path])


def test_a_file_that_is_not_utf8_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "notes.yaml").write_bytes("comment: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ManifestError, match=r"notes.yaml: not UTF-8 text"):
        load_manifests([tmp_path])


def test_other_apis_objects_are_still_ignored(tmp_path: Path) -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf"}, "stringData": {"token": "x"}}
    write_manifests(tmp_path / "m.yaml", [secret, ai_model("a", "/m")])
    assert list(load_manifests([tmp_path]).models) == ["a"]


def test_an_edit_changes_the_signature(tmp_path: Path) -> None:
    write_manifests(tmp_path / "m.yaml", [ai_model("a", "/m")])
    before = files_signature([tmp_path])
    write_manifests(tmp_path / "m.yaml", [ai_model("a", "/m", task="embed")])
    assert files_signature([tmp_path]) != before


def test_runtime_config_is_the_operators_with_local_placement(tmp_path: Path) -> None:
    spec = {
        "engine": "vllm",
        "engineOptions": {"maxModelLen": 4096, "extraArgs": ["--enable-prefix-caching"]},
        "resources": {"gpus": 2, "memory": "16Gi"},
        "scheduling": {"nodeSelector": {"pool": "gpu"}},
        "env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
    }
    write_manifests(tmp_path / "m.yaml", [ai_model("big", "/models/big", **spec)])
    model = load_manifests([tmp_path]).models["big"].model
    local = local_runtime(model, 12345, tmp_path / "cache", gpu=False)
    cluster = build_runtime_config(model)
    assert (
        local.config.model_copy(
            update={
                "port": cluster.port,
                "host": cluster.host,
                "cache_dir": cluster.cache_dir,
                "tensor_parallel_size": 2,
            }
        )
        == cluster
    )
    assert (local.config.port, local.config.host, local.config.tensor_parallel_size) == (12345, "127.0.0.1", 1)
    assert local.env == {"A": "1"}
    warned = " ".join(local.warnings)
    for field in ("scheduling", "resources.gpus", "resources.cpu/memory", "valueFrom"):
        assert field in warned
    assert local_runtime(model, 1, tmp_path, gpu=True).config.tensor_parallel_size == 2
    moved = local_runtime(model, 2, tmp_path / "cache", gpu=False)
    assert moved.fingerprint() == local.fingerprint()  # the port alone does not restart a runtime


def test_each_local_runtime_gets_the_supervisors_metrics_port_which_restarts_nothing(tmp_path: Path) -> None:
    # Several runtimes and the gateway share this machine: each /metrics on the free port it is given.
    write_manifests(tmp_path / "m.yaml", [ai_model("small", "/models/small")])
    model = load_manifests([tmp_path]).models["small"].model
    first = local_runtime(model, 1000, tmp_path, gpu=False, metrics_port=1001)
    again = local_runtime(model, 2000, tmp_path, gpu=False, metrics_port=2001)
    assert (first.config.port, first.config.metrics_port) == (1000, 1001)
    assert first.fingerprint() == again.fingerprint()


def test_a_llamacpp_model_runs_on_every_local_cpu_unless_its_threads_are_set(tmp_path: Path) -> None:
    documents = [
        ai_model("q", "/models/q", engine="llamacpp", resources={"cpu": "2"}),
        ai_model(
            "p", "/models/p", engine="llamacpp", resources={"cpu": "2"}, engineOptions={"llamacpp": {"threads": 3}}
        ),
    ]
    write_manifests(tmp_path / "m.yaml", documents)
    models = load_manifests([tmp_path]).models
    assert build_runtime_config(models["q"].model).llamacpp.threads == 2  # in a pod: the CPU limit
    assert local_runtime(models["q"].model, 1, tmp_path, gpu=False).config.llamacpp.threads is None
    assert local_runtime(models["p"].model, 1, tmp_path, gpu=False).config.llamacpp.threads == 3


def test_serve_with_a_bad_manifest_says_so_and_exits_1_with_nothing_started(tmp_path: Path) -> None:
    manifest = ai_model("chat", "/m", replica=2)  # a typo of replicas: kubectl apply refuses it too
    write_manifests(tmp_path / "m.yaml", [manifest])
    argv = [sys.executable, "-m", "servlane_cli", "serve", "-f", str(tmp_path), "--port", "0"]
    argv += ["--state-dir", str(tmp_path / "state")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stderr
    assert "manifests not applied, nothing started: " in done.stderr, done.stderr
    assert "AIModel 'chat': spec.replica: unknown field" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:8080"),
        ("0.0.0.0", "http://127.0.0.1:8080"),
        ("192.0.2.2", "http://192.0.2.2:8080"),
        ("::", "http://[::1]:8080"),
        ("::1", "http://[::1]:8080"),
    ],
)
def test_serve_reaches_its_gateway_where_it_listens(host: str, url: str) -> None:
    """`--host 192.0.2.2` bound the gateway there and looked for it on 127.0.0.1 (status, chat, metrics)."""
    assert local_url(host, 8080) == url


def test_a_port_outside_the_range_is_a_usage_error_and_ipv6_hosts_are_checked_as_such() -> None:
    for port in ("99999", "-5", "http"):
        done = subprocess.run(
            [sys.executable, "-m", "servlane_cli", "serve", "--port", port],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, done.stderr  # argparse's usage error, not a traceback
        assert "is not a port number" in done.stderr
        assert "Traceback" not in done.stderr
    assert port_free("::1", 0)  # an IPv4 socket said any ::1 port was taken
