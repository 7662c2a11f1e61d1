#!/usr/bin/env bash
# Generates the Prometheus operator's CRDs (ServiceMonitor, PodMonitor, PrometheusRule, ... of monitoring.coreos.com/v1)
# into a cache outside the repo, for the tests that sync the chart with its monitoring objects on (the GitOps example's
# values) into the local cluster, where no Prometheus operator is installed. Used only by the tests, never shipped.
# The operator's repository module is not served by the Go module proxy here; its API module is
# (github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring): the CRDs are generated from its Go types
# by controller-gen, as upstream's Makefile does (`controller-gen crd:crdVersions=v1 paths=./pkg/apis/monitoring/...`;
# descriptions dropped, maxDescLen=0, as upstream's "-full" CRDs keep them only for docs).
# The cache folder's name carries a hash of this script (the pins live here). Prints the folder of the CRDs on stdout.
# `build-monitoring-crds.sh --print-path`: print it if generated (exit 1 if not), never build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
MONITORING_MODULE=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring
MONITORING_VERSION=v0.95.2
CONTROLLER_TOOLS=sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0

key=$(sha256sum "$here/build-monitoring-crds.sh" | cut -c1-12)
cache_root=${SERVLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/servlane}
dest="$cache_root/monitoring-crds-$MONITORING_VERSION-$key"

if [ -f "$dest/crds/monitoring.coreos.com_servicemonitors.yaml" ]; then echo "$dest/crds"; exit 0; fi
if [ "${1:-}" = --print-path ]; then exit 1; fi
mkdir -p "$cache_root"
exec 9>"$cache_root/.build-monitoring-crds.lock"
flock -w 1800 9 || { echo "build-monitoring-crds.sh: $cache_root/.build-monitoring-crds.lock held for 30 minutes" >&2; exit 1; }
if [ -f "$dest/crds/monitoring.coreos.com_servicemonitors.yaml" ]; then echo "$dest/crds"; exit 0; fi

command -v go >/dev/null || { echo "build-monitoring-crds.sh: Go is needed" >&2; exit 3; }
export GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=mod
tmp="$dest.partial"
if [ -d "$tmp" ]; then chmod -R u+w "$tmp"; rm -rf "$tmp"; fi
mkdir -p "$tmp/bin" "$tmp/crds"
echo "build-monitoring-crds.sh: generating $MONITORING_MODULE $MONITORING_VERSION's CRDs" >&2
GOBIN="$tmp/bin" go install "$CONTROLLER_TOOLS"
json=$(go mod download -json "$MONITORING_MODULE@$MONITORING_VERSION")
dir=$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
[ -n "$dir" ] && [ -f "$dir/go.mod" ] || { printf 'build-monitoring-crds.sh: no source folder:\n%s\n' "$json" >&2; exit 1; }
cp -r "$dir" "$tmp/src"
chmod -R u+w "$tmp/src"  # the module cache is read-only
(cd "$tmp/src" && "$tmp/bin/controller-gen" crd:crdVersions=v1,maxDescLen=0 paths=./v1/... output:crd:dir="$tmp/crds")
for kind in servicemonitors podmonitors prometheusrules; do
  [ -f "$tmp/crds/monitoring.coreos.com_$kind.yaml" ] || { echo "build-monitoring-crds.sh: no $kind CRD" >&2; exit 1; }
done
rm -rf "$tmp/src" "$tmp/bin"
mv "$tmp" "$dest"
echo "$dest/crds"
