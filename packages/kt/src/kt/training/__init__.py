"""Training through kt: LoRA fine-tuning of MoE models with the routed experts on the CPU.

`LoRAExperts` is one layer's routed experts (frozen, packed by kt) with trainable per-expert
LoRA; `kt.training.routed_experts` is its autograd node, one over kt_core.training_step's explicit
forward and backward;
`patch_model(model, mode="train")` (kt.integrations.transformers) puts them into a transformers
model (model_patch.py), and peft_format.py reads and writes their adapters as PEFT does.
"""

from kt_core.rows import Routing

from .lora_experts import LoRAExperts, lora_targets
from .model_patch import KTTrainPatch
from .peft_format import adapter_state_dict, load_adapter, save_adapter

__all__ = ["KTTrainPatch", "LoRAExperts", "Routing", "adapter_state_dict", "load_adapter",
           "lora_targets", "save_adapter"]
