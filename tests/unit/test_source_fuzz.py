"""Fuzzing the source grammar (issue #28.16): whatever a user writes in source.uri or an adapter's source,
the pydantic twin either rejects it with a ValidationError or accepts a path that stays where it points,
and the API server's RE2 (Go's regexp, which CEL's matches() runs on) says the same as Python's re.
"""

from __future__ import annotations

import json
import os
import posixpath
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from servlane_api.sources import (
    ADAPTER_SOURCE,
    CLAIM_TOO_LONG,
    RESERVED_BUCKET,
    SOURCE_URI,
    SYSTEM_PATH,
    Adapter,
    ModelSource,
    SourceKind,
)
from tests.support.cel_cases import BAD_SOURCES, GOOD_SOURCES, SYSTEM_SOURCES

# Pieces a hostile manifest is made of: schemes, separators, traversal, encodings, hosts and credentials.
PIECES = (
    "hf://", "pvc://", "s3://", "/", "//", ".", "..", "./", "../", "~", "-", "_", "@", ":", "?", "#", "%",
    "%2e", "%2f", "%00", "\\", " ", "\t", "\n", "\x00", "\x1b", "\u202e", "é", "a", "Z", "0", "9", "org",
    "name", "main", "claim", "bucket", "models", "proc", "etc", "var/run", "dev", "refs/pr/1", "user:pass@",
    "1.2.3.4", "xn--", "-s3alias", "a" * 63 + ".", "b" * 200,
    "oci://", "localhost", "registry.example.com", ":5000", ":v1.5", "__", "--", "@sha256:" + "a" * 64,
)  # fmt: skip
uris = st.lists(st.sampled_from(PIECES), max_size=12).map("".join) | st.text(max_size=40)

DANGEROUS = ("..", "//", "%", "\\", "~", "?", "#")


def accepted(uri: str) -> ModelSource | None:
    try:
        return ModelSource(uri=uri)
    except ValidationError:
        return None


def path_of(source: ModelSource) -> str:
    """The path a kubelet mount or the runtime would follow: inside the claim, bucket, or the image."""
    if source.kind is SourceKind.PVC:
        return "/" + source.pvc_claim_and_path()[1]
    if source.kind is SourceKind.S3:
        return "/" + source.uri.removeprefix("s3://").partition("/")[2]
    if source.kind is SourceKind.HF:
        return "/" + source.uri.removeprefix("hf://").split("@")[0]
    if source.kind is SourceKind.OCI:
        return "/" + oci_repository(source)
    return source.uri


def oci_repository(source: ModelSource) -> str:
    """The repository of an oci:// reference: after the registry, before the tag or digest."""
    _, _, rest = source.oci_reference().partition("/")
    return re.split(r"[:@]", rest, maxsplit=1)[0]


@settings(max_examples=1000, deadline=None)
@given(uris)
def test_an_accepted_source_is_a_plain_path(uri: str) -> None:
    source = accepted(uri)
    if source is None:
        return
    rest = uri.split("://", 1)[-1]
    assert not any(bad in rest for bad in DANGEROUS), uri
    assert all(c.isascii() and c.isprintable() and not c.isspace() for c in uri), uri
    path = path_of(source)
    # Nothing to resolve: the path is already what normalising it gives (no '.', '..', '//', trailing '/').
    assert posixpath.normpath(path) == path, uri
    assert not any(segment.startswith("-") for segment in path.split("/")), uri
    assert re.fullmatch(SYSTEM_PATH, uri) is None, uri
    if source.kind is SourceKind.PVC:
        assert len(source.pvc_claim_and_path()[0]) <= 253, uri
    if source.kind is SourceKind.S3:
        bucket = uri.removeprefix("s3://").partition("/")[0]
        assert not re.fullmatch(r"[0-9.]+", bucket), uri
    if source.kind is SourceKind.OCI:
        # The registry is explicit: a kubelet never reads the first component as a Docker Hub user.
        registry = source.oci_reference().partition("/")[0]
        assert registry == "localhost" or "." in registry or ":" in registry, uri
        assert oci_repository(source) == oci_repository(source).lower(), uri


@settings(max_examples=300, deadline=None)
@given(uris)
def test_adapters_accept_no_more_than_models(uri: str) -> None:
    """An adapter source takes the model's forms but s3:// and oci://: never something a model source refuses."""
    try:
        Adapter(name="a", source=uri)
    except ValidationError:
        return
    assert accepted(uri) is not None
    assert not uri.startswith(("s3://", "oci://"))


def samples(count: int, seed: int = 28_16) -> list[str]:
    """Random compositions of the pieces, and mutations of the table's sources (a character changed)."""
    rng = random.Random(seed)
    found = {*GOOD_SOURCES, *BAD_SOURCES, *SYSTEM_SOURCES}
    known = sorted(found)
    while len(found) < count:
        if rng.random() < 0.5:
            found.add("".join(rng.choice(PIECES) for _ in range(rng.randint(1, 10))))
        else:
            base = rng.choice(known)
            at = rng.randrange(len(base))
            found.add(base[:at] + rng.choice(PIECES) + base[at + 1 :])
    return sorted(found)


@pytest.mark.skipif(shutil.which("go") is None, reason="needs Go for its RE2 regexp")
def test_go_regexp_and_python_re_agree_on_every_source_pattern(tmp_path: Path) -> None:
    """The CEL rules are `matches()` of these patterns (SYSTEM_PATH negated): RE2 and the twins' re must agree."""
    inputs = samples(5000)
    patterns = [SOURCE_URI, ADAPTER_SOURCE, SYSTEM_PATH, CLAIM_TOO_LONG, RESERVED_BUCKET]
    program = Path(__file__).with_name("re2_match") / "main.go"
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod", "GO111MODULE": "off"}
    done = subprocess.run(
        ["go", "run", str(program)],
        input=json.dumps({"patterns": patterns, "inputs": inputs}),
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    go_matches = json.loads(done.stdout)
    for pattern, results in zip(patterns, go_matches, strict=True):
        python = [re.fullmatch(pattern, text) is not None for text in inputs]
        differ = [text for text, a, b in zip(inputs, python, results, strict=True) if a != b]
        assert differ == [], f"{pattern[:40]}...: {differ[:5]}"
    accepted_count = sum(go_matches[0])
    assert 0 < accepted_count < len(inputs)  # the samples reach both sides of the grammar
