#!/usr/bin/env bash
# Builds Jaeger (the trace backend the tracing tests send OTLP to and query) into a cache outside the repo:
#   jaeger   github.com/jaegertracing/jaeger/cmd/jaeger v1.75.0: Jaeger v2, an OpenTelemetry Collector
#            distribution; with no config it runs all-in-one in memory: OTLP on 4317 (gRPC) / 4318 (HTTP), the
#            query API and UI on 16686. Used only by the tests, never shipped.
# The module has replace directives, so it is built as a tool of a scratch module (`go get -tool`), which
# resolves it with its own requirements and checks them against the checksum database.
# The cache folder's name carries a hash of this script (the pin lives here). Prints the bin folder on stdout.
# Concurrent runs take turns on a lock: the second finds the cache complete.
# `build-jaeger.sh --print-path`: print the bin folder if it is built (exit 1 if not), never build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
JAEGER_VERSION=v1.75.0

key=$(sha256sum "$here/build-jaeger.sh" | cut -c1-12)
cache_root=${SERVLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/servlane}
dest="$cache_root/jaeger-$JAEGER_VERSION-$key"

if [ -x "$dest/bin/jaeger" ]; then echo "$dest/bin"; exit 0; fi
if [ "${1:-}" = --print-path ]; then exit 1; fi
mkdir -p "$cache_root"
exec 9>"$cache_root/.build-jaeger.lock"
flock -w 3600 9 || { echo "build-jaeger.sh: another build has held $cache_root/.build-jaeger.lock for an hour" >&2; exit 1; }
if [ -x "$dest/bin/jaeger" ]; then echo "$dest/bin"; exit 0; fi  # built by the run we waited for

command -v go >/dev/null || { echo "build-jaeger.sh: Go is needed to build Jaeger" >&2; exit 3; }
export GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=mod
tmp="$dest.partial"
rm -rf "$tmp"; mkdir -p "$tmp/bin" "$tmp/src"
start=$(date +%s)
echo "build-jaeger.sh: building jaeger $JAEGER_VERSION" >&2
(
  cd "$tmp/src"
  go mod init servlane.local/jaeger-build >/dev/null 2>&1
  go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$JAEGER_VERSION" >&2
  go build -trimpath -ldflags "-s -w" -o "$tmp/bin/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger
)
rm -rf "$tmp/src"
secs=$(( $(date +%s) - start ))
printf '{"seconds": %d, "bytes": %d, "key": "%s", "jaeger": "%s"}\n' "$secs" \
  "$(du -sb "$tmp" | cut -f1)" "$key" "$JAEGER_VERSION" > "$tmp/build.json"
rm -rf "$dest"; mv "$tmp" "$dest"
echo "build-jaeger.sh: built in ${secs}s: $(du -sh "$dest" | cut -f1) in $dest" >&2
echo "$dest/bin"
