"""Time to Ready from each model source on the real node (issue #31) -> bench/results/model_sources.json.

The model: the tiny Llama with an extra `padding.safetensors` of random bytes (MODEL_SOURCES_PAD_MB, default 300
MB), so that moving the files shows; the engine loads model.safetensors only, so the padding is transferred,
not loaded. Sources, each apply -> AIModel Ready of a fresh AIModel (ModelRollout, polled every 0.5 s), with the
runtime's own weights step (status.coldStart.weightsFetched: from its imports' end to the files' being local):

- `pvc`: the folder on a local PersistentVolume (`pvc://`), nothing fetched.
- `hf`: a Hugging Face cache pre-seeded on the cache volume, HF_HUB_OFFLINE=1 (`hf://`), nothing fetched.
- `s3-cold`: from SeaweedFS on the node's address (`s3://`) into an empty pod-local cache: the whole download.
- `s3-warm`: the same into a cache PersistentVolume that an earlier start filled (one LIST, no GET: checked in
  the store's own log each round): what a second replica or a restart pays.
- `oci`: the model image (scripts/build-model-image.sh) as an image volume, already on the node: no registry
  runs here, so its pull is stood for by the import into the node's containerd, timed once (`image_import`).
- `baked`: the model copied into an image FROM our CPU runtime image (`spec.image`, source `/models/...`).

Rounds run every source once, the order reversed every other round (ABC CBA ...), so each sees the machine
alike; each source's median and min-max, the machine's CPU shares (bench/machine_load.py) and load average per
run. Run under the real-node lock (it brings up its own real cluster, ~5 min, and imports two images):

    flock /tmp/servlane-realnode.lock env MODEL_SOURCES_ROUNDS=3 \\
        .venv/bin/python -m pytest -q -s -p no:cacheprovider bench/model_sources.py
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bench.machine_load import cpu_times, shares
from localcluster.cluster import LocalCluster
from tests.support.cluster_harness import RUNTIME_CPU_IMAGE, Kube
from tests.support.model_sources import NAMESPACE, RUNTIME_UID, cluster, kube, operator, seed_hub_cache  # noqa: F401 (fixtures)
from tests.support.polling import wait_until
from tests.support.real_node import real_cluster, real_node_images  # noqa: F401 (fixtures)
from tests.support.real_pods import NODE_SELECTOR, ModelRollout, delete_local_claim, gone, local_model_claim, pods
from tests.support.s3_server import S3Server, running_s3_server

RESULTS = Path(__file__).parent / "results" / "model_sources.json"
ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(7200)

PAD_MB = int(os.environ.get("MODEL_SOURCES_PAD_MB", "300"))
ROUNDS = int(os.environ.get("MODEL_SOURCES_ROUNDS", "3"))
SOURCES = ("pvc", "hf", "s3-cold", "s3-warm", "oci", "baked")
MODEL_IMAGE = "registry.servlane.test/models/tiny-llama-padded:bench"
BAKED_IMAGE = "registry.servlane.test/servlane/runtime-baked:bench"
BAKED_DIR = "/models/tiny-llama-padded"
REPO_ID = "servlane-bench/tiny-llama-padded"
BUCKET, PREFIX = "models", "bench/tiny-llama-padded"
RESOURCES = {"cpu": "1500m", "memory": "4Gi"}
READY_DEADLINE_SECONDS = 900


def padded_model() -> Path:
    """The tiny Llama plus PAD_MB of random bytes as a second safetensors file; built once per size."""
    from servlane_devtools.tiny_model import build_tiny_llama, cache_root

    tiny = build_tiny_llama()
    target = cache_root() / f"tiny-llama-padded-{PAD_MB}mb"
    if (target / "padding.safetensors").is_file():
        return target
    work = Path(tempfile.mkdtemp(prefix=".building-", dir=cache_root()))
    shutil.copytree(tiny, work, dirs_exist_ok=True)
    size = PAD_MB * 1024 * 1024
    header = json.dumps({"padding": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(work / "padding.safetensors", "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        for _ in range(PAD_MB):
            f.write(os.urandom(1024 * 1024))
    work.rename(target)
    return target


def _run(*args: str, stdin: Path | None = None, timeout: float = 900) -> None:
    with open(stdin, "rb") if stdin else open(os.devnull, "rb") as inp:
        done = subprocess.run(list(args), stdin=inp, capture_output=True, text=False, timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    return out.stdout.strip()


def _summary(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1), "max": round(max(values), 1)}


class Bench:
    """Everything the sources need, set up once: claims, the seeded cache, the store, the two images."""

    def __init__(self, c: LocalCluster, k: Kube, store: S3Server, model: Path) -> None:
        self.c, self.k, self.store, self.model = c, k, store, model
        self.setup_seconds: dict[str, float] = {}

    def claim(self, name: str, models: dict[str, Path], owned: bool = False) -> None:
        root = self.c.workdir / "pv" / NAMESPACE / name
        root.mkdir(parents=True, exist_ok=True)
        local_model_claim(self.c, NAMESPACE, name, models)
        if owned:  # a cache the runtime writes
            for path in [root, *root.rglob("*")]:
                os.chown(path, RUNTIME_UID, RUNTIME_UID, follow_symlinks=False)

    def prepare(self) -> None:
        node = self.c.node
        assert node is not None
        self.claim("bench-models", {"padded": self.model})
        hub_root = self.c.workdir / "pv" / NAMESPACE / "bench-hub"
        hub_root.mkdir(parents=True, exist_ok=True)
        seed_hub_cache(hub_root, REPO_ID, self.model)
        self.claim("bench-hub", {}, owned=True)
        self.claim("bench-s3-cache", {}, owned=True)
        self.c.api(
            "POST",
            f"/api/v1/namespaces/{NAMESPACE}/secrets",
            {"metadata": {"name": "bench-store-keys"}, "stringData": self.store.admin.env()},
        )
        started = time.monotonic()
        self.store.upload_dir(self.model, BUCKET, PREFIX)
        self.setup_seconds["s3_upload"] = round(time.monotonic() - started, 1)

        started = time.monotonic()
        _run(str(ROOT / "scripts" / "build-model-image.sh"), str(self.model), MODEL_IMAGE)
        self.setup_seconds["model_image_build"] = round(time.monotonic() - started, 1)
        self.setup_seconds["image_import"] = round(node.import_docker_image(MODEL_IMAGE, timeout=900), 1)

        with tempfile.TemporaryDirectory() as tmp:
            context = Path(tmp)
            shutil.copytree(self.model, context / "model")
            for path in [context / "model", *(context / "model").rglob("*")]:
                path.chmod(0o755 if path.is_dir() else 0o644)
            (context / "Dockerfile").write_text(f"FROM {RUNTIME_CPU_IMAGE}\nCOPY model/ {BAKED_DIR}/\n")
            started = time.monotonic()
            _run("docker", "build", "--quiet", "-t", BAKED_IMAGE, str(context))
            self.setup_seconds["baked_image_build"] = round(time.monotonic() - started, 1)
        self.setup_seconds["baked_image_import"] = round(node.import_docker_image(BAKED_IMAGE, timeout=900), 1)

    def spec(self, source: str) -> dict[str, Any]:
        base: dict[str, Any] = {
            "engine": "transformers",
            "engineOptions": {"maxModelLen": 256},
            "resources": {"gpus": 0, **RESOURCES},
            "scheduling": {"nodeSelector": NODE_SELECTOR},
            "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
            "replicas": 1,
        }
        s3 = {"endpoint": self.store.endpoint, "region": "us-east-1", "pathStyle": True}
        if source == "pvc":
            return {**base, "source": {"uri": "pvc://bench-models/padded"}}
        if source == "hf":
            return {**base, "source": {"uri": f"hf://{REPO_ID}"}, "cache": {"persistentVolumeClaim": "bench-hub"}}
        if source in ("s3-cold", "s3-warm"):
            uri = {"uri": f"s3://{BUCKET}/{PREFIX}", "credentialsSecret": "bench-store-keys", "s3": s3}
            cache = {"persistentVolumeClaim": "bench-s3-cache"} if source == "s3-warm" else {"emptyDirSizeLimit": "2Gi"}
            return {**base, "source": uri, "cache": cache}
        if source == "oci":
            return {**base, "source": {"uri": f"oci://{MODEL_IMAGE}"}}
        assert source == "baked"
        return {**base, "source": {"uri": BAKED_DIR}, "image": BAKED_IMAGE}

    def start(self, source: str, name: str) -> dict[str, Any]:
        """One start: apply -> Ready, the runtime's own steps, the store's GETs; then the model removed."""
        gets_before = len(self.store.object_gets(BUCKET))
        times, load = cpu_times(), os.getloadavg()[0]
        rollout = ModelRollout(self.c, self.k, NAMESPACE, name)
        self.k.create_model(NAMESPACE, name, self.spec(source))
        try:
            rollout.wait_ready(READY_DEADLINE_SECONDS)
            pod = rollout.pod["metadata"]["name"]
            try:
                cold = wait_until("status.coldStart", lambda: last_cold_start_in(self.k, name, pod), timeout=30)
            except AssertionError:  # the breakdown is a bonus: apply -> Ready is the measurement
                cold = {}
        finally:
            self.remove(name)
        run = {
            "source": source,
            "name": name,
            "apply_to_ready_seconds": round(rollout.seen["AIModel Ready"], 1),
            "milestones": {k: round(v, 1) for k, v in rollout.seen.items()},
            "cold_start": {k: cold.get(k) for k in ("imageReady", "runtimeImports", "weightsFetched", "total")},
            "store_gets": len(self.store.object_gets(BUCKET)) - gets_before,
            "cpu_shares": shares(times, cpu_times()),
            "load_average_1m": round(load, 2),
        }
        print(f"\n{name}: {run['apply_to_ready_seconds']}s {run['cold_start']} gets={run['store_gets']}")
        return run

    def remove(self, name: str) -> None:
        found = pods(self.c, NAMESPACE, f"servlane.dev/model={name}")
        self.k.delete_model(NAMESPACE, name)
        paths = [f"/api/v1/namespaces/{NAMESPACE}/pods/{p['metadata']['name']}" for p in found]
        for path in paths:  # no drain to wait for: nothing was sent to it
            with contextlib.suppress(OSError):
                self.c.api("DELETE", path, {"gracePeriodSeconds": 0})
        wait_until(f"the pods of {name} gone", lambda: all(gone(self.c, p) for p in paths), timeout=180, interval=0.5)

    def clean(self) -> None:
        node = self.c.node
        assert node is not None
        for ref in (MODEL_IMAGE, BAKED_IMAGE):
            node.remove_image(ref)
            subprocess.run(["docker", "rmi", "-f", ref], capture_output=True, check=False)
        for claim in ("bench-models", "bench-hub", "bench-s3-cache"):
            delete_local_claim(self.c, NAMESPACE, claim)


def last_cold_start_in(k: Kube, name: str, pod: str) -> dict[str, Any] | None:
    last = ((k.get_model(NAMESPACE, name).get("status") or {}).get("coldStart") or {}).get("last") or {}
    return dict(last) if last.get("pod") == pod else None


@pytest.fixture(scope="module")
def bench(cluster: LocalCluster, kube: Kube, operator: object) -> Iterator[Bench]:  # noqa: F811
    node = cluster.node
    assert node is not None
    assert node.address
    work = cluster.workdir / "seaweedfs-bench"
    work.mkdir(parents=True, exist_ok=True)
    with running_s3_server(work, node.address) as store:
        b = Bench(cluster, kube, store, padded_model())
        try:
            b.prepare()
            yield b
        finally:
            b.clean()


def test_time_to_ready_from_each_source(bench: Bench) -> None:
    files = [p for p in bench.model.iterdir() if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    # The warm s3 cache is filled once, unmeasured: every s3-warm round after it must fetch nothing.
    fill = bench.start("s3-warm", "fill-s3-cache")
    runs: list[dict[str, Any]] = []
    for i in range(ROUNDS):
        order = SOURCES if i % 2 == 0 else tuple(reversed(SOURCES))
        for position, source in enumerate(order):
            run = bench.start(source, f"{source}-{i}")
            runs.append({"round": i, "position": position, **run})
            if source == "s3-warm":
                assert run["store_gets"] == 0, run  # the cache served it: no download
            if source == "s3-cold":
                assert run["store_gets"] >= len(files), run  # the whole download, every round

    by_source = {s: [r for r in runs if r["source"] == s] for s in SOURCES}
    results: dict[str, Any] = {
        s: {
            "apply_to_ready_seconds": _summary([r["apply_to_ready_seconds"] for r in rs]),
            "weights_fetched_seconds": _summary(
                [r["cold_start"]["weightsFetched"] for r in rs if r["cold_start"].get("weightsFetched") is not None]
            ),
        }
        for s, rs in by_source.items()
    }
    per_round = [
        next(r for r in by_source["oci"] if r["round"] == i)["apply_to_ready_seconds"]
        / next(r for r in by_source["baked"] if r["round"] == i)["apply_to_ready_seconds"]
        for i in range(ROUNDS)
    ]
    out = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _commit(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release()},
        "versions": {"runtime_image": RUNTIME_CPU_IMAGE, "kubernetes": "v1.36.3", "containerd": "v2.3.7"},
        "settings": {
            "rounds": ROUNDS,
            "order": "every source once per round, reversed every other round",
            "model_bytes": size,
            "padding_mb": PAD_MB,
            "engine": "transformers (the padding is transferred, not loaded)",
            "resources": RESOURCES,
            "note": "apply -> AIModel Ready, polled every 0.5 s; pods deleted with grace 0 between runs",
        },
        "setup_seconds": {**bench.setup_seconds, "s3_cache_fill_start": fill["apply_to_ready_seconds"]},
        "results": results,
        "oci_over_baked_per_round": {
            "median": round(statistics.median(per_round), 2),
            "min": round(min(per_round), 2),
            "max": round(max(per_round), 2),
        },
        "runs": runs,
    }
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(results, indent=1), out["oci_over_baked_per_round"])
