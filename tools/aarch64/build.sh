#!/usr/bin/env bash
# Cross-compiles kt packages for aarch64 (toolchain.cmake, against the arm64 root) and installs
# them into a site directory with their dist-info (version and entry points, so kt-core's backend
# discovery sees them) for `PYTHONPATH=SITE qemu-aarch64 -L ROOT ROOT/usr/bin/python3 ...`.
#
#   tools/aarch64/build.sh [PACKAGE...]      # default: kt-core; site .aarch64/site, builds in .aarch64/build
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD/.aarch64/root"
SITE="$PWD/.aarch64/site"
PY="${PYTHON:-$PWD/.venv/bin/python}"
[ -f "$ROOT/.kt-root-complete" ] || tools/aarch64/make_root.sh "$ROOT"
mkdir -p "$SITE"
# The conformance suite's GGUF blocks come from the gguf package: pure Python, so the host's pip
# installs it for the target (its dependencies are the root's Debian packages).
[ -d "$SITE/gguf" ] || "$PY" -m pip install -q --no-deps --target "$SITE" gguf
for pkg in "${@:-kt-core}"; do
  src="packages/$pkg"
  build=".aarch64/build/$pkg"
  module="${pkg//-/_}"
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$PWD/tools/aarch64/toolchain.cmake" \
    -DKT_AARCH64_ROOT="$ROOT" -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$PY" \
    -Dnanobind_DIR="$("$PY" -m nanobind --cmake_dir)" -DKT_AARCH64_SITE="$SITE" >/dev/null
  cmake --build "$build" -j"$(nproc)"
  rm -rf "${SITE:?}/$module" "$SITE/$module"-*.dist-info
  cp -r "$src/src/$module" "$SITE/$module"
  find "$SITE/$module" -name __pycache__ -prune -exec rm -rf {} +
  cmake --install "$build" --prefix "$SITE" >/dev/null
  "$PY" - "$src/pyproject.toml" "$SITE" <<'PYEOF'
import sys, tomllib
from pathlib import Path
meta = tomllib.loads(Path(sys.argv[1]).read_text())["project"]
info = Path(sys.argv[2]) / f"{meta['name'].replace('-', '_')}-{meta['version']}.dist-info"
info.mkdir()
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n")
groups = meta.get("entry-points", {})
(info / "entry_points.txt").write_text("".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
                                               for g, eps in groups.items()))
PYEOF
  echo "aarch64: $pkg installed in $SITE"
done
