"""Turn a RuntimeConfig.model_source into a local directory of model files.

Supported: a local or mounted path; `hf://org/name[@revision]` through huggingface_hub's
snapshot_download into the configured cache dir (huggingface_hub honours HF_HUB_OFFLINE, serve only what
the cache holds, and HF_TOKEN, gated/private models; its own per-file locks and `.incomplete` files keep
runtimes that share the cache from fetching a file twice or loading a half-written one); and
`s3://bucket/prefix` from any S3-compatible store (servlane_runtime.sources.s3: one shared, locked copy
in the cache dir). Every failure is a ModelSourceError whose message names the source.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from servlane_api.s3_source import S3Settings

from .sources.errors import ModelSourceError

__all__ = ["HubSource", "ModelSourceError", "parse_hub_source", "resolve_model_source"]


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


def resolve_model_source(
    source: str, cache_dir: str, s3: S3Settings | None = None, only_file: str | None = None, gguf: bool = False
) -> str:
    """A local directory holding the model; downloads from the Hub or an S3 store when the source says so
    (blocking). `s3`: where and how an s3:// source is fetched (default: AWS S3). `only_file`: the one file of
    the source the engine reads; `gguf`: the engine reads a .gguf file and nothing else (a GGUF repository holds
    a file per quantization, gigabytes each, and often the unquantized weights too)."""
    if source.startswith("hf://"):
        return _download(
            parse_hub_source(source), cache_dir, [only_file] if only_file else ["*.gguf"] if gguf else None
        )
    if source.startswith("s3://"):
        from .sources import s3 as s3_source  # minio and urllib3: only runtimes that fetch from S3 import them

        return s3_source.fetch(source, cache_dir, s3 or S3Settings(), only_file, gguf)
    path = source.removeprefix("file://")
    if not os.path.isdir(path):
        raise ModelSourceError(f"model path {path!r} does not exist or is not a directory")
    return path


def _download(hub: HubSource, cache_dir: str, allow_patterns: list[str] | None = None) -> str:
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
                allow_patterns=allow_patterns,
            )
        )
    except LocalEntryNotFoundError as exc:
        where = "the cache (HF_HUB_OFFLINE is set)" if offline else "the cache or the Hub"
        raise ModelSourceError(f"{hub.repo_id}@{hub.revision or 'main'} not found in {where}: {exc}") from exc
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise ModelSourceError(f"downloading {hub.repo_id}@{hub.revision or 'main'} failed: {exc}") from exc
