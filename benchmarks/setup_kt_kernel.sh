#!/usr/bin/env bash
# Create the comparison venv for kt-kernel 0.7.2 (KTransformers), the baseline
# benchmarks/moe_layer.py measures kt against. Idempotent: re-running only fills in
# what is missing. Nothing of kt-kernel is ever copied into the repository.
#
#   benchmarks/setup_kt_kernel.sh [VENV]      # default: <repo>/.bench/kt-kernel-venv
#
# Why a separate, clean venv: the kt-kernel wheel pins torch==2.9.1, which this host
# does not have; with --no-deps it runs on the local CPU torch 2.13.0 (its native
# extensions do not link libtorch), see /work/shared/KT_KERNEL_0.7.2.md. Keeping it
# apart from kt's environment means neither can break the other.
#
# Environment: PYTHON (interpreter to build the venv from; kt-kernel 0.7.2 ships cp311
# wheels only), TORCH_VERSION (default 2.13.0), PIP_FIND_LINKS (local wheels; default
# /opt/wheels when that folder exists).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.bench/kt-kernel-venv}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
KT_KERNEL_VERSION="0.7.2"
if [[ -z "${PIP_FIND_LINKS:-}" && -d /opt/wheels ]]; then
  export PIP_FIND_LINKS=/opt/wheels
fi

pyver="$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
if [[ "$pyver" != "3.11" ]]; then
  echo "error: kt-kernel $KT_KERNEL_VERSION ships CPython 3.11 wheels only; $PYTHON is $pyver." >&2
  echo "       Set PYTHON=/path/to/python3.11 and re-run." >&2
  exit 1
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "creating venv $VENV"
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

have() {  # have DIST VERSION: the venv has distribution DIST at a version starting with VERSION
  "$PY" - "$1" "$2" <<'PYEOF' >/dev/null 2>&1
import importlib.metadata as md, sys
sys.exit(0 if md.version(sys.argv[1]).startswith(sys.argv[2]) else 1)
PYEOF
}

if ! have torch "$TORCH_VERSION"; then
  # Resolves from the local wheel folder; the CPU build is the only one there.
  "$PY" -m pip install -q "torch==$TORCH_VERSION" 2> >(grep -v "is ignored: it is neither" >&2)
fi
# kt_kernel's import chain needs numpy, safetensors and gguf (utils/loader.py); its other
# requirements (torch==2.9.1, triton, typer, rich, httpx, pyyaml, packaging) serve its CLI and GPU
# paths, which the benchmark does not use.
for dep in numpy safetensors gguf; do
  if ! have "$dep" ""; then
    "$PY" -m pip install -q "$dep"
  fi
done
if ! have kt-kernel "$KT_KERNEL_VERSION"; then
  # --no-deps: its torch==2.9.1 pin would replace the local torch (and is not available here).
  "$PY" -m pip install -q --no-deps "kt-kernel==$KT_KERNEL_VERSION"
fi

"$PY" - <<'PYEOF'
import kt_kernel, torch
from kt_kernel_ext.moe import MOEConfig  # noqa: F401  (the extension registers itself on import)
print(f"kt-kernel {kt_kernel.__version__ if hasattr(kt_kernel, '__version__') else '?'} "
      f"(cpu variant {getattr(kt_kernel, '__cpu_variant__', '?')}), torch {torch.__version__}")
PYEOF
echo "ok: $VENV (pass --kt-kernel-venv $VENV to benchmarks/moe_layer.py)"
