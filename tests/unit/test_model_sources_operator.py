"""oci:// model images (issue #31 item 2) and failures named ModelSourceFailed (item 4), on the operator's side:
the pure Deployment builder, the pod view and the status decision."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servlane_api.runtime_config import ENV_VAR, RuntimeConfig
from servlane_api.runtime_exit import MODEL_LOAD_FAILED, MODEL_SOURCE_FAILED
from servlane_cli.local_config import local_runtime
from servlane_operator.builders import build_deployment
from servlane_operator.observed import PodView
from servlane_operator.settings import OperatorSettings
from servlane_operator.status import build_status, decide
from tests.support.aimodels import make_model
from tests.support.status import dep
from tests.unit.conftest import CPU_IMAGE

REF = "registry.example.com/models/tiny-llama:v1"
OCI_SPEC: dict[str, Any] = {"source": {"uri": f"oci://{REF}"}, "engine": "transformers", "resources": {"cpu": "2"}}


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = pod_spec(deployment)["containers"]
    return dict(only)


def runtime_config(deployment: dict[str, Any]) -> RuntimeConfig:
    env = {e["name"]: e.get("value") for e in container(deployment)["env"]}
    return RuntimeConfig.model_validate_json(env[ENV_VAR])


@pytest.mark.parametrize(
    "ref", [REF, "localhost:5000/m", "registry.example.com/m@sha256:" + "ab" * 32, "10.0.0.1:5000/team__a/m-1"]
)
def test_an_oci_source_is_an_image_volume_mounted_read_only_at_the_model_path(
    settings: OperatorSettings, ref: str
) -> None:
    deployment = build_deployment(make_model({**OCI_SPEC, "source": {"uri": f"oci://{ref}"}}), settings)
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    assert volumes["model-source"] == {
        "name": "model-source",
        "image": {"reference": ref, "pullPolicy": "IfNotPresent"},
    }
    mounts = {m["name"]: m for m in container(deployment)["volumeMounts"]}
    assert mounts["model-source"] == {"name": "model-source", "mountPath": "/mnt/model-image", "readOnly": True}
    # The runtime serves the mounted files: nothing to download, and the reference is no source it would fetch.
    assert runtime_config(deployment).model_source == "/mnt/model-image"
    assert container(deployment)["image"] == CPU_IMAGE


def test_an_oci_credentials_secret_is_the_pods_image_pull_secret_never_its_env(settings: OperatorSettings) -> None:
    model = make_model({**OCI_SPEC, "source": {"uri": f"oci://{REF}", "credentialsSecret": "registry-pull"}})
    deployment = build_deployment(model, settings)
    assert pod_spec(deployment)["imagePullSecrets"] == [{"name": "registry-pull"}]
    assert "envFrom" not in container(deployment)
    assert "registry-pull" not in str(container(deployment)["env"])


def test_other_sources_keep_their_secret_in_env_and_have_no_pull_secret(settings: OperatorSettings) -> None:
    model = make_model({**OCI_SPEC, "source": {"uri": "s3://bucket/m", "credentialsSecret": "aws"}})
    deployment = build_deployment(model, settings)
    assert container(deployment)["envFrom"] == [{"secretRef": {"name": "aws"}}]
    assert "imagePullSecrets" not in pod_spec(deployment)
    assert "model-source" not in {v["name"] for v in pod_spec(deployment)["volumes"]}


# --- failures named: what the kubelet reports, as it reports it (kubelet 1.36: pkg/kubelet/images) ---
RUNTIME_IMAGE = "ghcr.io/servlane/runtime:0.1.0-cpu"
NOT_FOUND = (
    f'rpc error: code = NotFound desc = failed to pull and unpack image "{REF}": failed to resolve reference '
    f'"{REF}": {REF}: not found'
)


def raw_pod(waiting_reason: str, message: str, volumes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    image_volume = {"name": "model-source", "image": {"reference": REF, "pullPolicy": "IfNotPresent"}}
    return {
        "metadata": {"name": "model-llama-abc"},
        "spec": {"volumes": [{"name": "tmp", "emptyDir": {}}, image_volume] if volumes is None else volumes},
        "status": {
            "containerStatuses": [
                {
                    "name": "runtime",
                    "ready": False,
                    "restartCount": 0,
                    "image": RUNTIME_IMAGE,
                    "state": {"waiting": {"reason": waiting_reason, "message": message}},
                }
            ]
        },
    }


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("ErrImagePull", NOT_FOUND),
        ("ImagePullBackOff", f'Back-off pulling image "{REF}": ErrImagePull: {NOT_FOUND}'),
        ("ErrImageNeverPull", f'Container image "{REF}" is not present with pull policy of Never'),
        ("ErrImagePull", f"image pull failed for {REF} because the registry is unavailable: dial tcp: i/o timeout"),
    ],
)
def test_a_model_image_that_cannot_be_pulled_is_model_source_failed_with_the_kubelets_words(
    reason: str, message: str
) -> None:
    pod = PodView.parse(raw_pod(reason, message))
    verdict = decide(make_model(OCI_SPEC), dep(desired=1, ready=0, updated=1), [pod])
    assert (verdict.phase, verdict.reason, verdict.ready) == ("Degraded", "ModelSourceFailed", False)
    assert verdict.message.startswith("pod model-llama-abc: the model image cannot be pulled: ")
    assert message in verdict.message
    assert reason in verdict.message


def test_a_runtime_image_that_cannot_be_pulled_stays_an_image_pull_problem() -> None:
    """The kubelet's message names the runtime's image, not the model's: the model source is not to blame."""
    message = f'Back-off pulling image "{RUNTIME_IMAGE}": ErrImagePull: not found'
    pod = PodView.parse(raw_pod("ImagePullBackOff", message))
    assert pod.model_image_failure is None
    verdict = decide(make_model(OCI_SPEC), dep(desired=1, ready=0, updated=1), [pod])
    assert verdict.reason == "ImagePullBackOff"


