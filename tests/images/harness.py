"""Docker for the image smoke tests: build through scripts/build-images.sh, and run a container the way the
kubelet would run the operator's pod spec.

`pod_run_args` translates the container of a Deployment that the operator's builder wrote into `docker run`
flags: user and groups, read-only root, dropped capabilities, each volume mount, env, command/args, ports and
resource limits. Whatever it cannot translate faithfully raises `Untranslatable`, so a pod-spec change that
the test does not model fails loudly instead of being ignored.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build-images.sh"
_built: dict[str, str] = {}
# A cold CPU runtime build (the ML stack from PyPI) takes about 10 minutes here; setup.sh builds them first.
BUILD_TIMEOUT_S = 1800


class Untranslatable(AssertionError):
    """A pod-spec field the docker translation does not know: extend pod_run_args, do not drop it."""


def unavailable(reason: str) -> None:
    """Skip, except in CI (CI=true), where missing prerequisites are a failure (as e2e/conftest.py does)."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"image test prerequisites missing in CI: {reason}")
    pytest.skip(reason)


def require_docker() -> None:
    if shutil.which("docker") is None:
        unavailable("no docker CLI (scripts/build-images.sh installs docker.io and starts dockerd)")
    info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
    if info.returncode != 0:
        unavailable(f"the docker daemon does not answer (start it with scripts/build-images.sh): {info.stderr.strip()}")


def built_image(which: str) -> str:
    """The image reference for `which` (cpu, cuda, operator, gateway), built by scripts/build-images.sh, which
    returns at once when the image for the current inputs exists (content-keyed tag)."""
    require_docker()
    if which not in _built:
        # Bounded, so that a build that cannot start (e.g. its lock held) fails with the script's own words.
        try:
            done = subprocess.run(
                ["bash", str(BUILD_SCRIPT), which], capture_output=True, text=True, cwd=ROOT, timeout=BUILD_TIMEOUT_S
            )
        except subprocess.TimeoutExpired as expired:
            raw = expired.stderr or b""  # bytes on POSIX, even in text mode
            stderr = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
            raise AssertionError(
                f"scripts/build-images.sh {which} ran over {BUILD_TIMEOUT_S} s:\n{stderr[-6000:]}"
            ) from None
        if done.returncode != 0:
            raise AssertionError(f"scripts/build-images.sh {which} failed ({done.returncode}):\n{done.stderr[-6000:]}")
        _built[which] = done.stdout.split()[-1]
    return _built[which]


def docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


def docker_ok(*args: str, timeout: float = 120) -> str:
    """stdout of a docker command that must succeed; stderr and stdout in the failure otherwise."""
    done = docker(*args, timeout=timeout)
    assert done.returncode == 0, f"docker {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def python_in(image: str, code: str, *docker_args: str, timeout: float = 300) -> str:
    """Runs `python -c code` in the image (as its own user, read-only root) and returns stdout."""
    return docker_ok(
        "run",
        "--rm",
        "--read-only",
        "--tmpfs",
        "/tmp",
        *docker_args,
        "--entrypoint",
        "python",
        image,
        "-c",
        code,
        timeout=timeout,
    )


# --- Kubernetes quantities --------------------------------------------------------------------------------------
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_DECIMAL = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def quantity_bytes(quantity: str) -> int:
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", quantity)
    if match is None or match.group(2) not in {**_BINARY, **_DECIMAL}:
        raise Untranslatable(f"quantity {quantity!r}")
    number, unit = float(match.group(1)), match.group(2)
    return int(number * {**_BINARY, **_DECIMAL}[unit])


def cpu_cores(quantity: str) -> str:
    return str(int(quantity[:-1]) / 1000) if quantity.endswith("m") else quantity


# --- the pod spec as docker flags -------------------------------------------------------------------------------
@dataclass
class PodRun:
    """`docker run` arguments for one container of a pod template, and what the test needs to reach it."""

    image: str
    options: list[str]
    args: list[str]
    ports: dict[str, int]  # port name -> host port
    container: dict[str, Any]
    grace_seconds: int

    def probe_url(self, probe: str) -> str:
        get = self.container[probe]["httpGet"]
        port = get["port"]
        host_port = self.ports[port] if isinstance(port, str) else self.ports[_port_name(self.container, port)]
        return f"http://127.0.0.1:{host_port}{get['path']}"

    def probe_deadline(self, probe: str) -> float:
        spec = self.container[probe]
        return float(spec.get("periodSeconds", 10) * spec.get("failureThreshold", 3))


