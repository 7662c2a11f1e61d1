"""Typed views of what the cluster reports about an AIModel's children, parsed from raw objects.

Handlers parse watched Deployments and Pods into these once; the status logic reads only these.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from servlane_core.redaction import redact
from servlane_operator.labels import TEMPLATE_HASH_ANNOTATION

# Container waiting reasons that will not fix themselves without a change.
BLOCKING_WAIT_REASONS = frozenset(
    {"CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError", "InvalidImageName"}
)
# Waiting reasons of a pull that failed. The kubelet reports a failed image volume pull on each container that
# mounts the volume, under these reasons, with a message that names the volume's reference.
PULL_FAILED_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"})


@dataclass(frozen=True)
class DeploymentView:
    generation: int
    observed_generation: int
    desired: int
    replicas: int
    ready: int
    updated: int
    available: int
    deadline_exceeded: bool
    resource_version: str = ""
    # Field managers that server-side applied spec.replicas (the operator's while a budget pins it).
    replicas_appliers: frozenset[str] = frozenset()
    # Its strategy replaces every pod at once (builders.deployment.REPLACE_ALL), as when none was ready.
    replaces_all: bool = False
    # The hash of the pod template the operator last applied (labels.TEMPLATE_HASH_ANNOTATION); "" if none.
    template_hash: str = ""

    @property
    def rolling_out(self) -> bool:
        """A rollout has not finished: the controller has not seen the spec yet, or old pods remain."""
        return self.observed_generation < self.generation or self.replicas > self.updated

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> DeploymentView:
        meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status") or {}
        conditions = status.get("conditions") or []
        deadline = any(
            c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded" for c in conditions
        )
        return cls(
            generation=int(meta.get("generation", 0)),
            observed_generation=int(status.get("observedGeneration", 0)),
            desired=int(spec.get("replicas", 1)),
            replicas=int(status.get("replicas", 0)),
            ready=int(status.get("readyReplicas", 0)),
            updated=int(status.get("updatedReplicas", 0)),
            available=int(status.get("availableReplicas", 0)),
            deadline_exceeded=deadline,
            resource_version=str(meta.get("resourceVersion", "")),
            replicas_appliers=replicas_appliers(meta.get("managedFields") or []),
            replaces_all=replaces_all(spec.get("strategy") or {}),
            template_hash=template_hash_of(meta),
        )


def template_hash_of(metadata: Mapping[str, Any]) -> str:
    return str((metadata.get("annotations") or {}).get(TEMPLATE_HASH_ANNOTATION, ""))


def replaces_all(strategy: Mapping[str, Any]) -> bool:
    """Whether a Deployment strategy lets every old pod go at once, with no new pod beside them."""
    rolling = strategy.get("rollingUpdate") or {}
    return str(rolling.get("maxSurge")) == "0" and str(rolling.get("maxUnavailable")) == "100%"


def replicas_appliers(managed_fields: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """The managers whose server-side apply owns spec.replicas (updates, e.g. the HPA's, are not applies)."""
    return frozenset(
        str(entry.get("manager", ""))
        for entry in managed_fields
        if entry.get("operation") == "Apply" and "f:replicas" in ((entry.get("fieldsV1") or {}).get("f:spec") or {})
    )


@dataclass(frozen=True)
class ContainerExit:
    """A container's last non-zero exit, kept only while the container is not ready again (restarting,
    backing off, or loading once more): a pod that recovered is not reported for its past."""

    container: str
    exit_code: int
    # Its termination message (the runtime's one-line reason, or the log tail with FallbackToLogsOnError),
    # else the kubelet's reason (OOMKilled, Error).
    message: str
    restarts: int
    backing_off: bool

    @classmethod
    def parse(cls, container_status: Mapping[str, Any]) -> ContainerExit | None:
        if container_status.get("ready"):
            return None
        state, last = container_status.get("state") or {}, container_status.get("lastState") or {}
        terminated = state.get("terminated") or last.get("terminated") or {}
        code = int(terminated.get("exitCode") or 0)
        if code == 0:
            return None
        waiting = state.get("waiting") or {}
        return cls(
            container=str(container_status.get("name", "")),
            exit_code=code,
            # Redacted again: the log tail (FallbackToLogsOnError) has not been through the runtime's redaction,
            # and what is written here reaches the AIModel's conditions and events.
            message=redact(str(terminated.get("message") or terminated.get("reason") or f"exit code {code}").strip()),
            restarts=int(container_status.get("restartCount") or 0),
            backing_off=waiting.get("reason") == "CrashLoopBackOff",
        )


def names_image(message: str, reference: str) -> bool:
    """Whether a kubelet/containerd message names `reference` (as given, or with the default tag the kubelet
    adds), not merely a longer name that starts like it (`r.io/m:v1` is not `r.io/m:v10`)."""
    return (
        re.search(re.escape(reference) + r"(?![A-Za-z0-9_.:/@-])|" + re.escape(reference) + ":latest", message)
        is not None
    )


def image_volume_references(pod_spec: Mapping[str, Any]) -> list[str]:
    return [
        str(v["image"]["reference"]) for v in pod_spec.get("volumes") or [] if (v.get("image") or {}).get("reference")
    ]


@dataclass(frozen=True)
class PodView:
    name: str
    unschedulable_message: str | None
    blocking_reason: str | None
    blocking_message: str | None
    runtime_exit: ContainerExit | None = None
    # The kubelet's message when the pod's image volume (an oci:// model source) cannot be pulled.
    model_image_failure: str | None = None
    # On a node, not Ready yet, not leaving, nothing blocking and no container restarted: a first start on its
    # way (image, container, the model loading). The autoscaler does not count a model idle while it starts.
    starting: bool = False
    # The hash of the template it was made from (labels.TEMPLATE_HASH_ANNOTATION); "" if made before we set one.
    template_hash: str = ""

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> PodView:
        status = body.get("status") or {}
        unschedulable = None
        for cond in status.get("conditions") or []:
            if (cond.get("type"), cond.get("status"), cond.get("reason")) == ("PodScheduled", "False", "Unschedulable"):
                unschedulable = str(cond.get("message") or "the pod cannot be scheduled")
        reason = message = None
        runtime_exit = None
        model_image_failure = None
        volume_images = image_volume_references(body.get("spec") or {})
        for cs in status.get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in BLOCKING_WAIT_REASONS:
                reason, message = str(waiting["reason"]), str(waiting.get("message") or waiting["reason"])
            if waiting.get("reason") in PULL_FAILED_REASONS and any(
                names_image(str(waiting.get("message") or ""), ref) for ref in volume_images
            ):
                model_image_failure = f"{waiting['reason']}: {waiting.get('message')}"
            runtime_exit = ContainerExit.parse(cs) or runtime_exit
        leaving = bool(body.get("metadata", {}).get("deletionTimestamp"))
        if leaving:
            runtime_exit = None  # stopped on purpose (rollout, scale-down): SIGTERM's exit is no crash
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        restarted = any(cs.get("restartCount") for cs in status.get("containerStatuses") or [])
        scheduled = bool((body.get("spec") or {}).get("nodeName"))
        starting = scheduled and not (ready or leaving or restarted or reason or runtime_exit or model_image_failure)
        return cls(
            name=str(body.get("metadata", {}).get("name", "")),
            unschedulable_message=unschedulable,
            blocking_reason=reason,
            blocking_message=message,
            runtime_exit=runtime_exit,
            model_image_failure=model_image_failure,
            starting=starting,
            template_hash=template_hash_of(body.get("metadata") or {}),
        )


# What the operator reads of an AIModel's metadata (owner references, status, Events, reconcile).
_KEPT_METADATA = ("name", "namespace", "uid", "generation", "resourceVersion", "labels")


def aimodel_index_entry(body: Mapping[str, Any]) -> dict[str, Any]:
    """The copy of an AIModel that the operator's index keeps between its events: spec, status and the
    metadata it reads. managedFields and annotations are left out: kopf's last-handled-configuration
    annotation repeats the whole spec, and with managedFields they were most of the bytes of each of a
    thousand copies held in memory."""
    meta = body.get("metadata") or {}
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {key: meta[key] for key in _KEPT_METADATA if key in meta},
        "spec": body.get("spec") or {},
        "status": body.get("status") or {},
    }