@pytest.mark.parametrize(
    ("volume_ref", "named"),
    [
        (REF, True),
        ("registry.example.com/models/tiny-llama", False),  # a shorter name is not the one pulled
        ("registry.example.com/models/tiny-llama:v10", False),
        ("registry.example.com/models/tiny-llama:v", False),
    ],
)
def test_only_a_message_naming_the_volumes_own_reference_counts(volume_ref: str, named: bool) -> None:
    volume = {"name": "model-source", "image": {"reference": volume_ref}}
    pod = PodView.parse(raw_pod("ErrImagePull", NOT_FOUND, volumes=[volume]))
    assert (pod.model_image_failure is not None) == named


def test_an_untagged_reference_is_named_with_the_default_tag_the_kubelet_adds() -> None:
    ref = "registry.example.com/models/tiny"
    volume = {"name": "model-source", "image": {"reference": ref}}
    message = f'Back-off pulling image "{ref}:latest": ErrImagePull: not found'
    assert PodView.parse(raw_pod("ImagePullBackOff", message, volumes=[volume])).model_image_failure is not None


def test_a_pod_without_image_volumes_never_blames_a_model_image() -> None:
    assert PodView.parse(raw_pod("ErrImagePull", NOT_FOUND, volumes=[])).model_image_failure is None


def exited(code: int, message: str) -> dict[str, Any]:
    body = raw_pod("CrashLoopBackOff", "back-off 10s restarting failed container", volumes=[])
    status = body["status"]["containerStatuses"][0]
    status["restartCount"] = 1
    status["lastState"] = {"terminated": {"exitCode": code, "reason": "Error", "message": message}}
    return body


def test_the_runtimes_model_source_exit_is_model_source_failed_with_the_stores_words() -> None:
    said = "s3://weights/qwen/config.json: AccessDenied: Access Denied"
    model = make_model({**OCI_SPEC, "source": {"uri": "s3://weights/qwen"}})
    status = build_status(
        model,
        dep(desired=1, ready=0, updated=1),
        [PodView.parse(exited(MODEL_SOURCE_FAILED, said))],
        observed_generation=3,
        endpoint="e",
        now="t1",
    )
    ready = next(c for c in status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "ModelSourceFailed")
    assert ready.message.endswith(f": {said}")
    assert "could not be fetched from its source" in ready.message


def test_a_load_failure_is_still_model_load_failed() -> None:
    verdict = decide(
        make_model(OCI_SPEC), dep(desired=1, ready=0, updated=1), [PodView.parse(exited(MODEL_LOAD_FAILED, "bad"))]
    )
    assert verdict.reason == "ModelLoadFailed"


def test_standalone_mode_refuses_an_oci_source_with_a_reason(tmp_path: Path) -> None:
    """`servlane serve` runs one local process: no kubelet mounts the image, so it says so instead of failing later
    on a missing /mnt/model-image."""
    with pytest.raises(ValueError, match="oci:// images are mounted by a kubelet; use a local path"):
        local_runtime(make_model(OCI_SPEC), 1, tmp_path, gpu=False)
