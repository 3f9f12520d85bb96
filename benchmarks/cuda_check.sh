#!/usr/bin/env bash
# The GPU check to run once on a lent GPU machine (issue #21): build kt-cuda there, run its GPU
# tests (stream order, CUDA-graph capture + replay at 1/2/4/8 tokens against eager, overlap of
# other-stream GPU work with the CPU experts), time a hybrid layer with and without the bridge
# (benchmarks/cuda_bridge.py), and run benchmarks/amx_hardware_check.sh when that host's CPU has AMX.
#
#   benchmarks/cuda_check.sh [OUT]        # OUT: where logs and JSON go (default ./results)
#
# Uses the machine's python with its CUDA torch and nvcc; builds with --no-build-isolation, so
# scikit-build-core and nanobind must be importable (the device machine has nanobind; carry
# wheels for what is missing and point PIP_FIND_LINKS at them). About 5 minutes on 16 cores.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/results}"
mkdir -p "$OUT"
cd "$ROOT"
PY=${PYTHON:-python3}
PIP=("$PY" -m pip install -q --disable-pip-version-check --no-build-isolation)

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/cuda_gpu.txt"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())" \
  | tee -a "$OUT/cuda_gpu.txt"
"$PY" -m pip install -q "scikit-build-core>=0.10" "nanobind>=2.4" pytest numpy
"${PIP[@]}" ./packages/kt-core ./packages/kt-backend-avx
"${PIP[@]}" ./packages/kt-cuda
kt doctor | tee "$OUT/cuda_doctor.txt" | grep -E '^(CPU|device)'
"$PY" -m pytest -q -rs packages/kt-cuda/tests 2>&1 | tee "$OUT/cuda_tests.txt" | tail -5
"$PY" benchmarks/cuda_bridge.py --json "$OUT/cuda_bridge.json" | tee "$OUT/cuda_bridge.txt"
if grep -qw amx_tile /proc/cpuinfo; then
  benchmarks/amx_hardware_check.sh "$OUT"
else
  echo "no AMX on this host's CPU: amx_hardware_check.sh not run" | tee "$OUT/amx_skipped.txt"
fi
