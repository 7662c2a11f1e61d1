#!/usr/bin/env bash
# Builds Argo CD (issue #34: the "GitOps via Argo CD" way of running Servlane, tried for real in the local cluster)
# into a cache outside the repo. Used only by the tests, never shipped. Not run by scripts/setup.sh or make test yet.
#   argocd   github.com/argoproj/argo-cd/v3 v3.6.2, ./cmd: ONE multi-call binary that picks its command by the
#            name it is started as (cmd/main.go: argocd, argocd-application-controller, argocd-repo-server,
#            argocd-server, argocd-git-ask-pass, ...), so the bin folder holds it plus symlinks of those names.
#   crds/    the module's manifests/crds: Application, AppProject and ApplicationSet CRDs.
# The UI is not built: ui/dist/app holds a placeholder file (`gitkeep`) that ui/embed.go's go:embed takes.
# Why not `go get -tool` (as build-jaeger.sh does): Argo CD's go.mod has `replace .../gitops-engine/v3 =>
# ./gitops-engine`, a folder with its own go.mod and so absent from the module's zip, and replace directives
# apply only in the main module. So: `go mod download` both modules (checked against the checksum database),
# copy Argo CD's source to a scratch folder, put gitops-engine v3.6.2 (its own module, same tag) at ./gitops-engine,
# and `go build ./cmd` there with Argo CD's own go.mod and go.sum (its k8s.io/* replaces apply as upstream's).
# Argo CD v3.6 needs Go >= 1.27.0 (go.mod), so GOTOOLCHAIN=go1.27.3 (the approved one; the go command takes it
# from the Go module proxy). CGO off, as Argo CD's Makefile builds on Linux; version stamped like its Makefile.
# The cache folder's name carries a hash of this script (the pins live here). Prints the bin folder on stdout;
# build.json beside it is one JSON line (seconds, bytes, versions).
# Concurrent runs take turns on a lock: the second finds the cache complete.
# `build-argocd.sh --print-path`: print the bin folder if it is built (exit 1 if not), never build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ARGOCD_VERSION=v3.6.2
ARGOCD_MODULE=github.com/argoproj/argo-cd/v3
GITOPS_ENGINE_MODULE=github.com/argoproj/argo-cd/gitops-engine/v3
GO_TOOLCHAIN=go1.27.3
NAMES="argocd-application-controller argocd-repo-server argocd-server argocd-git-ask-pass"

key=$(sha256sum "$here/build-argocd.sh" | cut -c1-12)
cache_root=${SERVLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/servlane}
dest="$cache_root/argocd-$ARGOCD_VERSION-$key"

if [ -x "$dest/bin/argocd" ]; then echo "$dest/bin"; exit 0; fi
if [ "${1:-}" = --print-path ]; then exit 1; fi
mkdir -p "$cache_root"
exec 9>"$cache_root/.build-argocd.lock"
flock -w 3600 9 || { echo "build-argocd.sh: another build has held $cache_root/.build-argocd.lock for an hour" >&2; exit 1; }
if [ -x "$dest/bin/argocd" ]; then echo "$dest/bin"; exit 0; fi  # built by the run we waited for

command -v go >/dev/null || { echo "build-argocd.sh: Go is needed to build Argo CD" >&2; exit 3; }
export GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=$GO_TOOLCHAIN
tmp="$dest.partial"
if [ -d "$tmp" ]; then chmod -R u+w "$tmp"; rm -rf "$tmp"; fi  # a failed run's copy of read-only module files
mkdir -p "$tmp/bin" "$tmp/crds"
cd "$tmp"
start=$(date +%s)
echo "build-argocd.sh: building argocd $ARGOCD_VERSION with $GO_TOOLCHAIN" >&2

# The module cache's folder of one module version (downloaded and verified first).
module_dir() {
  local json dir
  json=$(go mod download -json "$1@$ARGOCD_VERSION")
  dir=$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
  if [ -z "$dir" ] || [ ! -f "$dir/go.mod" ]; then
    printf 'build-argocd.sh: go mod download %s@%s gave no source folder:\n%s\n' "$1" "$ARGOCD_VERSION" "$json" >&2
    return 1
  fi
  echo "$dir"
}
argocd_dir=$(module_dir "$ARGOCD_MODULE")
engine_dir=$(module_dir "$GITOPS_ENGINE_MODULE")
grep -q "^replace $GITOPS_ENGINE_MODULE => ./gitops-engine\$" "$argocd_dir/go.mod" || {
  echo "build-argocd.sh: $ARGOCD_MODULE@$ARGOCD_VERSION's go.mod no longer replaces gitops-engine with ./gitops-engine" >&2
  exit 1
}
cp -r "$argocd_dir" "$tmp/src"
chmod -R u+w "$tmp/src"  # the module cache is read-only
cp -r "$engine_dir" "$tmp/src/gitops-engine"
chmod -R u+w "$tmp/src/gitops-engine"
(
  cd "$tmp/src"
  kubectl_version=$(go list -m -f '{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}' k8s.io/client-go)
  commit_date=$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$(go env GOMODCACHE)/cache/download/$ARGOCD_MODULE/@v/$ARGOCD_VERSION.info")
  pkg=$ARGOCD_MODULE/common
  go build -trimpath -ldflags "-s -w -X $pkg.version=${ARGOCD_VERSION#v} -X $pkg.buildDate=$commit_date \
    -X $pkg.gitTag=$ARGOCD_VERSION -X $pkg.gitTreeState=clean -X $pkg.kubectlVersion=$kubectl_version \
    -X $pkg.extraBuildInfo=servlane-localcluster" -o "$tmp/bin/argocd" ./cmd
  cp manifests/crds/application-crd.yaml manifests/crds/appproject-crd.yaml \
    manifests/crds/applicationset-crd.yaml "$tmp/crds/"
)
cd "$cache_root"; rm -rf "$tmp/src"
for name in $NAMES; do ln -s argocd "$tmp/bin/$name"; done
"$tmp/bin/argocd" version --client --short >&2  # it runs, and says the version it was stamped with
secs=$(( $(date +%s) - start ))
printf '{"seconds": %d, "bytes": %d, "binary_bytes": %d, "key": "%s", "argocd": "%s", "go": "%s"}\n' "$secs" \
  "$(du -sb "$tmp" | cut -f1)" "$(stat -c %s "$tmp/bin/argocd")" "$key" "$ARGOCD_VERSION" "$GO_TOOLCHAIN" \
  > "$tmp/build.json"
rm -rf "$dest"; mv "$tmp" "$dest"
echo "build-argocd.sh: built in ${secs}s: $(du -sh "$dest" | cut -f1) in $dest" >&2
echo "$dest/bin"
