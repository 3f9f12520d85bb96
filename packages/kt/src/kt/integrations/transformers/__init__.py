"""Run a Hugging Face transformers MoE model's routed experts on kt.

    from transformers import AutoModelForCausalLM
    from kt.integrations.transformers import patch_model

    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-30B-A3B")
    patch = patch_model(model, method="INT4", num_gpu_experts=8, placement="uniform")
    model.generate(...)                   # unchanged

A model too big to load whole: everything but its routed experts, which kt reads from the folder.

    model = load_model("deepseek-ai/DeepSeek-V3")      # the experts' bytes are never read into torch
    patch_model(model, method="FP8", weight_path="deepseek-ai/DeepSeek-V3")

Needs torch and transformers (pip install 'kt[transformers]').
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
    import transformers  # noqa: F401
except ImportError as exc:
    raise ImportError(f"kt.integrations.transformers needs torch and transformers ({exc}); "
                      "pip install 'kt[transformers]'") from exc

from .deferral import lowest_weight_picks
from .experts import KTExperts
from .loading import load_model
from .patch import KTPatch, patch_model, supported_model_types
from .placement import STRATEGIES, gpu_expert_masks
from .stats import ExpertStats, load_counts

__all__ = ["STRATEGIES", "ExpertStats", "KTExperts", "KTPatch", "gpu_expert_masks", "load_counts", "load_model",
           "lowest_weight_picks", "patch_model", "supported_model_types"]
