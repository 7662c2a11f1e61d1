"""What an AIFeature points at: an AIModel (`llama`), or one of its LoRA adapters (`llama:sql-v2`).

A target is one string so that everything keyed by it (weights, stable and canary, metrics labels,
replica overrides) stays as it is; the AIModel half is what has pods, the adapter half what the pods serve.
"""

from __future__ import annotations

from dataclasses import dataclass

ADAPTER_SEPARATOR = ":"
# An AIModel name (a DNS label), optionally `:` and an adapter name (servlane_api.sources.ADAPTER_NAME).
TARGET = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(:[a-z0-9]([-a-z0-9._]*[a-z0-9])?)?$"


@dataclass(frozen=True)
class Target:
    model: str
    adapter: str | None = None

    def __str__(self) -> str:
        return self.model if self.adapter is None else f"{self.model}{ADAPTER_SEPARATOR}{self.adapter}"


def parse_target(text: str) -> Target:
    model, separator, adapter = text.partition(ADAPTER_SEPARATOR)
    return Target(model, adapter if separator else None)
