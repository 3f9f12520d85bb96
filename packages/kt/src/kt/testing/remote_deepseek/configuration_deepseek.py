"""The configuration of kt's tiny remote-code DeepSeek-V3 / Kimi-K2 style model (see __init__.py)."""

from transformers import PretrainedConfig


class DeepseekV3Config(PretrainedConfig):
    model_type = "kimi_k2"

    def __init__(self, vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                 num_hidden_layers=3, num_attention_heads=4, n_shared_experts=1, n_routed_experts=8,
                 num_experts_per_tok=2, routed_scaling_factor=2.5, topk_method="noaux_tc", n_group=2, topk_group=1,
                 scoring_func="sigmoid", norm_topk_prob=True, first_k_dense_replace=1, moe_layer_freq=1,
                 hidden_act="silu", rms_norm_eps=1e-6, initializer_range=0.05, aux_loss_alpha=0.0, **kwargs):
        self.vocab_size, self.hidden_size, self.intermediate_size = vocab_size, hidden_size, intermediate_size
        self.moe_intermediate_size, self.num_hidden_layers = moe_intermediate_size, num_hidden_layers
        self.num_attention_heads, self.n_shared_experts, self.n_routed_experts = (num_attention_heads,
                                                                                  n_shared_experts, n_routed_experts)
        self.num_experts_per_tok, self.routed_scaling_factor = num_experts_per_tok, routed_scaling_factor
        self.topk_method, self.n_group, self.topk_group = topk_method, n_group, topk_group
        self.scoring_func, self.norm_topk_prob = scoring_func, norm_topk_prob
        self.first_k_dense_replace, self.moe_layer_freq = first_k_dense_replace, moe_layer_freq
        self.hidden_act, self.rms_norm_eps, self.initializer_range = hidden_act, rms_norm_eps, initializer_range
        self.aux_loss_alpha = aux_loss_alpha
        super().__init__(**kwargs)
