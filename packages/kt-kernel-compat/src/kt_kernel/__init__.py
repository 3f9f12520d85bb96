"""kt_kernel, served by kt (the kt-kernel-compat distribution).

SGLang's kt integration imports `from kt_kernel import KTMoEWrapper, generate_gpu_experts_masks`
and calls `KTMoEWrapper.set_capture_batch_sizes` on the class; training code builds
`KTMoEWrapper(mode="sft")` or `AMXSFTMoEWrapper` directly and imports `kt_kernel.experts` /
`kt_kernel.experts_base`. These are kt-core's, which keep kt-kernel 0.7.2's names, arguments and
semantics (docs/serving.md and docs/training.md say where kt differs). kt-kernel's compiled
`kt_kernel_ext` (CPUInfer, the per-method C++ classes) is not provided.
"""

from __future__ import annotations

from importlib import metadata


def _refuse_beside_kt_kernel() -> None:
    try:
        real = metadata.distribution("kt-kernel")
    except metadata.PackageNotFoundError:
        return
    raise ImportError(f"kt-kernel {real.version} and kt-kernel-compat are both installed, and both provide the "
                      "module kt_kernel (whichever was installed last overwrote the other's files); uninstall one: "
                      "`pip uninstall kt-kernel` to serve with kt, or `pip uninstall kt-kernel-compat` for kt-kernel")


_refuse_beside_kt_kernel()

import kt_core as _kt_core  # noqa: E402
from kt_core import KTMoEWrapper, generate_gpu_experts_masks, select_deferred_experts  # noqa: E402
from kt_core.sft import SFTMoEWrapper as _SFTMoEWrapper  # noqa: E402


class AMXSFTMoEWrapper(_SFTMoEWrapper):
    """kt-kernel's SFT class built directly (`kt_kernel.AMXSFTMoEWrapper(...)`), with its argument
    order: kt-core's SFT wrapper — what `KTMoEWrapper(mode="sft")` returns — on whichever kt
    backend runs the method here, not only on AMX."""

    def __init__(self, layer_idx, num_experts, num_experts_per_tok, hidden_size, moe_intermediate_size, num_gpu_experts,
                 cpuinfer_threads, threadpool_count, weight_path, chunked_prefill_size, lora_rank=16, lora_alpha=32.0,
                 lora_dropout=0.0, max_cache_depth=1, method="AMXBF16_SFT", group_size=128, zero_point=True,
                 full_weight_grad=False, swiglu_limit=0.0):
        super().__init__(layer_idx, num_experts, num_experts_per_tok, hidden_size, moe_intermediate_size,
                         cpuinfer_threads=cpuinfer_threads, threadpool_count=threadpool_count, weight_path=weight_path,
                         chunked_prefill_size=chunked_prefill_size, method=method, num_gpu_experts=num_gpu_experts,
                         lora_rank=lora_rank, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
                         max_cache_depth=max_cache_depth, group_size=group_size, zero_point=zero_point,
                         full_weight_grad=full_weight_grad, swiglu_limit=swiglu_limit)

# kt-kernel's version this module stands in for, and kt's.
__version__ = f"0.7.2+kt{_kt_core.__version__}"
__kt_kernel_api__ = "0.7.2"

__all__ = ["AMXSFTMoEWrapper", "KTMoEWrapper", "generate_gpu_experts_masks", "select_deferred_experts"]
