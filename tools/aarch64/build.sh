#!/usr/bin/env bash
# Builds aarch64 wheels of kt packages — scikit-build-core cross-compiling with toolchain.cmake against
# the arm64 root, then audited by auditwheel into manylinux wheels (the root's libhwloc grafted into
# kt-core's, the tag the glibc symbols allow: manylinux_2_34_aarch64) — into .aarch64/wheels, and pip-installs them with
# the root's own pip, under qemu, into the arm64 venv .aarch64/venv (system site packages: the root's
# NumPy and pytest), as a user on an ARM server would: `pip install kt-core kt-backend-kml`.
#
#   tools/aarch64/build.sh [PACKAGE...]      # default: kt-core
#   qemu-aarch64 -cpu neoverse-n1 -L .aarch64/root .aarch64/venv/bin/python -m kt_core.cli doctor
#
# Builds are incremental (.aarch64/skbuild/PACKAGE); every wheel in .aarch64/wheels is reinstalled.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD/.aarch64/root"
WHEELS="$PWD/.aarch64/wheels"
VENV="$PWD/.aarch64/venv"
PY="${PYTHON:-$PWD/.venv/bin/python}"
[ -f "$ROOT/.kt-root-complete" ] || tools/aarch64/make_root.sh "$ROOT"
mkdir -p "$WHEELS"
# The conformance suite's GGUF blocks come from the gguf package: pure Python, fetched by the host's
# pip; its dependencies are the root's Debian packages.
ls "$WHEELS"/gguf-*.whl >/dev/null 2>&1 || "$PY" -m pip download -q --no-deps -d "$WHEELS" gguf
pkgs=("${@:-kt-core}")
for pkg in "${pkgs[@]}"; do
  rm -f "$WHEELS/${pkg//-/_}"-*.whl
  KT_AARCH64_ROOT="$ROOT" "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$WHEELS" "packages/$pkg" \
    -C wheel.tags=cp311-cp311-linux_aarch64 -C build-dir="$PWD/.aarch64/skbuild/$pkg" \
    -C cmake.define.CMAKE_TOOLCHAIN_FILE="$PWD/tools/aarch64/toolchain.cmake" -C cmake.define.KT_AARCH64_ROOT="$ROOT"
  # auditwheel reads the aarch64 ELF files from this x86 host; the libraries it grafts are the root's.
  raw="$(ls "$WHEELS/${pkg//-/_}"-*-linux_aarch64.whl)"
  if ! log="$(PATH="$(dirname "$PY"):$PATH" "$PY" -m auditwheel repair --plat auto -w "$WHEELS" \
      --ldpaths "$ROOT/usr/lib/aarch64-linux-gnu:$ROOT/lib/aarch64-linux-gnu" "$raw" 2>&1)"; then
    echo "$log" >&2
    echo "error: auditwheel could not repair $raw" >&2
    exit 1
  fi
  rm -f "$raw"
  echo "aarch64: $(basename "$WHEELS/${pkg//-/_}"-*.whl)"
done
qemu() { qemu-aarch64 -L "$ROOT" "$@"; }
[ -x "$VENV/bin/python" ] || qemu "$ROOT/usr/bin/python3" -m venv --without-pip --system-site-packages "$VENV"
# Uninstall first: a rebuilt wheel keeps its version, and pip would keep the installed one.
qemu "$VENV/bin/python" -m pip uninstall -q -y "${pkgs[@]}" 2>/dev/null || true
qemu "$VENV/bin/python" -m pip install -q --no-index --find-links "$WHEELS" "${pkgs[@]}" gguf
qemu "$VENV/bin/python" -m pip list 2>/dev/null | grep -E "^(kt-|gguf)" | sed 's/^/aarch64 venv: /'
