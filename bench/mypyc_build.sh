#!/bin/bash
# The gateway's per-request modules compiled to C with mypyc (it comes with mypy), in a folder that
# bench/gateway_ab.sh takes as a version: does compiling our own Python bring the CPU per request near
# vllm-router's? Measured twice, not shipped: 1.01-1.06x the interpreted gateway's CPU on 2026-12-06
# (docs/benchmarks.md), 0.99x on 2026-12-07 (bench/results/mypyc_ab.json), inside the rig's A/A spread.
# app.py and the limits and console modules are left out: mypyc 2.4 fails on them (a type it cannot infer
# through the batch store; C it emits wrong for a pydantic import). Compiled classes reject stand-ins of their
# own types (the tests' fakes), so this copy is for benchmarks only.
# Usage: bench/mypyc_build.sh OUT_DIR [REV]      then: bench/gateway_ab.sh - OUT_DIR 5
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$1; REV=${2:-HEAD}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
git -C "$ROOT" archive "$REV" api core web gateway | tar -x -C "$WORK"
MODULES=(
  gateway/servlane_gateway/forwarding.py gateway/servlane_gateway/answers.py gateway/servlane_gateway/access.py
  gateway/servlane_gateway/gateway_metrics.py gateway/servlane_gateway/http/upstream.py
  gateway/servlane_gateway/http/proxy.py gateway/servlane_gateway/http/request.py
  core/servlane_core/routing/sticky_share.py core/servlane_core/routing/name_resolution.py
  core/servlane_core/routing/picking.py
)
cat > "$WORK/setup_mypyc.py" <<'PYEOF'
import os
from mypyc.build import mypycify
from setuptools import setup
modules = os.environ["MYPYC_MODULES"].split()
setup(name="servlane-mypyc-bench", ext_modules=mypycify(modules, opt_level="3"))
PYEOF
cd "$WORK"
MYPYPATH=api:core:web:gateway MYPYC_MODULES="${MODULES[*]}" "$ROOT/.venv/bin/python" setup_mypyc.py build_ext --build-lib compiled >build.log 2>&1 \
  || { tail -20 build.log; exit 1; }
mkdir -p "$OUT"
cp -r gateway/servlane_gateway core/servlane_core "$OUT"/
cp -r compiled/. "$OUT"/  # the extension modules beside their sources, which they shadow
echo "compiled: $(find "$OUT" -name '*.so' | wc -l) extension modules in $OUT"
