#!/usr/bin/env bash
# Builds the llama.cpp engine's parts from llama-cpp-python's sdist (PyPI serves no wheel of it for Linux), into a
# cache outside the repo:
#   wheels/llama_cpp_python-*.whl   the Python bindings with their libllama/libggml, installed into the venv by
#                                   setup and into the CPU runtime image (engine: llamacpp)
#   bin/llama-server                llama.cpp's own OpenAI server, from the llama.cpp the sdist vendors (the same
#                                   source): the peer of bench/llamacpp_bench.py, never shipped
#   bin/llama-quantize              quantizes a GGUF (Q4_K_M...) for the tests and the bench
#   convert/                        llama.cpp's HF -> GGUF converter (convert_hf_to_gguf.py, conversion/, gguf-py)
#                                   from the same source: the tests' fixture writes the tiny model's GGUF with it
# CPU code: x86-64-v3 (AVX2, FMA, F16C, BMI2), not -march=native: the wheel goes into an image that runs on nodes
# other than the one that built it. No web UI (it would be fetched from the network), no OpenSSL, no curl: the
# runtime reads model files from disk only.
# The cache folder's name carries a hash of this script (the pins and flags live here). Prints the folder on stdout.
# Concurrent runs take turns on a lock: the second finds the cache complete.
# `build-llamacpp.sh --print-path`: print the folder if it is built (exit 1 if not), never build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
VERSION=0.3.36
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
CPU_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
COMMON_FLAGS="-DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF"

key=$(sha256sum "$here/build-llamacpp.sh" | cut -c1-12)
cache_root=${SERVLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/servlane}
dest="$cache_root/llamacpp-$VERSION-$key"

built() { [ -x "$dest/bin/llama-server" ] && [ -x "$dest/bin/llama-quantize" ] && compgen -G "$dest/wheels/llama_cpp_python-$VERSION-*.whl" >/dev/null; }
if built; then echo "$dest"; exit 0; fi
if [ "${1:-}" = --print-path ]; then exit 1; fi
mkdir -p "$cache_root"
exec 9>"$cache_root/.build-llamacpp.lock"
flock -w 3600 9 || { echo "build-llamacpp.sh: another build has held $cache_root/.build-llamacpp.lock for an hour" >&2; exit 1; }
if built; then echo "$dest"; exit 0; fi  # built by the run we waited for

for tool in cmake g++ python3.11; do
  command -v "$tool" >/dev/null || { echo "build-llamacpp.sh: $tool is needed" >&2; exit 3; }
done
jobs=$(nproc)
tmp="$dest.partial"
rm -rf "$tmp"; mkdir -p "$tmp/src" "$tmp/wheels" "$tmp/bin"
start=$(date +%s)
echo "build-llamacpp.sh: llama-cpp-python $VERSION (sdist from PyPI)" >&2
python3.11 -m pip download --disable-pip-version-check --no-deps --no-binary :all: \
  "llama-cpp-python==$VERSION" -d "$tmp/src" >&2
sdist="$tmp/src/llama_cpp_python-$VERSION.tar.gz"
echo "$SDIST_SHA256  $sdist" | sha256sum -c - >&2

echo "build-llamacpp.sh: the wheel ($jobs jobs)" >&2
CMAKE_ARGS="$CPU_FLAGS $COMMON_FLAGS -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$jobs \
  python3.11 -m pip wheel --disable-pip-version-check --no-deps "$sdist" -w "$tmp/wheels" >&2

echo "build-llamacpp.sh: llama-server from the same llama.cpp ($jobs jobs)" >&2
tar -xzf "$sdist" -C "$tmp/src"
vendored="$tmp/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
# shellcheck disable=SC2086  # the flag lists are word lists
cmake -S "$vendored" -B "$tmp/src/server-build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  $CPU_FLAGS $COMMON_FLAGS -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >&2
cmake --build "$tmp/src/server-build" --target llama-server llama-quantize -j "$jobs" >&2
cp "$tmp/src/server-build/bin/llama-server" "$tmp/src/server-build/bin/llama-quantize" "$tmp/bin/"
mkdir -p "$tmp/convert"
cp -r "$vendored/convert_hf_to_gguf.py" "$vendored/conversion" "$vendored/gguf-py" "$tmp/convert/"
"$tmp/bin/llama-server" --version >&2 || true
rm -rf "$tmp/src"
secs=$(( $(date +%s) - start ))
printf '{"seconds": %d, "bytes": %d, "key": "%s", "llama_cpp_python": "%s", "cpu_flags": "%s"}\n' "$secs" \
  "$(du -sb "$tmp" | cut -f1)" "$key" "$VERSION" "$CPU_FLAGS" > "$tmp/build.json"
rm -rf "$dest"; mv "$tmp" "$dest"
echo "build-llamacpp.sh: built in ${secs}s: $(du -sh "$dest" | cut -f1) in $dest" >&2
echo "$dest"
