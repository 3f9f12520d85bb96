"""The reference backend's descriptor: pure data, no native import (kt_core.backends.reference._native
is imported only when selected)."""

from ...formats.ggml import GGML_TYPES
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
                      ggml_types=tuple(GGML_TYPES)),),   # the oracle reads every ggml type kt knows
)
