"""kt_kernel.experts_base: kt-kernel 0.7.2's home of generate_gpu_experts_masks (kt-core's)."""

from kt_core import generate_gpu_experts_masks

__all__ = ["generate_gpu_experts_masks"]
