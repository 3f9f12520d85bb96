"""kt-backend-avx's descriptor: pure data; the native module is imported only when selected."""

import json
from pathlib import Path

from kt_core.backends import BackendDescriptor, Tier, Variant

from . import _build

_METHODS = ("BF16", "INT8", "INT4", "RAWINT4", "FP8", "FP8_PERCHANNEL", "LLAMAFILE", "MXFP4", "GPTQ_INT4", "NVFP4",
            "MXFP8")
# ggml block types the LLAMAFILE kernels read (native/kernels/ggml.cpp), the same on every target.
_GGML = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "IQ1_S", "IQ1_M",
         "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")
_MODULE = "kt_backend_avx._native"
# The one list of targets, which CMake compiles and the native module dispatches on; a build may
# hold only some of them (CMake's KT_AVX_TARGETS), and _build.py says which.
TARGETS = [t for t in json.loads((Path(__file__).parent / "targets.json").read_text())["targets"]
           if t["name"] in _build.TARGETS]

descriptor = BackendDescriptor(
    name="avx",
    abi_version=(1, 2),
    tier=Tier.GENERIC_SIMD,
    arch=("x86_64",),
    description="x86 expert kernels: AVX2, AVX-512, AVX-512 with VNNI/BF16",
    variants=tuple(Variant(x["name"], module=_MODULE, requires=frozenset(x["features"]), methods=_METHODS, rank=x["rank"],
                           ggml_types=_GGML) for x in TARGETS),
)


def kernel_sources_dir() -> str:
    """The installed x86 method kernels' sources (packers, activation quantizers, tiles), for a
    backend that compiles them into its own target (kt-backend-amx's CMake asks for this)."""
    return str(Path(__file__).parent / "kernels")
