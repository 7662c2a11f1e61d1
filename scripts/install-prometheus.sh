#!/usr/bin/env bash
# Installs Debian's real Prometheus server binary for tests/prometheus (the canary metric reader's
# integration test). Idempotent: does nothing when `prometheus` is already on PATH.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1; then
  echo "prometheus already installed: $(command -v prometheus)"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# --no-install-recommends: only the server binary, not node-exporter & co.
$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
# The package starts a system service where systemd runs; the tests start their own server on loopback.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
echo "prometheus installed: $(command -v prometheus)"
prometheus --version 2>&1 | head -1
