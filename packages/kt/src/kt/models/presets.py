"""Known models as the MoE-relevant excerpt of their config.json: `kt bench --model NAME`
reads these through the same registry a real model folder goes through."""

from __future__ import annotations

from .spec import ModelSpec, spec_from_config

PRESET_CONFIGS: dict[str, dict] = {
    "qwen3-30b-a3b": {"model_type": "qwen3_moe", "hidden_size": 2048, "moe_intermediate_size": 768, "num_experts": 128,
                      "num_experts_per_tok": 8, "num_hidden_layers": 48, "decoder_sparse_step": 1},
    "qwen3-235b-a22b": {"model_type": "qwen3_moe", "hidden_size": 4096, "moe_intermediate_size": 1536,
                        "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 94, "decoder_sparse_step": 1},
    "deepseek-v3": {"model_type": "deepseek_v3", "hidden_size": 7168, "moe_intermediate_size": 2048,
                    "n_routed_experts": 256, "num_experts_per_tok": 8, "num_hidden_layers": 61,
                    "first_k_dense_replace": 3, "moe_layer_freq": 1},
    "kimi-k2": {"model_type": "kimi_k2", "hidden_size": 7168, "moe_intermediate_size": 2048, "n_routed_experts": 384,
                "num_experts_per_tok": 8, "num_hidden_layers": 61, "first_k_dense_replace": 1, "moe_layer_freq": 1},
    "glm-4.5": {"model_type": "glm4_moe", "hidden_size": 5120, "moe_intermediate_size": 1536, "n_routed_experts": 160,
                "num_experts_per_tok": 8, "num_hidden_layers": 92, "first_k_dense_replace": 3},
    "minimax-m2": {"model_type": "minimax_m2", "hidden_size": 3072, "intermediate_size": 1536, "num_local_experts": 256,
                   "num_experts_per_tok": 8, "num_hidden_layers": 62},
    "mixtral-8x7b": {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_local_experts": 8,
                     "num_experts_per_tok": 2, "num_hidden_layers": 32},
    "olmoe-1b-7b": {"model_type": "olmoe", "hidden_size": 2048, "intermediate_size": 1024, "num_experts": 64,
                    "num_experts_per_tok": 8, "num_hidden_layers": 16},
}


def preset(name: str) -> ModelSpec:
    return spec_from_config(PRESET_CONFIGS[name])
