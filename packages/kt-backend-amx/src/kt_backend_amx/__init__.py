"""kt-backend-amx's descriptor: pure data; the native module is imported only when selected.

One build holds one variant: `sapphire-rapids` (the AMX instructions; runnable where CPUID
reports amx_tile/amx_int8/amx_bf16, XCR0 enables tile state and Linux granted the
ARCH_REQ_XCOMP_PERM request — kt-core's host detection checks all three and reports AMX
features only then), or `amx-emulated`, the same kernels on software tiles, built with
KT_AMX_EMULATE=1 for tests and usable only when KT_AMX_EMULATE=1 is set at run time too.
"""

import json
import os
from pathlib import Path

from kt_core.backends import BackendDescriptor, Tier, Variant

from ._build import EMULATED, VARIANT

# This build's target, as targets.json (which CMake compiled it from) declares it.
_TARGET = next(t for t in json.loads((Path(__file__).parent / "targets.json").read_text())["targets"]
               if t["name"] == VARIANT)
_METHODS = ("BF16", "INT8", "INT4", "RAWINT4", "FP8", "FP8_PERCHANNEL", "GPTQ_INT4", "MXFP4")


def _probe() -> str | None:
    if EMULATED and os.environ.get("KT_AMX_EMULATE") != "1":
        return ("needs KT_AMX_EMULATE=1 at run time: this kt-backend-amx is the software tile emulation build (built "
                "with KT_AMX_EMULATE=1), for tests only; rebuild without it for AMX hardware")
    return None


descriptor = BackendDescriptor(
    name="amx",
    abi_version=(1, 2),
    tier=Tier.MATRIX_ENGINE,
    arch=("x86_64",),
    description="Intel AMX tile kernels for prefill" + (" (software tile emulation build)" if EMULATED else ""),
    variants=(Variant(VARIANT, module="kt_backend_amx._native",
                      requires=frozenset(_TARGET["features"]), methods=_METHODS, rank=_TARGET["rank"]),),
    probe=_probe,
)
