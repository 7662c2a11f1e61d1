#!/usr/bin/env bash
# Builds kustomize, which Argo CD's repo-server runs (as the `kustomize` binary on its PATH) for a source folder
# holding a kustomization.yaml, such as examples/gitops/teams/search. Argo CD v3.6.2's image ships kustomize 5.8.3
# (hack/tool-versions.sh), whose pinned k8s.io/kube-openapi pseudo-version the Go module proxy here refuses (403);
# 5.8.0, the nearest release that builds, it is. Used only by the tests, never shipped.
# The cache folder's name carries a hash of this script (the pins live here). Prints the bin folder on stdout.
# `build-kustomize.sh --print-path`: print it if built (exit 1 if not), never build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
KUSTOMIZE=sigs.k8s.io/kustomize/kustomize/v5@v5.8.0

key=$(sha256sum "$here/build-kustomize.sh" | cut -c1-12)
cache_root=${SERVLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/servlane}
dest="$cache_root/kustomize-${KUSTOMIZE##*@}-$key"

if [ -x "$dest/bin/kustomize" ]; then echo "$dest/bin"; exit 0; fi
if [ "${1:-}" = --print-path ]; then exit 1; fi
mkdir -p "$cache_root"
exec 9>"$cache_root/.build-kustomize.lock"
flock -w 1800 9 || { echo "build-kustomize.sh: $cache_root/.build-kustomize.lock held for 30 minutes" >&2; exit 1; }
if [ -x "$dest/bin/kustomize" ]; then echo "$dest/bin"; exit 0; fi

command -v go >/dev/null || { echo "build-kustomize.sh: Go is needed" >&2; exit 3; }
export GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=mod
tmp="$dest.partial"
rm -rf "$tmp"
mkdir -p "$tmp/bin"
echo "build-kustomize.sh: building $KUSTOMIZE" >&2
GOBIN="$tmp/bin" go install -trimpath -ldflags "-s -w" "$KUSTOMIZE"
"$tmp/bin/kustomize" version >&2
mv "$tmp" "$dest"
echo "$dest/bin"
