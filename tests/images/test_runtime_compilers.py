"""Both runtime images can compile what the engines compile at run time, as the pod's user, under the pod's
read-only root with only its writable volumes (the `docker run` flags come from the operator's own Deployment).

Triton builds its CUDA driver stub, a CPython extension, with `gcc -I<python include> -shared -fPIC` when CUDA
initialises, then imports it; without a C compiler or Python's headers vLLM fails on its first GPU ("Failed to
find C compiler", vllm#15329, sglang#1067). Triton's own helper (triton.runtime.build.compile_module_from_src)
does exactly that here, so no GPU is needed to prove it. torch.compile's inductor compiles C++ kernels with g++
on the CPU (torch's InvalidCxxCompiler otherwise): a tiny compiled function runs in each image as well.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from servlane_api.aimodel import AIModel
from servlane_operator.builders import build_deployment
from servlane_operator.settings import OperatorSettings
from tests.images.harness import PodRun, built_image, docker_ok, pod_run_args
from tests.support.ports import free_port

pytestmark = [pytest.mark.images, pytest.mark.timeout(3600)]

SPECS: dict[str, dict[str, Any]] = {
    "cpu": {
        "source": {"uri": "hf://servlane/tiny@main"},
        "engine": "vllm",
        "resources": {"cpu": "2", "memory": "8Gi"},
    },
    "cuda": {
        "source": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct@main"},
        "engine": "vllm",
        "resources": {"gpus": 1, "cpu": "2", "memory": "8Gi"},
    },
}

# Runs in the image as the pod's user. Triton keeps the built module in its cache (under HOME=/tmp, the pod's
# emptyDir); the file it imported from is printed to check where it went.
COMPILE_CHECK = r'''
import json, os, sysconfig
from triton.runtime.build import compile_module_from_src

SOURCE = """
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "servlane_cc_check", NULL, -1, methods};
PyMODINIT_FUNC PyInit_servlane_cc_check(void) { return PyModule_Create(&module); }
"""
extension = compile_module_from_src(SOURCE, "servlane_cc_check")

import torch

def f(x):
    return torch.sin(x) * 2 + 1

compiled = torch.compile(f, backend="inductor")
x = torch.arange(16, dtype=torch.float32)
inductor_ok = bool(torch.allclose(compiled(x), f(x)))
print(json.dumps({
    "uid": os.getuid(), "extension": extension.answer(), "extension_file": extension.__file__,
    "inductor": inductor_ok, "python_include": sysconfig.get_paths()["include"],
}))
'''


def pod_for(which: str, tmp_path: Path) -> PodRun:
    model = AIModel.model_validate(
        {
            "apiVersion": "servlane.dev/v1alpha1",
            "kind": "AIModel",
            "metadata": {"name": f"cc-{which}", "namespace": "images", "uid": f"uid-cc-{which}"},
            "spec": SPECS[which],
        }
    )
    deployment = copy.deepcopy(build_deployment(model, OperatorSettings.from_env({})))
    pod = deployment["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "runtime"]
    # No GPU here: the device plugin's limit has no docker flag; the compilers do not need the device.
    container.get("resources", {}).get("limits", {}).pop("nvidia.com/gpu", None)
    claims = {}
    for volume in pod.get("volumes", []):
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            claims[claim] = tmp_path / claim
            claims[claim].mkdir(mode=0o777)
            claims[claim].chmod(0o777)  # a fresh volume the pod's fsGroup may write
    return pod_run_args(deployment, claims=claims, host_ports={"http": free_port(), "metrics": free_port()})


@pytest.mark.parametrize("which", ["cpu", "cuda"])
def test_engines_compile_and_import_extensions_as_the_pod(which: str, tmp_path: Path) -> None:
    image = built_image(which)
    pod = pod_for(which, tmp_path)
    assert pod.image == image, f"the operator runs {pod.image}, the build produced {image}"
    assert "--read-only" in pod.options
    out = docker_ok("run", "--rm", *pod.options, "--entrypoint", "python", image, "-c", COMPILE_CHECK, timeout=900)
    got = json.loads(out.strip().splitlines()[-1])
    assert got["uid"] == 10001
    assert got["extension"] == 42
    assert got["extension_file"].startswith("/tmp/"), got  # Triton's cache: HOME, the pod's emptyDir
    assert got["inductor"] is True
