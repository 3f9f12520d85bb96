"""kt_kernel.AMXSFTMoEWrapper (resolved on first use: it needs torch, `import kt_kernel` does not)."""

from kt_core.sft import SFTMoEWrapper


class AMXSFTMoEWrapper(SFTMoEWrapper):
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
