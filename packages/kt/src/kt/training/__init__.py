"""Training through kt: LoRA fine-tuning of MoE models with the routed experts on the CPU.

`LoRAExperts` is one layer's routed experts (frozen, packed by kt) with trainable per-expert
LoRA; `kt.training.grouped` holds the autograd nodes over kt's kernels it is built from;
`patch_model(model, mode="train")` (kt.integrations.transformers) puts them into a transformers
model (model_patch.py), and peft_format.py reads and writes their adapters as PEFT does.
"""

from .grouped import BaseDown, BaseGateUp, Routing
from .lora_experts import LoRAExperts, lora_targets
from .model_patch import KTTrainPatch
from .peft_format import adapter_state_dict, load_adapter, save_adapter

__all__ = ["BaseDown", "BaseGateUp", "KTTrainPatch", "LoRAExperts", "Routing", "adapter_state_dict", "load_adapter",
           "lora_targets", "save_adapter"]
