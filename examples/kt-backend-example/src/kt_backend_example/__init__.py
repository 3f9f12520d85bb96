"""The example backend's descriptor: pure data, so kt-core can rank it without importing
kt_backend_example._native (that happens only if this backend is selected)."""

from kt_core.backends import BackendDescriptor, Tier, Variant

descriptor = BackendDescriptor(
    name="example",
    abi_version=(1, 0),
    tier=Tier.REFERENCE,
    arch=("x86_64", "aarch64"),
    description="third-party example: BF16 through the tile kernels, FP32 through a whole-op moe_forward",
    variants=(Variant("portable", module="kt_backend_example._native", methods=("FP32", "BF16")),),
)
