#!/usr/bin/env bash
# Build llama.cpp's ggml CPU backend and benchmarks/llama_cpp_moe.cpp (its MoE layer on given
# ggml blocks), the peer benchmarks/gguf_layer.py --llama-cpp measures kt's LLAMAFILE against.
# Idempotent. Nothing of llama.cpp is ever copied into the repository: the source is the
# llama-cpp-python sdist from the package index (it vendors llama.cpp), unpacked under BUILD.
#
#   benchmarks/setup_llama_cpp.sh [BUILD]     # default: <repo>/.bench/llama.cpp
#
# Environment: LLAMA_CPP_PYTHON_VERSION (default 0.3.36, llama.cpp 0c1e570 as issue #26 measured),
# CMAKE_FLAGS (extra flags; the default build is -O3 -march=native: GGML_NATIVE=ON). An AVX2-only
# build on an AVX-512 host, to compare with kt's x86-64-v3 target (KT_MAX_ISA=x86-64-v3):
#   CMAKE_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" \
#       benchmarks/setup_llama_cpp.sh .bench/llama.cpp-avx2
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/.bench/llama.cpp}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$PY" ]] || PY=python3
mkdir -p "$BUILD"

src="$BUILD/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [[ ! -d "$src/ggml" ]]; then
  "$PY" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$BUILD/sdist" >&2
  tar xzf "$BUILD/sdist/llama_cpp_python-$VERSION.tar.gz" -C "$BUILD"
fi
[[ -d "$src/ggml" ]] || { echo "error: $src/ggml missing after unpacking the sdist" >&2; exit 1; }

# llama.cpp's own build, configured as for this host (static, the CPU backend linked in, no dynamic
# backend loading); only its ggml libraries are built.
cmake -S "$src" -B "$BUILD/ggml-build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=ON -DGGML_BACKEND_DL=OFF -DGGML_OPENMP=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF ${CMAKE_FLAGS:-} >&2
cmake --build "$BUILD/ggml-build" --target ggml ggml-cpu ggml-base -j "$(nproc)" >&2

libs=$(find "$BUILD/ggml-build" -name 'libggml*.a' | sort -r | tr '\n' ' ')
g++ -std=c++17 -O2 -I"$src/ggml/include" "$ROOT/benchmarks/llama_cpp_moe.cpp" -o "$BUILD/llama_cpp_moe" \
  -Wl,--start-group $libs -Wl,--end-group -fopenmp -lpthread -ldl
echo "ok: $BUILD/llama_cpp_moe (llama.cpp from llama-cpp-python $VERSION; pass --llama-cpp $BUILD to benchmarks/gguf_layer.py)"
