"""kt-backend-kml's descriptor: pure data; the native module is imported only when selected,
and only on aarch64 (elsewhere the wheel has no native module and the descriptor's arch says why)."""

import json
from pathlib import Path

from kt_core.backends import BackendDescriptor, Tier, Variant

METHODS = ("BF16", "INT8", "INT4", "RAWINT4", "FP8", "FP8_PERCHANNEL", "MXFP8", "LLAMAFILE")
# kt/formats/ggml_panels.h's types: kt-ggml-v8, the layout kt-backend-avx packs too.
GGML_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS",
              "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")
TARGETS = json.loads((Path(__file__).parent / "targets.json").read_text())["targets"]

descriptor = BackendDescriptor(
    name="kml",
    abi_version=(1, 2),
    tier=Tier.GENERIC_SIMD,
    arch=("aarch64",),
    description="aarch64 expert kernels: NEON, dot product, I8MM, BF16, SVE",
    variants=tuple(Variant(t["name"], module="kt_backend_kml._native", requires=frozenset(t["features"]),
                           methods=METHODS, rank=t["rank"], ggml_types=GGML_TYPES) for t in TARGETS),
)
