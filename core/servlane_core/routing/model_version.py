"""An AIModel's answer version: a digest of the spec fields that can change what the model answers.

The gateway's response cache keys each answer by it (with the AIModel's namespace and name), so a spec
change, a rollout to another AIModel or a canary step never serves an answer of another version. Fields
that only place or scale the replicas are left out: scaling a model keeps its cache. Everything else is
in, including any field added later, so an unknown field errs on the side of a new version.
"""

from __future__ import annotations

from servlane_api.aimodel import AIModelSpec
from servlane_core.digest import json_digest

# Where the replicas run and how many: not what one of them answers.
NOT_IN_ANSWER = frozenset({"replicas", "autoscaling", "scheduling", "cache", "shm_size"})


def answer_version(spec: AIModelSpec) -> str:
    return json_digest(spec.model_dump(mode="json", exclude=set(NOT_IN_ANSWER)))
