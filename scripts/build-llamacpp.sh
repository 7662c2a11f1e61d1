#!/usr/bin/env bash
# Builds the llama.cpp engine's parts from llama-cpp-python's sdist (PyPI serves no wheel of it for Linux), into
# caches outside the repo, in two parts:
#   build-llamacpp.sh            the engine: what setup, the CPU image and the tests need
#     wheels/llama_cpp_python-*.whl   the Python bindings with their libllama/libggml, installed into the venv by
#                                     setup and into the CPU runtime image (engine: llamacpp)
#     convert/                        llama.cpp's HF -> GGUF converter (convert_hf_to_gguf.py, conversion/, gguf-py)
#                                     from the same source: the tests' fixture writes the tiny model's GGUF with it
#   build-llamacpp.sh --tools    the bench's tools, built only when asked (a second compile of llama.cpp, which
#                                the tests and the images do without)
#     bin/llama-server                llama.cpp's own OpenAI server, from the llama.cpp the sdist vendors (the same
#                                     source): the peer of bench/llamacpp_bench.py, never shipped
#     bin/llama-quantize              quantizes a GGUF (Q4_K_M...) for the bench
# CPU code: x86-64-v3 (AVX2, FMA, F16C, BMI2), not -march=native: the wheel goes into an image that runs on nodes
# other than the one that built it. No web UI (it would be fetched from the network), no OpenSSL, no curl: the
# runtime reads model files from disk only.
# Each part's folder is named by a hash of the pins and of the function that builds it (declare -f): changing
# either rebuilds that part alone. Prints the folder on stdout. Concurrent runs take turns on a lock: the second
# finds the cache complete. `--print-path` (with or without --tools): print the folder if it is built (exit 1
# if not), never build.
set -euo pipefail
VERSION=0.3.36
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
CPU_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
COMMON_FLAGS="-DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF"

part=engine print_only=false
for arg in "$@"; do
  case "$arg" in
    --tools) part=tools ;;
    --print-path) print_only=true ;;
    *) echo "build-llamacpp.sh: unknown argument $arg (--tools, --print-path)" >&2; exit 2 ;;
  esac
done

fetch_sdist() {  # $1: a folder; prints the checked sdist's path
  python3.11 -m pip download --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$VERSION" -d "$1" >&2
  echo "$SDIST_SHA256  $1/llama_cpp_python-$VERSION.tar.gz" | sha256sum -c - >&2
  echo "$1/llama_cpp_python-$VERSION.tar.gz"
}

build_engine() {  # $1: the folder to fill
  local sdist vendored
  sdist=$(fetch_sdist "$1/src")
  echo "build-llamacpp.sh: the wheel ($(nproc) jobs)" >&2
  mkdir -p "$1/wheels" "$1/convert"
  CMAKE_ARGS="$CPU_FLAGS $COMMON_FLAGS -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    python3.11 -m pip wheel --disable-pip-version-check --no-deps "$sdist" -w "$1/wheels" >&2
  tar -xzf "$sdist" -C "$1/src"
  vendored="$1/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
  cp -r "$vendored/convert_hf_to_gguf.py" "$vendored/conversion" "$vendored/gguf-py" "$1/convert/"
}

build_tools() {  # $1: the folder to fill
  local sdist vendored
  sdist=$(fetch_sdist "$1/src")
  tar -xzf "$sdist" -C "$1/src"
  vendored="$1/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
  echo "build-llamacpp.sh: llama-server and llama-quantize from the same llama.cpp ($(nproc) jobs)" >&2
  # shellcheck disable=SC2086  # the flag lists are word lists
  cmake -S "$vendored" -B "$1/src/server-build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    $CPU_FLAGS $COMMON_FLAGS -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >&2
  cmake --build "$1/src/server-build" --target llama-server llama-quantize -j "$(nproc)" >&2
  mkdir -p "$1/bin"
  cp "$1/src/server-build/bin/llama-server" "$1/src/server-build/bin/llama-quantize" "$1/bin/"
  "$1/bin/llama-server" --version >&2 || true
}

if [ "$part" = engine ]; then
  built() { [ -f "$dest/convert/convert_hf_to_gguf.py" ] && compgen -G "$dest/wheels/llama_cpp_python-$VERSION-*.whl" >/dev/null; }
else
  built() { [ -x "$dest/bin/llama-server" ] && [ -x "$dest/bin/llama-quantize" ]; }
fi
key=$({ echo "$VERSION $SDIST_SHA256 $CPU_FLAGS $COMMON_FLAGS"; declare -f fetch_sdist "build_$part"; } | sha256sum | cut -c1-12)
cache_root=${SERVLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/servlane}
dest="$cache_root/llamacpp-$part-$VERSION-$key"

if built; then echo "$dest"; exit 0; fi
if $print_only; then exit 1; fi
mkdir -p "$cache_root"
exec 9>"$cache_root/.build-llamacpp-$part.lock"
flock -w 3600 9 || { echo "build-llamacpp.sh: another build has held $cache_root/.build-llamacpp-$part.lock for an hour" >&2; exit 1; }
if built; then echo "$dest"; exit 0; fi  # built by the run we waited for

for tool in cmake g++ python3.11; do
  command -v "$tool" >/dev/null || { echo "build-llamacpp.sh: $tool is needed" >&2; exit 3; }
done
tmp="$dest.partial"
rm -rf "$tmp"; mkdir -p "$tmp/src"
start=$(date +%s)
echo "build-llamacpp.sh: llama-cpp-python $VERSION, the $part (sdist from PyPI)" >&2
"build_$part" "$tmp"
rm -rf "$tmp/src"
secs=$(( $(date +%s) - start ))
printf '{"part": "%s", "seconds": %d, "bytes": %d, "key": "%s", "llama_cpp_python": "%s", "cpu_flags": "%s"}\n' \
  "$part" "$secs" "$(du -sb "$tmp" | cut -f1)" "$key" "$VERSION" "$CPU_FLAGS" > "$tmp/build.json"
rm -rf "$dest"; mv "$tmp" "$dest"
echo "build-llamacpp.sh: the $part built in ${secs}s: $(du -sh "$dest" | cut -f1) in $dest" >&2
echo "$dest"
