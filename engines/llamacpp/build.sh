#!/usr/bin/env bash
# Build llama.cpp's llama-server once and keep it outside the clone, so later runs (and CI on the
# same machine) reuse it. The source is the llama.cpp vendored in PyPI's llama-cpp-python sdist.
#
#   engines/llamacpp/build.sh            # prints the path of llama-server
#
# KVBENCH_ENGINE_CACHE overrides the cache folder (default /var/cache/kvbench).
set -euo pipefail
VERSION=0.3.36
CACHE=${KVBENCH_ENGINE_CACHE:-/var/cache/kvbench}
PREFIX=$CACHE/llamacpp-$VERSION
BIN=$PREFIX/bin/llama-server
if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
  echo "$BIN"
  exit 0
fi
command -v cmake >/dev/null || { echo "cmake is needed (Debian: apt-get install cmake)" >&2; exit 1; }
mkdir -p "$CACHE/src"
WORK=$(mktemp -d "$CACHE/build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
SDIST=$(ls "$CACHE/src"/llama_cpp_python-$VERSION.tar.gz 2>/dev/null || true)
if [ -z "$SDIST" ]; then
  python3 -m pip download --quiet --no-deps --no-binary=:all: "llama-cpp-python==$VERSION" -d "$CACHE/src" >&2
  SDIST=$CACHE/src/llama_cpp_python-$VERSION.tar.gz
fi
tar -xzf "$SDIST" -C "$WORK"
SRC=$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DGGML_NATIVE=OFF >&2
cmake --build "$WORK/build" --target llama-server -j "$(nproc)" >&2
mkdir -p "$PREFIX/bin.tmp"
cp "$WORK/build/bin/llama-server" "$PREFIX/bin.tmp/"
rm -rf "$PREFIX/bin"
mv "$PREFIX/bin.tmp" "$PREFIX/bin"
echo "$BIN"
