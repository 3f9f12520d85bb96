"""Training through kt: LoRA fine-tuning of MoE models with the routed experts on the CPU.

`LoRAExperts` is one layer's routed experts (frozen, packed by kt) with trainable per-expert
LoRA; `kt.training.grouped` holds the autograd nodes over kt's kernels it is built from.
"""

from .grouped import BaseDown, BaseGateUp, Routing
from .lora_experts import LoRAExperts, lora_targets

__all__ = ["BaseDown", "BaseGateUp", "LoRAExperts", "Routing", "lora_targets"]
