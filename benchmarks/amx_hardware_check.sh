#!/usr/bin/env bash
# The AMX check to run once on a host with AMX (issue #8): does the hardware build select, pass
# the AMX tests and the conformance suite on real tiles, and how does its prefill compare with
# kt-backend-avx (and kt-kernel 0.7.2 where its venv exists) in the same run.
#
#   benchmarks/amx_hardware_check.sh [OUT]        # OUT: where logs and JSON go (default ./results)
#
# Needs a Python 3.11+ with pip and, offline, a wheelhouse holding scikit-build-core, nanobind,
# cmake, ninja, numpy, pytest, typer, rich, safetensors, gguf and a CPU torch: point
# PIP_FIND_LINKS at it (e.g. one built here with `pip download -d .whl ...` and carried along).
# Runs in about 5 minutes on 16 cores; exits 0 with a message where the CPU or OS lacks AMX.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/results}"
mkdir -p "$OUT"
cd "$ROOT"

flags="$(grep -m1 '^flags' /proc/cpuinfo || true)"
for f in amx_tile amx_int8 amx_bf16; do
  if [[ " $flags " != *" $f "* ]]; then
    echo "no AMX here: /proc/cpuinfo lacks $f ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2))"
    exit 0
  fi
done
lscpu | tee "$OUT/amx_lscpu.txt" | grep -E 'Model name|Socket|Core|NUMA node\(s\)'

PY=${PYTHON:-python3}
if [ -n "${KT_CHECK_IN_PLACE:-}" ]; then
  # Called by cuda_check.sh: $PY already has torch, numpy, pytest, kt-core and kt-backend-avx.
  PIP=("$PY" -m pip install -q --disable-pip-version-check)
  python() { "$PY" "$@"; }
else
  VENV="$ROOT/.amx-venv"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
  "${PIP[@]}" "scikit-build-core>=0.10" "nanobind>=2.4" cmake ninja numpy pytest typer rich safetensors gguf torch
  "${PIP[@]}" --no-build-isolation ./packages/kt-core
  "${PIP[@]}" --no-build-isolation ./packages/kt-backend-avx
  export PATH="$VENV/bin:$PATH"
fi
# The benchmark needs only kt's pure-Python bench helpers, not the kt application installed.
export PYTHONPATH="$ROOT/packages/kt/src${PYTHONPATH:+:$PYTHONPATH}"
KT_AMX_EMULATE=OFF "${PIP[@]}" --no-build-isolation ./packages/kt-backend-amx
kt backends | tee "$OUT/amx_backends.txt"
# Every batch on the tiles, then the default hand-off.
KT_AMX_MIN_ROWS=0 python -m pytest -q packages/kt-backend-amx/tests 2>&1 | tee "$OUT/amx_tests.txt"
KT_AMX_MIN_ROWS=0 python -m pytest -q -p kt_core.testing.plugin --kt-backend amx --pyargs kt_core.testing.conformance \
  2>&1 | tail -3 | tee "$OUT/amx_conformance.txt"

# Prefill and the decode crossover: amx and avx on the same data, same run.
kk=()
[ -x "$ROOT/.bench/kt-kernel-venv/bin/python" ] && kk=(--kt-kernel-venv "$ROOT/.bench/kt-kernel-venv")
threads=$(nproc)
for backends in amx,avx avx; do
  KT_BACKENDS=$backends python benchmarks/moe_layer.py --shapes qwen3-30b-a3b --tokens 16 64 256 1024 \
    --methods BF16 INT8 INT4 --threads "$threads" --repeats 5 "${kk[@]}" \
    --json "$OUT/amx_moe_layer_${backends/,/_}.json" 2>&1 | tail -40 | tee "$OUT/amx_moe_layer_${backends/,/_}.txt"
  kk=()   # kt-kernel once is enough
done
echo "logs and JSON in $OUT"