def _port_name(container: dict[str, Any], number: int) -> str:
    for port in container.get("ports", []):
        if port["containerPort"] == number:
            return str(port.get("name", number))
    raise Untranslatable(f"probe port {number} is not a container port")


def pod_run_args(
    deployment: dict[str, Any], claims: dict[str, Path], host_ports: dict[str, int], container_name: str = "runtime"
) -> PodRun:
    """The docker flags that reproduce the pod template's constraints for `container_name`.

    `claims` maps PersistentVolumeClaim names to host directories (bind mounts); `host_ports` maps the
    container's port names to free loopback ports (published with -p)."""
    pod = deployment["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == container_name]
    options: list[str] = []

    pod_sc = pod.get("securityContext", {})
    sc = {**pod_sc, **container.get("securityContext", {})}  # the container's settings win, as in Kubernetes
    uid, gid = sc.get("runAsUser"), sc.get("runAsGroup")
    if sc.get("runAsNonRoot") and (uid is None or uid == 0):
        raise Untranslatable("runAsNonRoot without a non-zero runAsUser: the kubelet would check the image")
    if uid is not None:
        options += ["--user", f"{uid}:{gid if gid is not None else 0}"]
    for group in [pod_sc.get("fsGroup"), *pod_sc.get("supplementalGroups", [])]:
        if group is not None:
            options += ["--group-add", str(group)]
    seccomp = sc.get("seccompProfile", {}).get("type", "RuntimeDefault")
    if seccomp != "RuntimeDefault":  # docker's default profile is the runtime default
        raise Untranslatable(f"seccompProfile {seccomp}")
    if sc.get("readOnlyRootFilesystem"):
        options.append("--read-only")
    if sc.get("allowPrivilegeEscalation") is False:
        options += ["--security-opt", "no-new-privileges"]
    if sc.get("privileged"):
        raise Untranslatable("privileged")
    caps = sc.get("capabilities", {})
    options += [f"--cap-drop={c}" for c in caps.get("drop", [])]
    options += [f"--cap-add={c}" for c in caps.get("add", [])]

    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        if "subPath" in mount or "subPathExpr" in mount:
            raise Untranslatable(f"volumeMount {mount['name']} with a subPath")
        volume = volumes.get(mount["name"])
        if volume is None:
            raise AssertionError(f"volumeMount {mount['name']!r} names no volume of the pod")
        path, read_only = mount["mountPath"], bool(mount.get("readOnly"))
        if "emptyDir" in volume:
            empty = volume["emptyDir"] or {}
            size = empty.get("sizeLimit")
            if empty.get("medium") == "Memory" and path == "/dev/shm":
                options.append(f"--shm-size={quantity_bytes(size) if size else 64 * 2**20}")
                continue
            # An emptyDir is a fresh, empty directory per pod that the pod's user can write (the kubelet makes it
            # 0777, group fsGroup) and may exec from: a tmpfs here. Docker gives a tmpfs at a path that exists in
            # the image that directory's mode (ignoring mode=), so the owner is set to the pod's user instead.
            owner_gid = pod_sc.get("fsGroup", gid if gid is not None else 0)
            opts = ["rw", "exec", f"uid={uid if uid is not None else 0}", f"gid={owner_gid}", "mode=1777"]
            if size:
                opts.append(f"size={quantity_bytes(size)}")
            options += ["--tmpfs", f"{path}:{','.join(opts)}"]
            if read_only:
                raise Untranslatable(f"read-only emptyDir at {path}")
        elif "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            if claim not in claims:
                raise AssertionError(f"the test gives no host directory for PVC {claim!r} (mounted at {path})")
            read_only = read_only or bool(volume["persistentVolumeClaim"].get("readOnly"))
            spec = f"type=bind,source={claims[claim]},destination={path}" + (",readonly" if read_only else "")
            options += ["--mount", spec]
        else:
            raise Untranslatable(f"volume {mount['name']!r} of kind {sorted(set(volume) - {'name'})}")

    # The downward API's pod name and namespace, as the kubelet would give them (a pod name made as the
    # ReplicaSet's would be); any other valueFrom has no docker equivalent.
    meta = deployment.get("metadata", {})
    downward = {"metadata.name": f"{meta.get('name', 'pod')}-0", "metadata.namespace": meta.get("namespace", "default")}
    for env in container.get("env", []):
        value = env.get("value", "")
        if "valueFrom" in env:
            field = env["valueFrom"].get("fieldRef", {}).get("fieldPath")
            if set(env["valueFrom"]) != {"fieldRef"} or field not in downward:
                raise Untranslatable(f"env {env['name']} from {env['valueFrom']}")
            value = downward[field]
        options += ["--env", f"{env['name']}={value}"]
    if container.get("envFrom"):
        raise Untranslatable(f"envFrom {container['envFrom']}")

    ports: dict[str, int] = {}
    for port in container.get("ports", []):
        name = str(port.get("name", port["containerPort"]))
        if port.get("protocol", "TCP") != "TCP":
            raise Untranslatable(f"port {name} protocol {port['protocol']}")
        ports[name] = host_ports[name]
        options += ["--publish", f"127.0.0.1:{ports[name]}:{port['containerPort']}"]

    limits = container.get("resources", {}).get("limits", {})
    for resource, amount in limits.items():
        if resource == "cpu":
            options.append(f"--cpus={cpu_cores(amount)}")
        elif resource == "memory":
            options.append(f"--memory={quantity_bytes(amount)}")
        else:
            raise Untranslatable(f"resource limit {resource}: {amount}")

    args: list[str] = []
    command = container.get("command")
    if command:
        options += ["--entrypoint", command[0]]
        args += command[1:]
    args += container.get("args", [])
    if container.get("workingDir"):
        options += ["--workdir", container["workingDir"]]
    return PodRun(
        image=container["image"],
        options=options,
        args=args,
        ports=ports,
        container=container,
        grace_seconds=int(pod.get("terminationGracePeriodSeconds", 30)),
    )


# --- a running container ----------------------------------------------------------------------------------------
@dataclass
class Container:
    """A detached container; `logs()` for failure messages, removed on exit."""

    image: str
    options: list[str]
    args: list[str] = field(default_factory=list)
    name: str = ""
    stop_seconds: int = 10

    def __enter__(self) -> Container:
        self.name = self.name or f"servlane-test-{os.getpid()}-{time.monotonic_ns() % 10**9}"
        docker_ok("run", "--detach", "--name", self.name, *self.options, self.image, *self.args)
        return self

    def __exit__(self, *exc: object) -> None:
        docker("stop", "--time", str(self.stop_seconds), self.name, timeout=self.stop_seconds + 60)
        docker("rm", "--force", self.name)

    def logs(self, tail: int = 200) -> str:
        done = docker("logs", "--tail", str(tail), self.name)
        return done.stdout + done.stderr

    def state(self) -> dict[str, Any]:
        out = docker_ok("inspect", "--format", "{{json .State}}", self.name)
        state: dict[str, Any] = json.loads(out)
        return state

    def assert_running(self, what: str) -> None:
        state = self.state()
        if not state.get("Running"):
            raise AssertionError(
                f"container {self.name} ({self.image}) exited with {state.get('ExitCode')} while {what}; "
                f"its log:\n{self.logs()}"
            )

    def wait_http_ok(self, url: str, timeout: float, what: str) -> None:
        """Polls `url` until it answers 200, failing early (with the container log) if the container dies."""

        def ok() -> bool:
            self.assert_running(f"waiting for {what}")
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    return bool(response.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        try:
            wait_until(what, ok, timeout, interval=0.5)
        except AssertionError as exc:
            if "container" in str(exc):
                raise
            raise AssertionError(f"{exc}\ncontainer log ({self.name}):\n{self.logs()}") from None
