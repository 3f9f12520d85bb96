#!/usr/bin/env bash
# An arm64 Debian (bookworm) root with Python 3.11, its pip, NumPy, pytest and hwloc, for running kt's
# aarch64 builds under qemu-user (`qemu-aarch64 -L ROOT ROOT/usr/bin/python3`) and for the cross
# build's target headers and libraries. debootstrap only downloads and unpacks (--foreign): no
# maintainer script runs, so nothing here needs binfmt_misc or root inside a chroot; the two
# alternatives NumPy's BLAS needs are made by hand.
#
#   tools/aarch64/make_root.sh [ROOT]        # default: .aarch64/root (ignored by git); ~40 s, ~250 MB
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="${1:-.aarch64/root}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
if [ -x "$ROOT/usr/bin/python3" ] && [ -f "$ROOT/.kt-root-complete" ]; then
  echo "arm64 root ready: $ROOT"
  exit 0
fi
rm -rf "$ROOT"
mkdir -p "$ROOT"
debootstrap --arch=arm64 --variant=minbase --foreign \
  --include=python3,python3-pip,python3-numpy,python3-pytest,python3-dev,python3-yaml,python3-tqdm,python3-requests,libhwloc-dev,libstdc++6 \
  bookworm "$ROOT" "$MIRROR" >"$ROOT.log" 2>&1 || { tail -20 "$ROOT.log"; exit 1; }
for deb in "$ROOT"/var/cache/apt/archives/*.deb; do dpkg-deb -x "$deb" "$ROOT"; done
ln -sf blas/libblas.so.3 "$ROOT/usr/lib/aarch64-linux-gnu/libblas.so.3"
ln -sf lapack/liblapack.so.3 "$ROOT/usr/lib/aarch64-linux-gnu/liblapack.so.3"
# The cross build includes only the multiarch header directory of the root (tools/aarch64/toolchain.cmake).
mkdir -p "$ROOT/kt-include"
ln -sfn ../usr/include/aarch64-linux-gnu "$ROOT/kt-include/aarch64-linux-gnu"
rm -rf "$ROOT"/var/cache/apt/archives/*.deb
qemu-aarch64 -L "$ROOT" "$ROOT/usr/bin/python3" -c "import numpy, pytest, pip, platform; print('arm64 root:', platform.machine(), numpy.__version__, 'pip', pip.__version__)"
touch "$ROOT/.kt-root-complete"
