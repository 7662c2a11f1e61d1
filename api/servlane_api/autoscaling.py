"""An AIModel's autoscaling: bounds, targets on the engine's own signals, windows, and the autoscaler's status.

The operator is the only writer of an autoscaled model's replicas: it reads each ready pod's metrics port
(in-flight and waiting requests, KV-cache use where the engine reports it), decides a count
(servlane_core.scaling) and writes it to the Deployment, never to the AIModel's spec. What it decided,
and the times it needs to survive a restart, are in `status.autoscaler`.
"""

from __future__ import annotations

import re

from pydantic import Field

from servlane_api._base import ApiModel
from servlane_api.cel import CelRule, CelValidated

# The AIFeature's duration grammar (Go's time.ParseDuration accepts all of it, so CEL's duration() does).
DURATION = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_NANOSECONDS = {"ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}
MIN_SCALE_TO_ZERO_AFTER = "1s"
MAX_SCALE_TO_ZERO_AFTER = "2562047h"  # Go's longest duration (~292 years): what the API server could ever admit
_MAX_NANOSECONDS = (1 << 63) - 1


def duration_nanoseconds(text: str) -> int:
    """Nanoseconds in a duration of the DURATION grammar ("15m", "1m30s", "1.5h", "500ms"), as Go's
    time.ParseDuration counts them (CEL's duration() on the API server): whole nanoseconds, a fraction's digits
    as far as 63 bits hold them, scaled in float64 and truncated. ValueError past Go's longest duration. (Float
    seconds summed in Python admitted 2562047h0.0000001s, which the API server refuses.)"""
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    total = 0
    for number, unit_name in parts:
        unit = _UNIT_NANOSECONDS[unit_name]
        whole, _, digits = number.partition(".")
        value = int(whole) * unit
        fraction, scale, overflow = 0, 1.0, False
        for digit in digits:  # Go's leadingFraction: digits past what 63 bits hold are dropped
            if overflow or fraction > _MAX_NANOSECONDS // 10:
                overflow = True
                continue
            fraction, scale = fraction * 10 + int(digit), scale * 10
        value += int(float(fraction) * (float(unit) / scale))
        total += value
        if value > 1 << 63 or total > 1 << 63:
            raise ValueError(f"duration out of range: {text!r}")
    if total > _MAX_NANOSECONDS:
        raise ValueError(f"duration out of range: {text!r}")
    return total


def duration_seconds(text: str) -> float:
    """Seconds in a duration of the DURATION grammar ("15m", "1m30s", "1.5h", "500ms"), any length (the
    stabilization windows have no upper bound)."""
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(number) * _UNIT_NANOSECONDS[unit] / 1e9 for number, unit in parts)


def _compare(text: str, bound: str, at_least: bool) -> bool:
    """Whether the duration is at least (or at most) `bound`, as CEL compares them; one past Go's range is above
    every bound (CEL's duration() fails on it, which the API server refuses)."""
    try:
        value = duration_nanoseconds(text)
    except ValueError:
        return at_least
    return value >= duration_nanoseconds(bound) if at_least else value <= duration_nanoseconds(bound)


class Autoscaling(CelValidated):
    cel_rules = (
        CelRule(
            "self.minReplicas <= self.maxReplicas",
            "autoscaling.minReplicas must not exceed autoscaling.maxReplicas",
            lambda autoscaling: autoscaling.min_replicas <= autoscaling.max_replicas,
        ),
        CelRule(
            f"duration(self.scaleToZeroAfter) >= duration('{MIN_SCALE_TO_ZERO_AFTER}')",
            f"autoscaling.scaleToZeroAfter must be at least {MIN_SCALE_TO_ZERO_AFTER}",
            lambda autoscaling: _compare(autoscaling.scale_to_zero_after, MIN_SCALE_TO_ZERO_AFTER, at_least=True),
        ),
        # Beyond, CEL's duration() overflows: the API server refused with a conversion error, where pydantic
        # (standalone mode) accepted. The same bound on both sides, in words.
        CelRule(
            f"duration(self.scaleToZeroAfter) <= duration('{MAX_SCALE_TO_ZERO_AFTER}')",
            f"autoscaling.scaleToZeroAfter must be at most {MAX_SCALE_TO_ZERO_AFTER}",
            lambda autoscaling: _compare(autoscaling.scale_to_zero_after, MAX_SCALE_TO_ZERO_AFTER, at_least=False),
        ),
    )

    min_replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Fewest replicas; 0 lets an idle model scale to zero (scaleToZeroAfter) and the gateway's "
        "held requests wake it.",
    )
    max_replicas: int = Field(ge=1, le=1000, description="Most replicas.")
    scale_to_zero_after: str = Field(
        default="15m",
        pattern=DURATION,
        max_length=32,
        description="With minReplicas 0: how long the model must see no request (none in flight, none waiting, "
        "no request counted, no request held by the gateway) before it goes to zero, e.g. 15m.",
    )
    target_in_flight_per_replica: int = Field(
        default=8,
        ge=1,
        le=100_000,
        description="Requests in flight plus waiting per replica that the autoscaler aims at (the engine's "
        "own counts, read from each pod's metrics port).",
    )
    target_kv_cache_usage: float | None = Field(
        default=None,
        gt=0,
        le=1,
        alias="targetKVCacheUsage",
        description="vllm engine: also aim at this average KV-cache use per replica (a fraction, e.g. 0.8); "
        "the count that needs more replicas wins.",
    )
    scale_up_stabilization: str = Field(
        default="0s",
        pattern=DURATION,
        max_length=32,
        description="Least time between a scaling and the next scale-up (0s: scale up as soon as load asks).",
    )
    scale_down_stabilization: str = Field(
        default="5m",
        pattern=DURATION,
        max_length=32,
        description="How long the load must have needed fewer replicas, and no scaling have happened, "
        "before one replica is removed (one at a time).",
    )


class AutoscalerStatus(ApiModel):
    """What the operator's autoscaler decided last, and the times its next decisions depend on."""

    desired_replicas: int | None = Field(default=None, description="The replicas the autoscaler decided.")
    reason: str | None = Field(default=None, description="One CamelCase word saying why, e.g. HighLoad, Idle.")
    message: str | None = Field(default=None, description="The decision in a sentence.")
    last_scale_time: str | None = Field(default=None, description="RFC 3339 time the autoscaler last scaled.")
    last_activity_time: str | None = Field(
        default=None, description="RFC 3339 time a request was last seen (in flight, waiting, counted or held)."
    )
    last_busy_time: str | None = Field(
        default=None, description="RFC 3339 time the load last needed at least the replicas the model had."
    )
