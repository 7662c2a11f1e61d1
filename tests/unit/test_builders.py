"""The pure builders: typed AIModel in, the objects Kubernetes gets out."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from servlane_api.runtime_config import ENV_VAR, RuntimeConfig
from servlane_operator.builders import (
    build_deployment,
    build_service,
    endpoint_url,
    plan_children,
    runtime_image,
)
from servlane_operator.main import main as operator_main
from servlane_operator.settings import (
    DEFAULT_RUNTIME_IMAGE_CPU,
    DEFAULT_RUNTIME_IMAGE_GPU,
    OperatorSettings,
)
from tests.support.aimodels import make_model
from tests.support.structural_cases import STRUCTURAL_CASES
from tests.unit.conftest import CPU_IMAGE, GPU_IMAGE

GPU_SPEC: dict[str, Any] = {
    "source": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct@main", "credentialsSecret": "hf-token"},
    "engine": "vllm",
    "resources": {"gpus": 2, "cpu": "8", "memory": "64Gi"},
    "engineOptions": {
        "dtype": "bfloat16",
        "maxModelLen": 8192,
        "gpuMemoryUtilization": 0.9,
        "toolCallParser": "llama3_json",
        "extraArgs": ["--enable-prefix-caching"],
    },
}
CPU_SPEC: dict[str, Any] = {"source": {"uri": "/models/tiny"}, "engine": "transformers", "resources": {"cpu": "2"}}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def runtime_config(deployment: dict[str, Any]) -> RuntimeConfig:
    env = {e["name"]: e.get("value") for e in container(deployment)["env"]}
    return RuntimeConfig.model_validate_json(env[ENV_VAR])


def test_gpu_model_requests_gpus_and_maps_options_to_the_runtime(settings: OperatorSettings) -> None:
    dep = build_deployment(make_model(GPU_SPEC), settings)
    c = container(dep)
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "2", "cpu": "8", "memory": "64Gi"}
    assert c["resources"]["requests"] == {"cpu": "8", "memory": "64Gi"}
    assert c["image"] == GPU_IMAGE
    assert c["envFrom"] == [{"secretRef": {"name": "hf-token"}}]
    cfg = runtime_config(dep)
    assert cfg.engine == "vllm"
    assert cfg.tensor_parallel_size == 2
    assert cfg.model_source == "hf://meta-llama/Llama-3.1-8B-Instruct@main"
    assert cfg.served_model_name == "llama"
    assert (cfg.dtype, cfg.max_model_len, cfg.gpu_memory_utilization) == ("bfloat16", 8192, 0.9)
    assert cfg.extra_args == ["--enable-prefix-caching"]
    assert cfg.tool_call_parser == "llama3_json"
    pod = dep["spec"]["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    # A surge pod would wait for the GPU the old pod holds: GPU models replace in place.
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_cpu_model_has_no_gpu_and_surges_for_zero_downtime(settings: OperatorSettings) -> None:
    dep = build_deployment(make_model(CPU_SPEC), settings)
    c = container(dep)
    assert "limits" not in c["resources"] or "nvidia.com/gpu" not in c["resources"]["limits"]
    assert "tolerations" not in dep["spec"]["template"]["spec"]
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert runtime_config(dep).tensor_parallel_size == 1
    assert runtime_config(dep).engine == "transformers"
    assert runtime_config(dep).tool_call_parser is None  # unset: each engine's default (hermes)
    assert c["image"] == CPU_IMAGE


@pytest.mark.parametrize(("gpus", "expected"), [(0, CPU_IMAGE), (1, GPU_IMAGE), (8, GPU_IMAGE)])
def test_runtime_image_follows_the_gpu_count(settings: OperatorSettings, gpus: int, expected: str) -> None:
    spec = make_model({**CPU_SPEC, "resources": {"gpus": gpus}}).spec
    assert runtime_image(spec, settings) == expected


@pytest.mark.parametrize("gpus", [0, 1, 8])
def test_spec_image_overrides_both_runtime_images(settings: OperatorSettings, gpus: int) -> None:
    model = make_model({**CPU_SPEC, "resources": {"gpus": gpus}, "image": "my/runtime:1"})
    assert runtime_image(model.spec, settings) == "my/runtime:1"
    assert container(build_deployment(model, settings))["image"] == "my/runtime:1"


def test_runtime_image_settings_from_the_environment() -> None:
    defaults = OperatorSettings.from_env({})
    assert (defaults.runtime_image_gpu, defaults.runtime_image_cpu) == (
        DEFAULT_RUNTIME_IMAGE_GPU,
        DEFAULT_RUNTIME_IMAGE_CPU,
    )
    assert DEFAULT_RUNTIME_IMAGE_GPU == "ghcr.io/servlane/runtime:0.1.0-cuda"
    assert DEFAULT_RUNTIME_IMAGE_CPU == "ghcr.io/servlane/runtime:0.1.0-cpu"
    env = {"SERVLANE_RUNTIME_IMAGE_GPU": "r/rt:2-cuda", "SERVLANE_RUNTIME_IMAGE_CPU": "r/rt:2-cpu"}
    settings = OperatorSettings.from_env(env)
    assert (settings.runtime_image_gpu, settings.runtime_image_cpu) == ("r/rt:2-cuda", "r/rt:2-cpu")


@pytest.mark.parametrize("value", ["ghcr.io/servlane/runtime:0.1.0", ""])
def test_the_removed_single_runtime_image_variable_is_refused(value: str) -> None:
    env = {"SERVLANE_RUNTIME_IMAGE": value, "SERVLANE_RUNTIME_IMAGE_CPU": "r/rt:2-cpu"}
    with pytest.raises(ValueError, match="SERVLANE_RUNTIME_IMAGE_GPU") as info:
        OperatorSettings.from_env(env)
    assert "SERVLANE_RUNTIME_IMAGE_CPU" in str(info.value)


def test_the_operator_exits_cleanly_with_the_settings_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SERVLANE_RUNTIME_IMAGE", "ghcr.io/servlane/runtime:0.1.0")
    assert operator_main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servlane-operator: invalid settings: SERVLANE_RUNTIME_IMAGE ")
    assert "SERVLANE_RUNTIME_IMAGE_GPU" in err
    assert "SERVLANE_RUNTIME_IMAGE_CPU" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("name", ["amd.com/gpu", "gpu.intel.com/i915", "nvidia.com/mig-1g.10gb", "a-b.c1.io/x_y"])
def test_custom_gpu_resource_name(settings: OperatorSettings, name: str) -> None:
    spec = {**CPU_SPEC, "resources": {"gpus": 1, "gpuResourceName": name}}
    c = container(build_deployment(make_model(spec), settings))
    assert c["resources"]["limits"] == {name: "1"}


@pytest.mark.parametrize(
    "name", ["gpu", "cpu", "memory", "/gpu", "nvidia.com/", "a..b/gpu", "a.-b.com/gpu", "amd-.com/gpu", "-amd.com/gpu"]
)
def test_a_gpu_resource_name_without_a_domain_is_refused(name: str) -> None:
    """The pod API refuses an extended resource without a domain (`gpu`), and `cpu` or `memory` would overwrite
    the replica's own requests: refused with the AIModel, not found when its Deployment is applied."""
    with pytest.raises(ValidationError, match="gpuResourceName"):
        make_model({**CPU_SPEC, "resources": {"gpus": 1, "gpuResourceName": name}})


