"""The reference backend's descriptor: pure data, no native import (kt_core.backends.reference._native
is imported only when selected)."""

from ..descriptor import BackendDescriptor, Tier, Variant

descriptor = BackendDescriptor(
    name="reference",
    abi_version=(1, 2),
    tier=Tier.REFERENCE,
    arch=("x86_64", "aarch64"),
    description="portable C++ at the baseline ISA; the correctness oracle every backend is tested against",
    variants=(Variant("baseline", module="kt_core.backends.reference._native",
                      methods=("BF16", "FP32", "INT8", "INT4", "RAWINT4", "FP8", "FP8_PERCHANNEL", "LLAMAFILE", "MXFP4",
                               "GPTQ_INT4", "MXFP8", "NVFP4"),
                      ggml_types=("Q4_0", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ2_XXS", "IQ3_XXS")),),
)
