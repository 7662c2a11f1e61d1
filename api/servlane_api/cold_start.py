"""Cold starts, both sides of the contract: what the runtime reports of its own start (GET /startup on its
metrics port) and what the AIModel's status shows of its pods' starts (status.coldStart).

The runtime records the wall-clock time at which it reached each phase of RUNTIME_PHASES; the operator puts
them beside what Kubernetes reports of the pod (created, scheduled, image ready, container started, Ready)
and writes each step's seconds (servlane_core.cold_start). Wall-clock times, not monotonic ones: the
runtime's clock and the kubelet's are the same node's, and that is what lets the two be compared.
"""

from __future__ import annotations

import math
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from servlane_api._base import ApiModel

# The runtime serves its RuntimeStartup here, on the metrics port (beside /metrics).
STARTUP_PATH = "/startup"

RuntimePhase = Literal[
    "process_start", "imports_done", "weights_fetched", "engine_loaded", "ready", "first_request", "first_token"
]
# In the order a start reaches them. process_start: the process was exec'd (from the kernel's record, so the
# interpreter's own start-up is inside imports); imports_done: the server's code imported, about to listen;
# weights_fetched: the model's files are local (downloaded or found); engine_loaded: the engine (torch,
# vLLM) imported and the weights loaded; ready: the warm-up token served, /ready answers 200; first_request:
# the first inference request (a POST under /v1/) reached the server after ready, before its body was read (for
# a model woken from zero, when the gateway let its held request go: ready -> first_request is the gateway's
# part); first_token: the first token (or embedding) of a real request served.
RUNTIME_PHASES: tuple[RuntimePhase, ...] = (
    "process_start",
    "imports_done",
    "weights_fetched",
    "engine_loaded",
    "ready",
    "first_request",
    "first_token",
)

# status.coldStart keeps at most this many recent starts (their median is what a user can expect).
MAX_COLD_START_SAMPLES = 10


class RuntimeStartup(BaseModel):
    """The JSON at GET /startup: each phase reached, as Unix seconds (absent until reached).

    The operator reads this from a pod a tenant may control (spec.image): anything else in it is dropped (a
    phase this version does not know too, so a newer runtime's start is still told), and a time that is not a
    finite positive number is refused."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    phases: dict[RuntimePhase, float] = Field(default_factory=dict)

    @field_validator("phases", mode="before")
    @classmethod
    def _known(cls, phases: Any) -> Any:
        if isinstance(phases, dict):
            return {name: at for name, at in phases.items() if name in RUNTIME_PHASES}
        return phases

    @field_validator("phases")
    @classmethod
    def _finite(cls, phases: dict[RuntimePhase, float]) -> dict[RuntimePhase, float]:
        for name, at in phases.items():
            if not math.isfinite(at) or at <= 0:
                raise ValueError(f"phase {name}: {at} is not a time")
        return phases


class ColdStartPhases(ApiModel):
    """Seconds each step of a pod's start took, from the step before it (absent: not known).
    Their sum up to podReady is `total`; firstToken comes after and is not part of it."""

    scheduled: float | None = Field(default=None, description="Pod created → scheduled to a node.")
    image_ready: float | None = Field(
        default=None, description="Scheduled → image pulled or found on the node (sandbox and volumes included)."
    )
    container_started: float | None = Field(default=None, description="Image ready → container running.")
    runtime_imports: float | None = Field(
        default=None, description="Container running → the runtime's code imported (interpreter start included)."
    )
    weights_fetched: float | None = Field(default=None, description="Imports done → model files local.")
    engine_loaded: float | None = Field(default=None, description="Files local → engine imported, weights loaded.")
    runtime_ready: float | None = Field(default=None, description="Engine loaded → warm-up served, /ready says 200.")
    pod_ready: float | None = Field(
        default=None, description="Runtime ready → the pod's Ready condition (the kubelet's probes)."
    )
    first_token: float | None = Field(
        default=None, description="Pod Ready → the first token of a real request served (not part of total)."
    )
    total: float | None = Field(default=None, description="Pod created → pod Ready.")


class ColdStartSample(ColdStartPhases):
    pod: str = Field(description="The pod whose start this was.")
    created: str = Field(description="The pod's creationTimestamp.")


class ColdStartStatus(ApiModel):
    last: ColdStartSample | None = Field(default=None, description="The most recent pod start.")
    median: ColdStartPhases | None = Field(default=None, description="Each phase's median over `recent`.")
    recent: list[ColdStartSample] = Field(
        default_factory=list,
        max_length=MAX_COLD_START_SAMPLES,
        description=f"The last {MAX_COLD_START_SAMPLES} pod starts, oldest first.",
    )


ColdStartField = Literal[
    "scheduled",
    "image_ready",
    "container_started",
    "runtime_imports",
    "weights_fetched",
    "engine_loaded",
    "runtime_ready",
    "pod_ready",
    "first_token",
    "total",
]
COLD_START_FIELDS: tuple[ColdStartField, ...] = get_args(ColdStartField)  # in phase order
