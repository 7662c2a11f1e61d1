"""One copy of a source's files in the cache dir, shared by every runtime that mounts it, never half loaded.

A source's entry is a folder of its own: `model/` (the files, as the engine loads them), `incoming/` (transfers
in progress, resumed by the next fetch), `.lock` and `complete.json`. Fetching happens under an exclusive lock
on `.lock` (flock, which NFS and other ReadWriteMany volumes carry between nodes), so two runtimes never fetch
the same files at once: the second waits, then finds the marker and fetches nothing. `complete.json` is
removed before any file changes and written last, after every file is in place and flushed; `model/` is loaded
only while the marker matches what the store lists, so a half-written download is resumed, never loaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

log = logging.getLogger(__name__)

MARKER = "complete.json"
LOCK = ".lock"


@dataclass(frozen=True)
class Listed:
    """One file of a source as its store lists it."""

    size: int
    etag: str


def entry_dir(cache_dir: str, scheme: str, where: str, source: str) -> Path:
    """The cache entry of `source` (e.g. s3://bucket/prefix) fetched from `where` (its endpoint): two stores
    that hold a bucket of the same name never share an entry, and nested prefixes never share files."""
    digest = hashlib.sha256(f"{where}\n{source}".encode()).hexdigest()[:20]
    return Path(cache_dir) / scheme / digest


@contextlib.contextmanager
def exclusive(entry: Path, what: str) -> Iterator[None]:
    """Hold the entry's lock; says in the log when another runtime holds it (and for how long we waited)."""
    entry.mkdir(parents=True, exist_ok=True)
    # No soft-lock fallback where flock is missing: a killed holder would leave it held forever (fail loud).
    lock = FileLock(str(entry / LOCK), thread_local=False, fallback_to_soft=False)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info("another runtime is fetching %s into %s: waiting for it", what, entry)
        started = time.monotonic()
        lock.acquire()  # no timeout: the load timeout bounds the start; the holder's stall timeout bounds it
        log.info("waited %.1fs for the other runtime's fetch of %s", time.monotonic() - started, what)
    try:
        yield
    finally:
        lock.release()


def read_marker(entry: Path) -> dict[str, Listed] | None:
    """The listing the entry was completed from, or None (never completed, being changed, or unreadable)."""
    try:
        raw = json.loads((entry / MARKER).read_text())
        return {name: Listed(int(f["size"]), str(f["etag"])) for name, f in raw["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def is_complete(entry: Path, listing: Mapping[str, Listed]) -> bool:
    """True when the marker says the entry holds exactly `listing` and every file is there at its size."""
    if read_marker(entry) != dict(listing):
        return False
    model = entry / "model"
    return all(size_of(model / name) == listed.size for name, listed in listing.items())


def forget_marker(entry: Path) -> None:
    """Called before any file of the entry changes: from now on it is incomplete until `write_marker`."""
    (entry / MARKER).unlink(missing_ok=True)
    _fsync_dir(entry)


def write_marker(entry: Path, source: str, listing: Mapping[str, Listed]) -> None:
    """Written last, atomically: the entry holds `listing` in full."""
    body = {
        "source": source,
        "completed_at": time.time(),
        "files": {name: {"size": f.size, "etag": f.etag} for name, f in sorted(listing.items())},
    }
    tmp = entry / f".{MARKER}.{os.getpid()}"
    with tmp.open("w") as out:
        json.dump(body, out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, entry / MARKER)
    _fsync_dir(entry)


def remove_unlisted(entry: Path, listing: Mapping[str, Listed]) -> None:
    """Delete files in `model/` that the store no longer lists (an older version's shards would be loaded)."""
    model = entry / "model"
    if not model.is_dir():
        return
    for path in sorted(model.rglob("*"), reverse=True):
        name = path.relative_to(model).as_posix()
        if path.is_dir() and not path.is_symlink():
            with contextlib.suppress(OSError):
                path.rmdir()  # only when empty
        elif name not in listing:
            path.unlink()


def publish(part: Path, dest: Path) -> None:
    """Move a finished, verified transfer into place (same filesystem: atomic)."""
    with part.open("rb") as done:
        os.fsync(done.fileno())
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(part, dest)


def size_of(path: Path) -> int | None:
    """The size of a regular file, None when there is none."""
    try:
        return path.stat().st_size if path.is_file() else None
    except OSError:
        return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
