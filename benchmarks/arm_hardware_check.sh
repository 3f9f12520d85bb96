#!/usr/bin/env bash
# The ARM check to run once on an aarch64 host (issue #22): kt-backend-kml built natively, its
# tests and the conformance suite on real hardware (every target the CPU has), then timings —
# each runnable target against the others on the same layer (the NEON / dot-product / I8MM / SVE
# kernels whose instruction counts docs/backends.md gives), kt against plain torch, and kt's
# LLAMAFILE against llama.cpp's ggml-cpu on the same GGUF blocks where llama.cpp can be built.
#
#   benchmarks/arm_hardware_check.sh [OUT]        # OUT: where logs and JSON go (default ./results)
#
# Needs a Python 3.11+ with pip and, offline, a wheelhouse holding scikit-build-core, nanobind,
# cmake, ninja, numpy, pytest, typer, rich, safetensors, gguf and a CPU torch (PIP_FIND_LINKS), and
# for the llama.cpp column the llama-cpp-python sdist (benchmarks/setup_llama_cpp.sh). Exits 0 with
# a message on another architecture. Never run yet: no ARM machine has been lent.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/results}"
mkdir -p "$OUT"
cd "$ROOT"

if [[ "$(uname -m)" != "aarch64" ]]; then
  echo "not an ARM host: uname -m says $(uname -m); this check runs on aarch64"
  exit 0
fi
(lscpu || true) | tee "$OUT/arm_lscpu.txt" | grep -E 'Model name|Vendor|Flags|Core|Socket|NUMA node\(s\)' || true

PY=${PYTHON:-python3}
VENV="$ROOT/.arm-venv"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
"${PIP[@]}" "scikit-build-core>=0.10" "nanobind>=2.4" cmake ninja numpy pytest typer rich safetensors gguf
"${PIP[@]}" torch || echo "no torch wheel here: the torch column is skipped"
"${PIP[@]}" --no-build-isolation ./packages/kt-core
"${PIP[@]}" --no-build-isolation ./packages/kt-backend-kml
export PATH="$VENV/bin:$PATH" PYTHONPATH="$ROOT/packages/kt/src${PYTHONPATH:+:$PYTHONPATH}"

kt doctor | tee "$OUT/arm_doctor.txt"
kt backends | tee "$OUT/arm_backends.txt"
python -m pytest -q -rs packages/kt-backend-kml/tests packages/kt-core/tests/test_host_aarch64.py 2>&1 | tee "$OUT/arm_tests.txt"
python -m pytest -q -p kt_core.testing.plugin --kt-backend kml --pyargs kt_core.testing.conformance 2>&1 | tail -3 \
  | tee "$OUT/arm_conformance.txt"

# Every target this CPU runs, on the same layer: decode (1 token) and prefill.
variants=$(python - <<'EOF'
import kt_backend_kml, kt_core
print(" ".join(t["name"] for t in kt_backend_kml.TARGETS if not kt_core.host().missing(t["features"])))
EOF
)
sides=(kt)
python -c "import torch" 2>/dev/null && sides=(kt torch)
threads=$(nproc)
for v in $variants; do
  KT_BACKENDS=kml KT_CPU_VARIANT=$v python benchmarks/moe_layer.py --shapes qwen3-30b-a3b --tokens 1 16 256 \
    --methods BF16 INT8 INT4 FP8 --threads 1 "$threads" --repeats 5 --sides "${sides[@]}" \
    --json "$OUT/arm_moe_layer_$v.json" 2>&1 | tail -30 | tee "$OUT/arm_moe_layer_$v.txt"
  sides=(kt)   # torch once is enough
done

# GGUF: kt's LLAMAFILE against llama.cpp's ggml-cpu (NEON/SVE, -march=native) on the same blocks.
llama=()
if benchmarks/setup_llama_cpp.sh "$ROOT/.bench/llama.cpp" > "$OUT/arm_llama_cpp_build.txt" 2>&1; then
  llama=(--llama-cpp "$ROOT/.bench/llama.cpp")
else
  echo "llama.cpp could not be built here (see $OUT/arm_llama_cpp_build.txt): kt's LLAMAFILE alone"
fi
python benchmarks/gguf_layer.py --tokens 1 256 --threads "$threads" --passes 3 "${llama[@]}" \
  --methods "LLAMAFILE Q4_0" "LLAMAFILE Q8_0" "LLAMAFILE Q4_K_M" "LLAMAFILE Q6_K" \
  --json "$OUT/arm_gguf_layer.json" 2>&1 | tail -30 | tee "$OUT/arm_gguf_layer.txt"
echo "logs and JSON in $OUT"
