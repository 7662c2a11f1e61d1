"""Hard-linking a folder's files into another folder of the same filesystem across two of its mounts.

Linux refuses `link()` across mounts even when both show the same filesystem (EXDEV), and Docker bind-mounts
its root folder onto itself (`/dev/vda[/var/lib/docker]` on /var/lib/docker): so the real node, whose folders
are under the repository, cannot link Docker's layer files through the mount they are seen on. The link is
made in a private mount namespace of its own (`unshare --mount`) where the source's mount is taken away, so
the source is seen through the destination's mount, under which it lies: the links are then ordinary links
within one mount, and the namespace, with its changed mounts, ends with the copying process (nothing to undo,
nothing left mounted by a crash)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath


@dataclass(frozen=True)
class Mount:
    target: Path  # where it is mounted
    fs_root: PurePosixPath  # which folder of its filesystem it shows there
    device: str  # major:minor of the filesystem


def mount_of(path: Path) -> Mount:
    """The mount `path` is on (`findmnt --target`)."""
    out = subprocess.run(
        ["findmnt", "--json", "--output", "TARGET,FSROOT,MAJ:MIN", "--target", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    (fs,) = json.loads(out)["filesystems"]
    return Mount(Path(fs["target"]), PurePosixPath(fs["fsroot"]), fs["maj:min"])


def link_tree_command(source: Path, source_mount: Mount, dest: Path, dest_mount: Mount) -> list[str]:
    """The command that fills `dest` with `source`'s tree, files hard-linked (`cp -a --link`: folders made
    anew with their modes, owners and xattrs; files, symlinks and device nodes linked). Where the two are on
    different mounts of one filesystem, it runs in its own mount namespace without the source's mount, and
    reads the source at the path the destination's mount shows it. Raises ValueError where no link can be
    made (different filesystems, or the destination's mount does not show the source's folder)."""
    copy = ["cp", "-a", "--link"]
    if source_mount == dest_mount:
        return [*copy, f"{source}/.", str(dest)]
    if source_mount.device != dest_mount.device:
        raise ValueError(f"{source} and {dest} are on different filesystems")
    in_filesystem = source_mount.fs_root / source.relative_to(source_mount.target)
    if not in_filesystem.is_relative_to(dest_mount.fs_root):
        raise ValueError(f"{dest}'s mount does not show {source}")
    seen_from_dest = dest_mount.target / in_filesystem.relative_to(dest_mount.fs_root)
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        'umount --lazy "$1" && shift && exec "$@"',
        "sh",
        str(source_mount.target),
        *copy,
        f"{seen_from_dest}/.",
        str(dest),
    ]
