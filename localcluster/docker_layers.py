"""A Docker image's layers as Docker's overlay2 driver already unpacked them, and the OCI manifest that names
them: what the real node needs to take an image from Docker by hard links instead of a copy.

`docker save | ctr images import` writes every layer twice beside Docker's own copy (the layer tar in
containerd's content store, then its unpacked snapshot; the tar goes only after the last layer unpacked): the
CPU runtime image is 7.7 GB, so the import needed about 15 GB free and took minutes, and a CI machine with
11.8 GiB free failed every real-node test. Docker's overlay2 layer folders (`<root>/overlay2/<id>/diff`) are
already in the format of containerd's overlayfs snapshots (whiteouts as 0:0 character devices, opaque folders
as `trusted.overlay.opaque`), so the node fills its snapshots with hard links to those files (see
`RealNode.link_docker_image`): no bytes copied, only folders and inodes' link counts. Overlayfs never writes
to a lower layer (a container's changes go to its own upper folder), so sharing the inodes is safe; Docker
removing its image later leaves the node's links whole.

Pure where it can be: reading Docker's record of an image (`read_docker_image`) is the one function here that
touches the machine."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"


@dataclass(frozen=True)
class DockerImage:
    """One image as Docker stores it: its config (the exact bytes whose digest is the image's ID) and, bottom
    layer first, each layer's diff ID, unpacked folder and size."""

    ref: str
    config: bytes
    diff_ids: tuple[str, ...]
    layer_dirs: tuple[Path, ...]
    layer_sizes: tuple[int, ...]
    os: str
    architecture: str

    @property
    def config_digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.config).hexdigest()


def chain_ids(diff_ids: tuple[str, ...]) -> tuple[str, ...]:
    """The OCI chain ID of each layer with those below it: the names the unpacked snapshots go by, in
    containerd as in Docker (`identity.ChainID`)."""
    chains: list[str] = []
    for diff_id in diff_ids:
        if not chains:
            chains.append(diff_id)
        else:
            chains.append("sha256:" + hashlib.sha256(f"{chains[-1]} {diff_id}".encode()).hexdigest())
    return tuple(chains)


def read_docker_image(ref: str, docker: str = "docker") -> DockerImage | None:
    """`ref` as Docker's overlay2 driver holds it, or None where it cannot be linked from (another storage
    driver, or a record that does not add up: then the caller copies the image instead)."""
    inspect = subprocess.run([docker, "image", "inspect", ref], capture_output=True, text=True, timeout=60, check=False)
    if inspect.returncode != 0:
        return None
    (record,) = json.loads(inspect.stdout)
    driver = record.get("GraphDriver") or {}
    if driver.get("Name") != "overlay2":
        return None
    data = driver.get("Data") or {}
    if not data.get("UpperDir"):
        return None
    # UpperDir is the top layer's folder, LowerDir the others from the nearest parent down to the base.
    top_down = [data["UpperDir"], *filter(None, (data.get("LowerDir") or "").split(":"))]
    layer_dirs = tuple(Path(d) for d in reversed(top_down))
    diff_ids = tuple(record["RootFS"]["Layers"])
    if len(layer_dirs) != len(diff_ids) or not all(d.is_dir() for d in layer_dirs):
        return None
    root = Path(
        subprocess.run(
            [docker, "info", "--format", "{{.DockerRootDir}}"], capture_output=True, text=True, timeout=60, check=True
        ).stdout.strip()
    )
    image_db = root / "image" / "overlay2"
    config_path = image_db / "imagedb" / "content" / "sha256" / record["Id"].removeprefix("sha256:")
    try:
        config = config_path.read_bytes()
    except OSError:
        return None
    if "sha256:" + hashlib.sha256(config).hexdigest() != record["Id"]:
        return None
    sizes = []
    for chain in chain_ids(diff_ids):
        size_file = image_db / "layerdb" / "sha256" / chain.removeprefix("sha256:") / "size"
        try:
            sizes.append(int(size_file.read_text()))
        except (OSError, ValueError):
            return None
    return DockerImage(
        ref=ref,
        config=config,
        diff_ids=diff_ids,
        layer_dirs=layer_dirs,
        layer_sizes=tuple(sizes),
        os=record.get("Os") or "linux",
        architecture=record.get("Architecture") or "amd64",
    )


def layout_without_layers(image: DockerImage) -> bytes:
    """An OCI image layout (tar) holding `image`'s config and a manifest naming its layers, but not the
    layers: containerd keeps an image whose layers are unpacked and whose layer blobs are gone (as after
    `--discard-unpacked-layers`), and these layers arrive as snapshots, not blobs. Each layer's descriptor
    carries its diff ID (an uncompressed layer's digest) and Docker's size for it (what the CRI reports as the
    image's size); no one fetches them."""
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": image.config_digest, "size": len(image.config)},
        "layers": [
            {"mediaType": LAYER_MEDIA_TYPE, "digest": diff_id, "size": size}
            for diff_id, size in zip(image.diff_ids, image.layer_sizes, strict=True)
        ],
    }
    manifest_bytes = json.dumps(manifest).encode()
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": MANIFEST_MEDIA_TYPE,
                "digest": "sha256:" + hashlib.sha256(manifest_bytes).hexdigest(),
                "size": len(manifest_bytes),
                "platform": {"architecture": image.architecture, "os": image.os},
                "annotations": {
                    "io.containerd.image.name": image.ref,
                    "org.opencontainers.image.ref.name": image.ref.rsplit(":", 1)[-1],
                },
            }
        ],
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as layout:
        files = [
            ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
            ("index.json", json.dumps(index).encode()),
            (f"blobs/sha256/{hashlib.sha256(manifest_bytes).hexdigest()}", manifest_bytes),
            (f"blobs/sha256/{image.config_digest.removeprefix('sha256:')}", image.config),
        ]
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            layout.addfile(info, io.BytesIO(data))
    return buf.getvalue()
