#!/usr/bin/env bash
# Builds SeaweedFS's `weed` (the S3-compatible object store the s3:// model-source tests fetch from; see
# tests/fixtures/s3_server.py) into a cache outside the repo:
#   weed   github.com/seaweedfs/seaweedfs/weed at the pseudo-version below (SeaweedFS 4.53), run by the tests as
#          `weed server -s3`: master, volume server, filer and S3 gateway in one process on loopback. Used only
#          by the tests, never shipped. Cold: about 12 minutes on 2 shared cores (710 s measured), 157 MB.
# The module has a replace directive (go-bip39), which `go install pkg@version` refuses, so it is built as a tool
# of a scratch module (`go get -tool`) that repeats that replace; its requirements are checked against the
# checksum database. go.mod asks for Go 1.26.6, which this machine's Go serves.
# The cache folder's name carries a hash of this script (the pin lives here). Prints the bin folder on stdout.
# Concurrent runs take turns on a lock: the second finds the cache complete.
# `build-seaweedfs.sh --print-path`: print the bin folder if it is built (exit 1 if not), never build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
SEAWEEDFS_VERSION=v0.0.0-20261109003541-7506e5f91cd6
SEAWEEDFS_NAME=4.53-7506e5f91cd6

key=$(sha256sum "$here/build-seaweedfs.sh" | cut -c1-12)
cache_root=${SERVLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/servlane}
dest="$cache_root/seaweedfs-$SEAWEEDFS_NAME-$key"

if [ -x "$dest/bin/weed" ]; then echo "$dest/bin"; exit 0; fi
if [ "${1:-}" = --print-path ]; then exit 1; fi
mkdir -p "$cache_root"
exec 9>"$cache_root/.build-seaweedfs.lock"
flock -w 3600 9 || { echo "build-seaweedfs.sh: another build has held $cache_root/.build-seaweedfs.lock for an hour" >&2; exit 1; }
if [ -x "$dest/bin/weed" ]; then echo "$dest/bin"; exit 0; fi  # built by the run we waited for

command -v go >/dev/null || { echo "build-seaweedfs.sh: Go is needed to build SeaweedFS" >&2; exit 3; }
export GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=mod
tmp="$dest.partial"
rm -rf "$tmp"; mkdir -p "$tmp/bin" "$tmp/src"
start=$(date +%s)
echo "build-seaweedfs.sh: building weed $SEAWEEDFS_VERSION" >&2
(
  cd "$tmp/src"
  go mod init servlane.local/seaweedfs-build >/dev/null 2>&1
  # The same replace as the module's own go.mod (a dependency's replaces do not apply to the main module).
  go mod edit -replace github.com/tyler-smith/go-bip39=github.com/cosmos/go-bip39@v1.0.0
  go get -tool "github.com/seaweedfs/seaweedfs/weed@$SEAWEEDFS_VERSION" >&2
  go build -trimpath -ldflags "-s -w" -o "$tmp/bin/weed" github.com/seaweedfs/seaweedfs/weed
)
rm -rf "$tmp/src"
secs=$(( $(date +%s) - start ))
printf '{"seconds": %d, "bytes": %d, "key": "%s", "seaweedfs": "%s"}\n' "$secs" \
  "$(du -sb "$tmp" | cut -f1)" "$key" "$SEAWEEDFS_VERSION" > "$tmp/build.json"
rm -rf "$dest"; mv "$tmp" "$dest"
echo "build-seaweedfs.sh: built in ${secs}s: $(du -sh "$dest" | cut -f1) in $dest" >&2
echo "$dest/bin"
