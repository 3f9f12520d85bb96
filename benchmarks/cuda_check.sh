#!/usr/bin/env bash
# The GPU check to run once on a lent GPU machine (issue #21): build kt-cuda there, run its GPU
# tests (stream order, CUDA-graph capture + replay at 1/2/4/8 tokens against eager, overlap of
# other-stream GPU work with the CPU experts), time a hybrid layer with and without the bridge
# (benchmarks/cuda_bridge.py), check training with the model on the GPU (benchmarks/sft_gpu_check.py), run
# benchmarks/amx_hardware_check.sh when that host's CPU has AMX, and time a LoRA training step of one
# layer against torch on that CPU (benchmarks/sft_layer.py).
#
#   benchmarks/cuda_check.sh [OUT]        # OUT: where logs and JSON go (default ./results)
#
# Uses the machine's python with its CUDA torch and nvcc; builds with --no-build-isolation. A
# machine without a package index gets what it lacks from a carried `.devwheels/` (ignored by git):
# wheels for scikit-build-core, nanobind, cmake, ninja, pytest and their dependencies, plus
# `hw/` (hwloc headers, library and a pkg-config whose .pc file is relative to itself) — made here
# with `pip download --python-version 3.12 --only-binary=:all: -d .devwheels ...` and Debian's
# libhwloc-dev and pkgconf. About 5 minutes on 16 cores, AMX check included.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/results}"
mkdir -p "$OUT"
cd "$ROOT"
PY=${PYTHON:-python3}
PIP=("$PY" -m pip install -q --disable-pip-version-check --no-build-isolation)
if [ -d "$ROOT/.devwheels" ]; then
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$ROOT/.devwheels"
  export PATH="$ROOT/.devwheels/hw/bin:$PATH" PKG_CONFIG_PATH="$ROOT/.devwheels/hw/lib/pkgconfig"
  export LD_LIBRARY_PATH="$ROOT/.devwheels/hw/lib:${LD_LIBRARY_PATH:-}"
fi

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/cuda_gpu.txt"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())" \
  | tee -a "$OUT/cuda_gpu.txt"
"$PY" -m pip install -q "scikit-build-core>=0.10" "nanobind>=2.4" pytest numpy
"${PIP[@]}" ./packages/kt-core     # alone first: the backends build against the installed kt-core
"${PIP[@]}" ./packages/kt-backend-avx
"${PIP[@]}" ./packages/kt-cuda
kt doctor | tee "$OUT/cuda_doctor.txt" | grep -E '^(CPU|device)'
"$PY" -m pytest -q -rsP packages/kt-cuda/tests 2>&1 | tee "$OUT/cuda_tests.txt" | grep -E "passed|failed|submit |Error|assert" | tail -12
"$PY" benchmarks/cuda_bridge.py --json "$OUT/cuda_bridge.json" | tee "$OUT/cuda_bridge.txt"
# Training (issue #24): hidden states and gradients on the GPU, the experts (and their LoRA) on kt.
PYTHONPATH="$ROOT/packages/kt/src" "$PY" benchmarks/sft_gpu_check.py 2>&1 | tee "$OUT/sft_gpu_check.txt" \
  || echo "sft_gpu_check.py FAILED" | tee -a "$OUT/sft_gpu_check.txt"
if grep -qw amx_tile /proc/cpuinfo; then
  KT_CHECK_IN_PLACE=1 PYTHON="$PY" benchmarks/amx_hardware_check.sh "$OUT"
else
  echo "no AMX on this host's CPU: amx_hardware_check.sh not run" | tee "$OUT/amx_skipped.txt"
fi
# One Qwen3-30B-A3B layer's LoRA training step on this host's CPU, kt vs torch (same run).
PYTHONPATH="$ROOT/packages/kt/src" "$PY" benchmarks/sft_layer.py --tokens 512 2048 --ranks 8 \
  --methods BF16 BF16+fast INT4 --repeats 3 --json "$OUT/sft_layer.json" 2>&1 | tee "$OUT/sft_layer.txt" || true
