#!/usr/bin/env bash
# Builds the real worker node's binaries (opt-in, see README "A real node") into a cache outside the repo:
#   kubelet kube-proxy            from k8s.io/kubernetes, module localcluster/node/k8s: the control plane's
#                                 go.mod with the same pin and replaces, plus the go.sum entries kubelet and
#                                 kube-proxy need (localcluster/k8s lacks them; adding them there would change
#                                 build.sh's cache key and force a control-plane rebuild)
#   containerd ctr containerd-shim-runc-v2   containerd 2.x, module localcluster/node/containerd
#   runc                          runc 1.5.x, module localcluster/node/runc (Debian's 1.1.5 fails CRI sandboxes);
#                                 cgo: gcc and libseccomp-dev needed (tags seccomp, no libpathrs)
#   coredns                       CoreDNS (cluster DNS), module localcluster/node/coredns: upstream's coremain
#                                 with only the plugins the node's Corefile uses (main.go)
#   pause hello podcheck          the images' static programs, module localcluster/node/images
# The CNI plugins come from Debian (apt-get install containernetworking-plugins).
# The modules live under node/ (two levels down) so build.sh's key (localcluster/*/go.mod) does not see them.
# The cache folder's name carries a hash of everything pinned here. Prints the bin folder on stdout.
# Concurrent runs (setup.sh and a test, two shells) take turns on a lock: the second finds the cache complete.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

key=$(cat "$here"/versions.env "$here"/build-node.sh \
  "$here"/node/*/go.mod "$here"/node/*/go.sum "$here"/node/images/*/*.go "$here"/node/coredns/*.go 2>/dev/null \
  | sha256sum | cut -c1-12)
cache_root=${SERVLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/servlane}
dest="$cache_root/node-$K8S_VERSION-$key"
bins=(kubelet kube-proxy containerd ctr containerd-shim-runc-v2 runc coredns pause hello podcheck)

complete() { for b in "${bins[@]}"; do [ -x "$dest/bin/$b" ] || return 1; done; }
if complete; then echo "$dest/bin"; exit 0; fi
mkdir -p "$cache_root"
exec 9>"$cache_root/.build-node.lock"
flock 9
if complete; then echo "$dest/bin"; exit 0; fi  # built by the run we waited for

command -v go >/dev/null || { echo "build-node.sh: Go is needed to build the node" >&2; exit 3; }
export GOWORK=off CGO_ENABLED=0
tmp="$dest.partial"
rm -rf "$tmp"; mkdir -p "$tmp/bin"
start=$(date +%s)
log() { echo "build-node.sh: $*" >&2; }
lap() { log "$1 took $(( $(date +%s) - $2 ))s"; }

minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
kver() {
  local p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    printf -- '-X %s.gitVersion=%s -X %s.gitMajor=1 -X %s.gitMinor=%s -X %s.gitTreeState=clean ' \
      "$p" "$K8S_VERSION" "$p" "$p" "$minor" "$p"
  done
}

t=$(date +%s); log "building kubelet, kube-proxy $K8S_VERSION"
(cd "$here/node/k8s" && GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w $(kver)" -o "$tmp/bin/" \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)
lap kubelet+kube-proxy "$t"

cver=$(sed -n 's/^require github.com\/containerd\/containerd\/v2 \(v[^ ]*\)$/\1/p' "$here/node/containerd/go.mod")
t=$(date +%s); log "building containerd $cver (containerd, ctr, containerd-shim-runc-v2)"
cflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$cver \
  -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2"
(cd "$here/node/containerd" && GOFLAGS=-mod=mod go build -trimpath -tags "urfave_cli_no_docs osusergo netgo" \
  -ldflags "$cflags" -o "$tmp/bin/" github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/ctr \
  && go build -trimpath -tags "urfave_cli_no_docs osusergo netgo no_grpc" -ldflags "$cflags" \
    -o "$tmp/bin/" github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2)
lap containerd "$t"

rver=$(sed -n 's/^require github.com\/opencontainers\/runc \(v[^ ]*\)$/\1/p' "$here/node/runc/go.mod")
t=$(date +%s); log "building runc $rver (cgo)"
command -v gcc >/dev/null && [ -e /usr/include/seccomp.h ] || { echo "build-node.sh: runc needs gcc and libseccomp-dev" >&2; exit 3; }
(cd "$here/node/runc" && CGO_ENABLED=1 GOFLAGS=-mod=mod go build -trimpath -tags "seccomp urfave_cli_no_docs" \
  -ldflags "-s -w -X main.version=${rver#v}" -o "$tmp/bin/runc" github.com/opencontainers/runc)
lap runc "$t"

dver=$(sed -n 's/^require github.com\/coredns\/coredns \(v[^ ]*\)$/\1/p' "$here/node/coredns/go.mod")
t=$(date +%s); log "building coredns $dver"
(cd "$here/node/coredns" && GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w" -o "$tmp/bin/coredns" .)
lap coredns "$t"

t=$(date +%s); log "building pause, hello, podcheck"
(cd "$here/node/images" && go build -trimpath -ldflags "-s -w" -o "$tmp/bin/" ./pause ./hello ./podcheck)
lap images "$t"

secs=$(( $(date +%s) - start ))
printf '{"seconds": %d, "bytes": %d, "key": "%s", "containerd": "%s", "coredns": "%s"}\n' "$secs" \
  "$(du -sb "$tmp" | cut -f1)" "$key" "$cver" "$dver" > "$tmp/build.json"
rm -rf "$dest"; mv "$tmp" "$dest"
log "built in ${secs}s: $(du -sh "$dest" | cut -f1) in $dest"
echo "$dest/bin"
