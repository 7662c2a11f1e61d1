"""Linking Docker's unpacked layers into the real node's snapshots (localcluster/docker_layers.py,
localcluster/mount_view.py): the manifest that names layers it does not carry, the chain IDs, and the hard
links made past a bind mount of a folder onto itself, as Docker mounts its root."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from localcluster.docker_layers import DockerImage, chain_ids, layout_without_layers
from localcluster.mount_view import Mount, link_tree_command, mount_of

CONFIG = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers"}}).encode()


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def image(layers: int = 3) -> DockerImage:
    diff_ids = tuple(digest(f"layer {i}".encode()) for i in range(layers))
    return DockerImage(
        ref="ghcr.io/servlane/runtime:0.1.0-cpu",
        config=CONFIG,
        diff_ids=diff_ids,
        layer_dirs=tuple(Path(f"/var/lib/docker/overlay2/{i}/diff") for i in range(layers)),
        layer_sizes=tuple(1000 * (i + 1) for i in range(layers)),
        os="linux",
        architecture="amd64",
    )


def test_each_chain_id_digests_the_chain_below_it_and_its_own_diff_id() -> None:
    a, b, c = (digest(x) for x in (b"a", b"b", b"c"))
    chains = chain_ids((a, b, c))
    assert chains[0] == a
    assert chains[1] == digest(f"{a} {b}".encode())
    assert chains[2] == digest(f"{chains[1]} {c}".encode())
    assert chain_ids((a, c))[1] != chains[1], "a chain ID depends on the layers below"


def test_the_layout_names_every_layer_and_carries_only_the_manifest_and_config() -> None:
    img = image()
    with tarfile.open(fileobj=io.BytesIO(layout_without_layers(img))) as layout:
        files = {m.name: layout.extractfile(m).read() for m in layout.getmembers()}  # type: ignore[union-attr]
    index = json.loads(files["index.json"])
    (entry,) = index["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == img.ref
    assert entry["platform"] == {"architecture": "amd64", "os": "linux"}
    manifest_bytes = files[f"blobs/sha256/{entry['digest'].removeprefix('sha256:')}"]
    assert digest(manifest_bytes) == entry["digest"]
    assert len(manifest_bytes) == entry["size"]
    manifest = json.loads(manifest_bytes)
    assert manifest["config"]["digest"] == digest(CONFIG) == img.config_digest
    assert files[f"blobs/sha256/{digest(CONFIG).removeprefix('sha256:')}"] == CONFIG
    assert [layer["digest"] for layer in manifest["layers"]] == list(img.diff_ids)
    assert [layer["size"] for layer in manifest["layers"]] == list(img.layer_sizes)
    blobs = {name for name in files if name.startswith("blobs/")}
    assert len(blobs) == 2, f"layers travel as snapshots, not blobs: {sorted(blobs)}"


ROOT = Mount(Path("/"), PurePosixPath("/"), "254:0")
DOCKER = Mount(Path("/var/lib/docker"), PurePosixPath("/var/lib/docker"), "254:0")


def test_one_mount_links_with_a_plain_copy() -> None:
    command = link_tree_command(Path("/srv/a"), ROOT, Path("/work/b"), ROOT)
    assert command == ["cp", "-a", "--link", "/srv/a/.", "/work/b"]


def test_across_a_bind_mount_the_link_is_made_without_it_in_its_own_mount_namespace() -> None:
    layer = Path("/var/lib/docker/overlay2/x/diff")
    command = link_tree_command(layer, DOCKER, Path("/work/snap/fs"), ROOT)
    assert command[:4] == ["unshare", "--mount", "--propagation", "private"]
    assert command[-3:] == ["--link", "/var/lib/docker/overlay2/x/diff/.", "/work/snap/fs"]
    assert "/var/lib/docker" in command, "the source's mount is the one taken away"


def test_a_bind_mount_of_another_folder_is_read_where_the_destination_mount_shows_it() -> None:
    elsewhere = Mount(Path("/mnt/docker"), PurePosixPath("/data/docker"), "254:0")
    command = link_tree_command(Path("/mnt/docker/overlay2/x/diff"), elsewhere, Path("/work/fs"), ROOT)
    assert "/data/docker/overlay2/x/diff/." in command


def test_no_link_between_filesystems_or_from_a_folder_the_destination_mount_hides() -> None:
    with pytest.raises(ValueError, match="different filesystems"):
        link_tree_command(Path("/var/lib/docker/d"), Mount(DOCKER.target, DOCKER.fs_root, "8:1"), Path("/w"), ROOT)
    narrow = Mount(Path("/work"), PurePosixPath("/work"), "254:0")
    with pytest.raises(ValueError, match="does not show"):
        link_tree_command(Path("/var/lib/docker/d"), DOCKER, Path("/work/fs"), narrow)


@pytest.fixture
def self_bound(tmp_path: Path) -> Iterator[Path]:
    """A folder bind-mounted onto itself, as Docker mounts its root: links out of it fail with EXDEV."""
    if os.geteuid() != 0:
        pytest.skip("bind mounts need root (as the real node does)")
    folder = tmp_path / "docker"
    folder.mkdir()
    subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


def test_files_whiteouts_and_opaque_folders_are_linked_past_a_bind_mount(self_bound: Path, tmp_path: Path) -> None:
    layer = self_bound / "overlay2" / "x" / "diff"
    (layer / "opaque").mkdir(parents=True)
    os.setxattr(layer / "opaque", "trusted.overlay.opaque", b"y")
    (layer / "opaque" / "model.bin").write_bytes(b"weights")
    os.mknod(layer / "removed", stat.S_IFCHR | 0o000, os.makedev(0, 0))  # an overlayfs whiteout
    (layer / "link").symlink_to("opaque/model.bin")
    dest = tmp_path / "snapshot" / "fs"
    dest.mkdir(parents=True)
    with pytest.raises(OSError, match="cross-device"):  # what the linking works around
        os.link(layer / "opaque" / "model.bin", dest / "tried")
    subprocess.run(link_tree_command(layer, mount_of(layer), dest, mount_of(dest)), check=True, capture_output=True)
    assert (dest / "opaque" / "model.bin").stat().st_ino == (layer / "opaque" / "model.bin").stat().st_ino
    assert os.getxattr(dest / "opaque", "trusted.overlay.opaque") == b"y"
    whiteout = (dest / "removed").lstat()
    assert stat.S_ISCHR(whiteout.st_mode)
    assert whiteout.st_rdev == os.makedev(0, 0)
    assert os.readlink(dest / "link") == "opaque/model.bin"
    assert mount_of(layer).target == self_bound, "the bind mount is untouched outside the copy"
