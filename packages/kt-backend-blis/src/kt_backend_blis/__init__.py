"""kt-backend-blis's descriptor: pure data; the native module is imported only when selected.

BLIS serves long prefill (many rows per expert) on kt-backend-avx's packed weights: it packs
nothing itself (plugin ABI 1.3), so kt-core packs with kt-backend-avx and gives avx every batch
BLIS declines. Where BLIS takes over is measured on the host (`python -m kt_backend_blis.calibrate`,
kept in crossover.py's file); until it is, or where BLIS never won, the backend is not used.
"""

import ctypes
import json
from pathlib import Path

from kt_core.backends import BackendDescriptor, Tier, Variant

from . import _build, crossover

METHODS = ("BF16", "INT8", "INT4", "RAWINT4", "FP8", "FP8_PERCHANNEL", "MXFP4", "GPTQ_INT4")
TARGETS = json.loads((Path(__file__).parent / "targets.json").read_text())["targets"]


def _probe() -> str | None:
    try:
        ctypes.CDLL(_build.BLIS_SONAME)
    except OSError as exc:
        return (f"needs the BLIS shared library {_build.BLIS_SONAME}, which does not load ({exc}); kt-backend-blis was "
                f"built against {_build.BLIS_LIBRARY}: install that BLIS (Debian: libblis4) or rebuild against yours "
                f"(BLIS_ROOT)")
    return crossover.unusable_reason()


descriptor = BackendDescriptor(
    name="blis",
    abi_version=(1, 3),
    tier=Tier.VENDOR_LIBRARY,
    arch=("x86_64",),
    description=f"BLIS sgemm for long prefill on kt-backend-avx's packed weights ({_build.BLIS_SONAME})",
    variants=tuple(Variant(t["name"], module="kt_backend_blis._entry", requires=frozenset(t["features"]),
                           methods=METHODS, rank=t["rank"]) for t in TARGETS),
    probe=_probe,
)
