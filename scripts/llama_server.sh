#!/usr/bin/env bash
# llama.cpp's own OpenAI-compatible server, `llama-server`, built once from the llama.cpp sources that
# llama-cpp-python's source distribution vendors (the same llama.cpp as the `llamacpp:` engine), for the
# serving tests that need several slots and continuous batching (tests/engines/test_serving.py):
# llama-cpp-python's own server answers one request at a time.
#
#   CACHE/llama-server   the binary (portable across x86-64 CPUs: GGML_NATIVE=OFF), written last
#
# Usage: scripts/llama_server.sh [CACHE]   (default ~/.cache/pytest-llmdeterminism/llama-server-0.3.36)
# Needs pip (the source distribution comes from the package index), cmake, ninja and a C++ compiler.
# No web UI and no model downloads are built in (LLAMA_BUILD_UI=OFF, LLAMA_CURL=OFF).
set -euo pipefail

VERSION="0.3.36"
CACHE="${1:-$HOME/.cache/pytest-llmdeterminism/llama-server-$VERSION}"
PYTHON="${PYTHON:-python3}"
if [ -x "$CACHE/llama-server" ]; then
    exit 0
fi
mkdir -p "$CACHE"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
"$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    -d "$WORK" "llama-cpp-python==$VERSION"
tar xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK" "llama_cpp_python-$VERSION/vendor/llama.cpp"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
cmake -S "$SRC" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF > "$CACHE/build.log" 2>&1
cmake --build "$WORK/build" --target llama-server -j "$(nproc)" >> "$CACHE/build.log" 2>&1
cp "$WORK/build/bin/llama-server" "$CACHE/llama-server.tmp"
mv "$CACHE/llama-server.tmp" "$CACHE/llama-server"
