#!/usr/bin/env bash
# Builds the real node's NetworkPolicy enforcer (on by default; see localcluster/README.md) into a cache outside the repo:
#   kube-router   github.com/cloudnativelabs/kube-router/v2 v2.1.0, run with only its network policy controller
#                 (iptables + ipset; works with the CNI bridge plugin). v2.1.0 is the only version the Go
#                 module proxy serves here and security flaws are reported for it: it is used ONLY inside our
#                 local test cluster (e2e/test_real_*.py), never shipped or deployed. Other enforcers do not
#                 fit this kernel (kube-network-policies needs nft queue: CONFIG_NFT_QUEUE is not set).
# At runtime it also needs the ipset and iptables commands (Debian: apt-get install ipset iptables).
# Separate from build-node.sh so that script's cache key (and its cached node) stays as it is.
# The cache folder's name carries a hash of this script (the pin lives here). Prints the bin folder on stdout.
# Concurrent runs take turns on a lock: the second finds the cache complete.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
KUBE_ROUTER_VERSION=v2.1.0

key=$(sha256sum "$here/build-netpol.sh" | cut -c1-12)
cache_root=${SERVLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/servlane}
dest="$cache_root/netpol-$KUBE_ROUTER_VERSION-$key"

if [ -x "$dest/bin/kube-router" ]; then echo "$dest/bin"; exit 0; fi
mkdir -p "$cache_root"
exec 9>"$cache_root/.build-netpol.lock"
flock -w 3600 9 || { echo "build-netpol.sh: another build has held $cache_root/.build-netpol.lock for an hour" >&2; exit 1; }
if [ -x "$dest/bin/kube-router" ]; then echo "$dest/bin"; exit 0; fi  # built by the run we waited for

command -v go >/dev/null || { echo "build-netpol.sh: Go is needed to build kube-router" >&2; exit 3; }
export GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=mod
tmp="$dest.partial"
rm -rf "$tmp"; mkdir -p "$tmp/bin"
start=$(date +%s)
echo "build-netpol.sh: building kube-router $KUBE_ROUTER_VERSION" >&2
# The module has no replace directives, so `go install pkg@version` builds it with its own go.mod and go.sum
# (checked against the checksum database), as upstream's Makefile does (CGO_ENABLED=0).
GOBIN="$tmp/bin" go install -trimpath \
  -ldflags "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$KUBE_ROUTER_VERSION" \
  "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION"
secs=$(( $(date +%s) - start ))
printf '{"seconds": %d, "bytes": %d, "key": "%s", "kube-router": "%s"}\n' "$secs" \
  "$(du -sb "$tmp" | cut -f1)" "$key" "$KUBE_ROUTER_VERSION" > "$tmp/build.json"
rm -rf "$dest"; mv "$tmp" "$dest"
echo "build-netpol.sh: built in ${secs}s: $(du -sh "$dest" | cut -f1) in $dest" >&2
echo "$dest/bin"
