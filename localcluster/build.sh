#!/usr/bin/env bash
# Builds the local control plane's binaries from the Go module proxy into a cache outside the repo:
#   kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok kwok-stages helm
# The cache folder's name carries a hash of the pinned modules (go.mod/go.sum) and this script,
# so a rebuild happens only when a pinned version changes. Prints the bin folder on stdout.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

key=$(cat "$here"/versions.env "$here"/build.sh "$here"/*/go.mod "$here"/*/go.sum | sha256sum | cut -c1-12)
cache_root=${SERVLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/servlane}
dest="$cache_root/k8s-$K8S_VERSION-$key"
bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok kwok-stages helm)

complete() { for b in "${bins[@]}"; do [ -x "$dest/bin/$b" ] || return 1; done; }
if complete; then echo "$dest/bin"; exit 0; fi

command -v go >/dev/null || { echo "build.sh: Go is needed to build the control plane" >&2; exit 3; }
export GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=mod
tmp="$dest.partial"
rm -rf "$tmp"; mkdir -p "$tmp/bin"
start=$(date +%s)
log() { echo "build.sh: $*" >&2; }

minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
kver() {
  local p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    printf -- '-X %s.gitVersion=%s -X %s.gitMajor=1 -X %s.gitMinor=%s -X %s.gitTreeState=clean ' \
      "$p" "$K8S_VERSION" "$p" "$p" "$minor" "$p"
  done
}

log "building Kubernetes $K8S_VERSION (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl)"
(cd "$here/k8s" && go build -trimpath -ldflags "-s -w $(kver)" -o "$tmp/bin/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
log "building etcd $ETCD_VERSION"
(cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$tmp/bin/etcd" .)
log "building kwok $KWOK_VERSION"
(cd "$here/kwok" && go build -trimpath -ldflags "-s -w" -o "$tmp/bin/" sigs.k8s.io/kwok/cmd/kwok \
  && go build -trimpath -ldflags "-s -w" -o "$tmp/bin/kwok-stages" ./stages)
log "building helm $HELM_VERSION"
(cd "$here/helm" && go build -trimpath -o "$tmp/bin/helm" -ldflags "-s -w \
  -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION \
  -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor" \
  helm.sh/helm/v3/cmd/helm)

secs=$(( $(date +%s) - start ))
printf '{"seconds": %d, "bytes": %d, "key": "%s"}\n' "$secs" "$(du -sb "$tmp" | cut -f1)" "$key" > "$tmp/build.json"
rm -rf "$dest"; mv "$tmp" "$dest"
log "built in ${secs}s: $(du -sh "$dest" | cut -f1) in $dest"
echo "$dest/bin"