def test_probes_tolerate_slow_loads_and_pods_are_locked_down(settings: OperatorSettings) -> None:
    dep = build_deployment(make_model(GPU_SPEC), settings)
    c = container(dep)
    startup = c["startupProbe"]
    assert startup["httpGet"]["path"] == "/ready"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 30 * 60
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["terminationGracePeriodSeconds"] > c["lifecycle"]["preStop"]["sleep"]["seconds"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Gi"}
    assert "/tmp" in mounts
    assert "/var/cache/servlane" in mounts


def test_the_runtime_leaves_its_exit_reason_in_the_pod_status(settings: OperatorSettings) -> None:
    c = container(build_deployment(make_model(CPU_SPEC), settings))
    # The runtime writes /dev/termination-log (the default path); a crash before that leaves the log's tail.
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert "terminationMessagePath" not in c


def test_labels_owner_and_selector(settings: OperatorSettings) -> None:
    model = make_model(GPU_SPEC)
    for obj in (build_deployment(model, settings), build_service(model)):
        meta = obj["metadata"]
        assert meta["name"] == "model-llama"
        assert meta["namespace"] == "team-a"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "servlane-operator"
        assert "app.kubernetes.io/instance" not in meta["labels"]  # Argo CD tracking label
        (owner,) = meta["ownerReferences"]
        assert owner == {
            "apiVersion": "servlane.dev/v1alpha1",
            "kind": "AIModel",
            "name": "llama",
            "uid": "uid-123",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    dep = build_deployment(model, settings)
    assert dep["spec"]["selector"]["matchLabels"] == {"servlane.dev/model": "llama"}
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels.items() >= dep["spec"]["selector"]["matchLabels"].items()
    svc = build_service(model)
    assert svc["spec"]["selector"] == {"servlane.dev/model": "llama"}
    assert svc["spec"]["ports"][0]["port"] == 8000
    assert endpoint_url(model, "cluster.local") == "http://model-llama.team-a.svc.cluster.local:8000/v1"


@pytest.mark.parametrize(
    ("uri", "expected_source", "claim"),
    [
        ("hf://Qwen/Qwen2.5-0.5B-Instruct@v1", "hf://Qwen/Qwen2.5-0.5B-Instruct@v1", None),
        ("hf://Qwen/Qwen2.5-0.5B-Instruct", "hf://Qwen/Qwen2.5-0.5B-Instruct", None),
        ("pvc://models-pvc/llama/8b", "/mnt/models/llama/8b", "models-pvc"),
        ("pvc://models-pvc", "/mnt/models", "models-pvc"),
        ("s3://bucket/models/llama", "s3://bucket/models/llama", None),
        ("/opt/models/tiny", "/opt/models/tiny", None),
    ],
)
def test_every_source_kind(settings: OperatorSettings, uri: str, expected_source: str, claim: str | None) -> None:
    dep = build_deployment(make_model({**CPU_SPEC, "source": {"uri": uri}}), settings)
    assert runtime_config(dep).model_source == expected_source
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    if claim is None:
        assert "model-source" not in volumes
    else:
        assert volumes["model-source"]["persistentVolumeClaim"] == {"claimName": claim, "readOnly": True}
        mounts = {m["name"]: m for m in container(dep)["volumeMounts"]}
        assert mounts["model-source"] == {"name": "model-source", "mountPath": "/mnt/models", "readOnly": True}


def test_cache_volume_kinds(settings: OperatorSettings) -> None:
    def cache_volume(cache: dict[str, Any] | None) -> dict[str, Any]:
        spec = {**CPU_SPEC, **({"cache": cache} if cache else {})}
        volumes = build_deployment(make_model(spec), settings)["spec"]["template"]["spec"]["volumes"]
        return next(v for v in volumes if v["name"] == "model-cache")

    assert cache_volume({"persistentVolumeClaim": "hf-cache"})["persistentVolumeClaim"] == {"claimName": "hf-cache"}
    assert cache_volume({"emptyDirSizeLimit": "50Gi"})["emptyDir"] == {"sizeLimit": "50Gi"}
    assert cache_volume(None)["emptyDir"] == {}


def test_fixed_replicas_go_to_the_deployment_and_no_hpa_is_made(settings: OperatorSettings) -> None:
    model = make_model({**CPU_SPEC, "replicas": 3})
    assert build_deployment(model, settings)["spec"]["replicas"] == 3
    plan = plan_children(model, settings)
    assert [o["kind"] for o in plan.apply] == ["Deployment", "Service", "NetworkPolicy"]
    assert plan.delete == [("autoscaling/v2", "HorizontalPodAutoscaler")]  # an older operator's HPA goes


def test_default_is_one_replica(settings: OperatorSettings) -> None:
    assert build_deployment(make_model(CPU_SPEC), settings)["spec"]["replicas"] == 1


def test_zero_replicas_are_kept(settings: OperatorSettings) -> None:
    assert build_deployment(make_model({**CPU_SPEC, "replicas": 0}), settings)["spec"]["replicas"] == 0


def test_an_autoscaled_model_runs_the_autoscalers_decision_and_gets_no_hpa(settings: OperatorSettings) -> None:
    """One writer: the Deployment carries the count the operator's autoscaler decided (status.autoscaler),
    within the bounds of the spec as it is now; there is no HPA to fight over it."""
    spec = {**CPU_SPEC, "autoscaling": {"minReplicas": 2, "maxReplicas": 6}}
    assert build_deployment(make_model(spec), settings)["spec"]["replicas"] == 2  # not decided yet: the minimum
    decided = make_model(spec, autoscaler={"desiredReplicas": 5})
    assert build_deployment(decided, settings)["spec"]["replicas"] == 5
    too_many = make_model(spec, autoscaler={"desiredReplicas": 9})
    assert build_deployment(too_many, settings)["spec"]["replicas"] == 6
    kinds = [o["kind"] for o in plan_children(decided, settings).apply]
    assert "HorizontalPodAutoscaler" not in kinds
    to_zero = {**CPU_SPEC, "autoscaling": {"minReplicas": 0, "maxReplicas": 2}}
    assert build_deployment(make_model(to_zero), settings)["spec"]["replicas"] == 1  # starts with one
    idle = make_model(to_zero, autoscaler={"desiredReplicas": 0})
    assert build_deployment(idle, settings)["spec"]["replicas"] == 0


def test_scheduling_passes_through(settings: OperatorSettings) -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}]
            }
        }
    }
    spec = {
        **GPU_SPEC,
        "scheduling": {
            "nodeSelector": {"pool": "gpu"},
            "affinity": affinity,
            "priorityClassName": "inference",
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
        },
    }
    pod = build_deployment(make_model(spec), settings)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["affinity"] == affinity
    assert pod["priorityClassName"] == "inference"
    assert pod["tolerations"][0] == {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    "value_from",
    [
        {"fieldRef": {"fieldPath": "spec.containers[0].image"}},
        {"fieldRef": {"fieldPath": "metadata.labels"}},
        {"fieldRef": {"fieldPath": "metadata.labels['bad key']"}},
        {"fieldRef": {"fieldPath": "metadata.name", "apiVersion": "v2"}},
        {"resourceFieldRef": {"resource": "limits.gpu-count"}},
        {"resourceFieldRef": {"resource": "limits.nvidia.com/gpu"}},
    ],
)
def test_an_env_var_reads_only_what_the_pod_api_lets_it(value_from: dict[str, Any]) -> None:
    """A field or resource the pod API does not offer an env var was passed on and refused with the Deployment."""
    with pytest.raises(ValidationError, match="valueFrom"):
        make_model({**CPU_SPEC, "env": [{"name": "A", "valueFrom": value_from}]})


