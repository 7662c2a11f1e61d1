#!/usr/bin/env bash
# Vendors the console's charting library (uPlot, MIT) into the gateway package, at build time only: the
# gateway never fetches anything at run time. `npm pack` downloads the pinned tarball, whose sha512 must
# match the pin below (what `npm view uplot@<version> dist.integrity` prints) before anything is copied.
# Re-run after changing the pin; the copied files are committed.
set -euo pipefail

NAME=uplot
VERSION=1.6.32
INTEGRITY="sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw=="

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$ROOT/gateway/servlane_gateway/console/static/vendor"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

(cd "$WORK" && npm pack --silent "$NAME@$VERSION" >/dev/null)
TARBALL="$WORK/$NAME-$VERSION.tgz"
ACTUAL="sha512-$(openssl dgst -sha512 -binary "$TARBALL" | base64 -w0)"
if [[ "$ACTUAL" != "$INTEGRITY" ]]; then
  echo "integrity mismatch for $NAME@$VERSION: expected $INTEGRITY, got $ACTUAL" >&2
  exit 1
fi
tar -xzf "$TARBALL" -C "$WORK"
mkdir -p "$DEST"
cp "$WORK/package/dist/uPlot.iife.min.js" "$DEST/uPlot.iife.min.js"
cp "$WORK/package/dist/uPlot.min.css" "$DEST/uPlot.min.css"
cp "$WORK/package/LICENSE" "$DEST/uPlot.LICENSE"
echo "$NAME@$VERSION $INTEGRITY" > "$DEST/VERSION"
echo "vendored $NAME@$VERSION into $DEST"
