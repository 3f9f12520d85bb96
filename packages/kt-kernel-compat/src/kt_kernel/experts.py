"""kt_kernel.experts: where kt-kernel 0.7.2 defines KTMoEWrapper (`from kt_kernel.experts import
KTMoEWrapper`, as LLaMA-Factory's KTransformers integration imports it) — kt-core's, the same
class as `kt_kernel.KTMoEWrapper`."""

from kt_core import KTMoEWrapper

__all__ = ["KTMoEWrapper"]