@pytest.mark.parametrize(
    "path",
    [
        "metadata.name",
        "metadata.namespace",
        "metadata.uid",
        "metadata.labels['app.kubernetes.io/name']",
        "metadata.annotations['note']",
        "spec.nodeName",
        "spec.serviceAccountName",
        "status.hostIP",
        "status.hostIPs",
        "status.podIP",
        "status.podIPs",
    ],
)
def test_every_field_the_pod_api_offers_an_env_var_is_taken(path: str, settings: OperatorSettings) -> None:
    env = [{"name": "A", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}]
    c = container(build_deployment(make_model({**CPU_SPEC, "env": env}), settings))
    assert {"name": "A", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}} in c["env"]


def test_a_whole_affinity_reaches_the_pods_as_written(settings: OperatorSettings) -> None:
    """Typed for validation, it is written back exactly: every field kept, nothing added (no defaults)."""
    whole = next(case.manifest for case in STRUCTURAL_CASES if case.id == "a-whole-affinity")
    affinity = whole["spec"]["scheduling"]["affinity"]
    pod = build_deployment(make_model({**CPU_SPEC, "scheduling": {"affinity": affinity}}), settings)
    assert pod["spec"]["template"]["spec"]["affinity"] == affinity


def test_image_override_and_user_env(settings: OperatorSettings) -> None:
    spec = {
        **CPU_SPEC,
        "image": "my/runtime:1",
        "env": [
            {"name": "LOG_LEVEL", "value": "debug"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        ],
    }
    c = container(build_deployment(make_model(spec), settings))
    assert c["image"] == "my/runtime:1"
    env = {e["name"]: e for e in c["env"]}
    assert env["LOG_LEVEL"] == {"name": "LOG_LEVEL", "value": "debug"}
    assert env["TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "s", "key": "k"}}
    assert json.loads(env[ENV_VAR]["value"])["served_model_name"] == "llama"


def test_served_model_name_override(settings: OperatorSettings) -> None:
    dep = build_deployment(make_model({**CPU_SPEC, "servedModelName": "llama-3.1-8b"}), settings)
    assert runtime_config(dep).served_model_name == "llama-3.1-8b"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({**CPU_SPEC, "replicas": 2, "autoscaling": {"maxReplicas": 3}}, "either replicas or autoscaling"),
        ({**CPU_SPEC, "autoscaling": {"minReplicas": 5, "maxReplicas": 3}}, "minReplicas must not exceed"),
        ({**CPU_SPEC, "autoscaling": {"maxReplicas": 3, "targetKVCacheUsage": 0.8}}, "vllm engine only"),
        ({**CPU_SPEC, "source": {"uri": "ftp://x/y"}}, "source.uri must be"),
        ({**CPU_SPEC, "engine": "tgi"}, "Input should be 'vllm', 'transformers' or 'llamacpp'"),
        ({**CPU_SPEC, "resources": {"gpus": -1}}, "greater than or equal to 0"),
        ({"engine": "vllm"}, "Field required"),
    ],
)
def test_bad_specs_are_rejected_with_a_reason(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        make_model(spec)


def test_the_index_copy_of_an_aimodel_plans_the_same_children_without_managed_fields_or_kopf_annotations(
    settings: OperatorSettings,
) -> None:
    from servlane_operator.aimodel_reconciler import parse_model
    from servlane_operator.observed import aimodel_index_entry

    body = make_model(CPU_SPEC).model_dump(by_alias=True, mode="json")
    body["metadata"].update(
        generation=3,
        resourceVersion="42",
        annotations={"servlane.dev/last-handled-configuration": json.dumps({"spec": CPU_SPEC})},
        managedFields=[{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}],
    )
    entry = aimodel_index_entry(body)
    assert "managedFields" not in entry["metadata"]
    assert "annotations" not in entry["metadata"]
    assert plan_children(parse_model(entry), settings) == plan_children(parse_model(body), settings)
    assert parse_model(entry).metadata["generation"] == 3


def test_model_pods_trace_only_when_the_operator_is_told_where(settings: OperatorSettings) -> None:
    plain = {e["name"] for e in container(build_deployment(make_model(CPU_SPEC), settings))["env"]}
    assert not [name for name in plain if name.startswith("OTEL_")]
    traced = settings.model_copy(
        update={"tracing_otlp_endpoint": "http://collector:4318", "tracing_sampling_ratio": 0.1}
    )
    env = {e["name"]: e.get("value") for e in container(build_deployment(make_model(CPU_SPEC), traced))["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4318"
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"  # what vLLM's own exporter reads
    assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.1"
