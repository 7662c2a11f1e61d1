"""Turn a RuntimeConfig.model_source into a local directory of model files.

Supported: a local or mounted path, and `hf://org/name[@revision]` through huggingface_hub's
snapshot_download into the configured cache dir. huggingface_hub itself honours HF_HUB_OFFLINE
(serve only what the cache holds) and HF_TOKEN (gated/private models).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


class ModelSourceError(Exception):
    """The model files cannot be had; the message is shown in /ready and the logs."""


@dataclass(frozen=True)
class HubSource:
    repo_id: str
    revision: str | None


def parse_hub_source(source: str) -> HubSource:
    spec = source.removeprefix("hf://").strip("/")
    repo_id, _, revision = spec.partition("@")
    if repo_id.count("/") > 1 or not repo_id:
        raise ModelSourceError(f"invalid model source {source!r}: expected hf://org/name[@revision]")
    return HubSource(repo_id, revision or None)


def resolve_model_source(source: str, cache_dir: str) -> str:
    """A local directory holding the model; downloads from the Hub when the source says so (blocking)."""
    if source.startswith("hf://"):
        return _download(parse_hub_source(source), cache_dir)
    if source.startswith("s3://"):
        raise ModelSourceError("s3:// model sources are not supported by this runtime yet; mount the files instead")
    path = source.removeprefix("file://")
    if not os.path.isdir(path):
        raise ModelSourceError(f"model path {path!r} does not exist or is not a directory")
    return path


def _download(hub: HubSource, cache_dir: str) -> str:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        return str(
            snapshot_download(
                repo_id=hub.repo_id,
                revision=hub.revision,
                cache_dir=cache_dir,
                token=os.environ.get("HF_TOKEN") or None,
                local_files_only=offline,
            )
        )
    except LocalEntryNotFoundError as exc:
        where = "the cache (HF_HUB_OFFLINE is set)" if offline else "the cache or the Hub"
        raise ModelSourceError(f"{hub.repo_id}@{hub.revision or 'main'} not found in {where}: {exc}") from exc
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise ModelSourceError(f"downloading {hub.repo_id}@{hub.revision or 'main'} failed: {exc}") from exc
