"""kt.integrations.transformers: tiny random transformers MoE models, patched, against plain torch.

The models are built here from seeded configs (hidden 64, 8 experts, top-2, vocab 128) with
initializer_range 0.3, so greedy generation wanders over many tokens instead of repeating one.
Expert weights are rounded to bf16 first: kt's BF16 then computes with exactly the model's
weights, and its greedy tokens must equal torch's.
"""

import json
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the transformers integration needs torch")
transformers = pytest.importorskip("transformers", reason="the transformers integration needs transformers")

from kt.integrations.transformers import (  # noqa: E402
    KTExperts,
    gpu_expert_masks,
    lowest_weight_picks,
    patch_model,
    supported_model_types,
)
from kt_core import KTError  # noqa: E402
from kt_core.testing.quantize import dequantized_weights  # noqa: E402

from conftest import run_python  # noqa: E402

COMMON = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=128, max_position_embeddings=256,
              initializer_range=0.3, pad_token_id=0, bos_token_id=1, eos_token_id=2)
MLA = dict(kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16)
def _auto(model_type, overrides, **settings):
    """A tiny config of `model_type` on COMMON's sizes, top-2 unless said; `overrides` (a test's) last."""
    return transformers.AutoConfig.for_model(model_type, **{**COMMON, "num_experts_per_tok": 2, **settings, **overrides})


# DeepSeek and GLM get a dense first layer, group-limited routing and a routed_scaling_factor:
# the block's own router computes those, kt only sees its ids and weights.
CONFIGS = {
    "qwen2_moe": lambda **kw: transformers.Qwen2MoeConfig(
        **COMMON, num_hidden_layers=2, intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, **kw),
    "qwen3_moe": lambda **kw: transformers.Qwen3MoeConfig(
        **{"num_hidden_layers": 2, "num_experts_per_tok": 2, **kw}, **COMMON, head_dim=16, intermediate_size=128,
        moe_intermediate_size=32, num_experts=8, norm_topk_prob=True),
    "mixtral": lambda **kw: transformers.MixtralConfig(
        **COMMON, num_hidden_layers=2, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, **kw),
    "olmoe": lambda **kw: transformers.OlmoeConfig(
        **COMMON, num_hidden_layers=2, intermediate_size=32, num_experts=8, num_experts_per_tok=2, **kw),
    "deepseek_v2": lambda **kw: transformers.DeepseekV2Config(
        **COMMON, **MLA, num_hidden_layers=3, intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8,
        num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, topk_method="group_limited_greedy", n_group=2,
        topk_group=1, routed_scaling_factor=1.5, **kw),
    "deepseek_v3": lambda **kw: transformers.DeepseekV3Config(
        **COMMON, **MLA, num_hidden_layers=3, intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8,
        num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
        norm_topk_prob=True, **kw),
    "deepseek_v32": lambda **kw: transformers.DeepseekV32Config(   # DeepSeek-V3.2: the sparse-attention indexer
        **{**COMMON, "num_key_value_heads": 4}, **{**MLA, "q_lora_rank": 32}, num_hidden_layers=3, intermediate_size=128,
        moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
        n_group=2, topk_group=1, routed_scaling_factor=2.5, index_topk=64, **kw),
    "glm4_moe_lite": lambda **kw: transformers.Glm4MoeLiteConfig(   # GLM-4.7-Flash: MLA, mlp_layer_types
        **COMMON, **MLA, num_hidden_layers=3, intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8,
        num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1, routed_scaling_factor=2.5, **kw),
    "glm_moe_dsa": lambda **kw: transformers.GlmMoeDsaConfig(   # GLM-5
        **{**COMMON, "num_key_value_heads": 4}, **{**MLA, "q_lora_rank": 32}, num_hidden_layers=3, intermediate_size=128,
        moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
        n_group=2, topk_group=1, routed_scaling_factor=2.5, index_topk=64, **kw),
    "minimax_m2": lambda **kw: transformers.MiniMaxM2Config(
        **COMMON, head_dim=16, num_hidden_layers=2, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, **kw),
    # MiniMax-Text-01: lightning-attention layers; at COMMON's weight scale (0.3) this random model
    # turned INT4's error into 0.56 rel RMS of the logits (the others' tolerance 0.45), so 0.2
    "minimax": lambda **kw: transformers.MiniMaxConfig(
        **{**COMMON, "initializer_range": 0.2}, head_dim=16, num_hidden_layers=2, intermediate_size=32,
        num_local_experts=8, num_experts_per_tok=2, **kw),
    "qwen3_next": lambda **kw: transformers.Qwen3NextConfig(   # Qwen3-Next: gated DeltaNet layers, a gated shared expert
        **COMMON, head_dim=16, num_hidden_layers=4, intermediate_size=128, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2, **kw),
    "dots1": lambda **kw: transformers.Dots1Config(
        **COMMON, head_dim=16, num_hidden_layers=3, intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8,
        num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
        norm_topk_prob=True, **kw),
    "ernie4_5_moe": lambda **kw: transformers.Ernie4_5_MoeConfig(
        **COMMON, head_dim=16, num_hidden_layers=3, intermediate_size=128, moe_intermediate_size=32, moe_num_experts=8,
        moe_k=2, moe_num_shared_experts=1, **kw),
    "hunyuan_v1_moe": lambda **kw: transformers.HunYuanMoEV1Config(   # HunYuan-A13B: top-k given per layer
        **COMMON, head_dim=16, num_hidden_layers=2, intermediate_size=32, num_experts=8, moe_topk=[2, 2], **kw),
    # Llama 4 (top-1, the score scaling the experts' input): MoE on every other layer, as Maverick.
    "llama4_text": lambda **kw: transformers.Llama4TextConfig(
        **COMMON, head_dim=16, num_hidden_layers=2, intermediate_size=32, intermediate_size_mlp=128,
        num_local_experts=8, **{"num_experts_per_tok": 1, **kw}, interleave_moe_layer_step=2),
    # DeepSeek-V4: hash-routed first layers (tid2eid), the clamped SiLU (a limit the tiny model reaches).
    "deepseek_v4": lambda **kw: transformers.DeepseekV4Config(
        **{**COMMON, "num_key_value_heads": 1}, head_dim=16, qk_rope_head_dim=8, q_lora_rank=32, o_lora_rank=32,
        o_groups=2, index_n_heads=2, index_head_dim=16, index_topk=16, sliding_window=16, num_hidden_layers=4,
        moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, swiglu_limit=1.0, **kw),
    # transformers 5's newer standard-layout families (one dense layer first where they have one).
    "mimo_v2_flash": lambda **kw: transformers.AutoConfig.for_model(
        "mimo_v2_flash", **COMMON, head_dim=16, v_head_dim=16, num_hidden_layers=2, intermediate_size=128,
        moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, sliding_window=8, **kw),
    "solar_open": lambda **kw: transformers.AutoConfig.for_model(
        "solar_open", **COMMON, head_dim=16, num_hidden_layers=2, intermediate_size=128, moe_intermediate_size=32,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, **kw),
    "minicpm5_moe": lambda **kw: transformers.AutoConfig.for_model(
        "minicpm5_moe", **COMMON, head_dim=16, num_hidden_layers=2, intermediate_size=128, moe_intermediate_size=32,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, **kw),
    "exaone_moe": lambda **kw: transformers.AutoConfig.for_model(
        "exaone_moe", **COMMON, head_dim=16, num_hidden_layers=2, intermediate_size=128, moe_intermediate_size=32,
        num_experts=8, num_shared_experts=1, num_experts_per_tok=2, sliding_window=8, **kw),
    "hy_v3": lambda **kw: transformers.AutoConfig.for_model(
        "hy_v3", **COMMON, head_dim=16, num_hidden_layers=2, intermediate_size=128, moe_intermediate_size=32,
        num_experts=8, num_shared_experts=1, num_experts_per_tok=2, **kw),
    "hy_v4": lambda **kw: transformers.AutoConfig.for_model(   # DeepSeek-V4's clamped SiLU, at a limit it reaches
        "hy_v4", **{k: v for k, v in COMMON.items() if k != "num_key_value_heads"}, num_hidden_layers=2, intermediate_size=128,
        moe_intermediate_size=32, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, q_lora_rank=32,
        kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, index_topk=4, index_head_dim=16,
        index_n_heads=2, hc_mult=2, swiglu_limit=1.0, **kw),
    "afmoe": lambda **kw: transformers.AutoConfig.for_model(
        "afmoe", **COMMON, head_dim=16, num_hidden_layers=2, intermediate_size=128, moe_intermediate_size=32,
        num_dense_layers=1, num_experts=8, num_shared_experts=1, num_experts_per_tok=2, sliding_window=8,
        global_attn_every_n_layers=2, **kw),
    "laguna": lambda **kw: transformers.AutoConfig.for_model(
        "laguna", **COMMON, head_dim=16, num_hidden_layers=2, intermediate_size=128, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_experts=8, num_experts_per_tok=2, sliding_window=8, **kw),
    "cohere2_moe": lambda **kw: transformers.AutoConfig.for_model(
        "cohere2_moe", **COMMON, head_dim=16, num_hidden_layers=2, intermediate_size=32, num_experts=8,
        num_shared_experts=1, num_experts_per_tok=2, prefix_dense_intermediate_size=128, first_k_dense_replace=1,
        sliding_window=8, **kw),
    "kimi_linear": lambda **kw: transformers.AutoConfig.for_model(   # KDA linear attention + MLA layers
        "kimi_linear", **{**COMMON, "num_key_value_heads": 4}, head_dim=16, num_hidden_layers=4, intermediate_size=128,
        moe_intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, linear_head_dim=16, linear_num_heads=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"], **kw),
    # Qwen4 (experimental): gated DeltaNet, indexed attention and hyper-connections around an MoE on every layer.
    "qwen4_exp": lambda **kw: transformers.AutoConfig.for_model("qwen4_exp", text_config=dict(
        COMMON, head_dim=16, num_hidden_layers=4, intermediate_size=128, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_experts=8, num_experts_per_tok=2, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, hc_count=2, hc_lowrank=8,
        indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8, indexer_compress_ratio=4, **kw),
        vision_config=dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64)),
    # LongCat-Flash: zero-computation (identity) experts among the router's choices.
    "longcat_flash": lambda **kw: transformers.AutoConfig.for_model(
        "longcat_flash", **{**COMMON, "num_key_value_heads": 4}, ffn_hidden_size=128, expert_ffn_hidden_size=32,
        num_layers=2, n_routed_experts=8, zero_expert_num=4, moe_topk=2, kv_lora_rank=16, q_lora_rank=32,
        qk_rope_head_dim=8, qk_nope_head_dim=16, head_dim=8, v_head_dim=16, **kw),
    # Ling-2.5's hybrid: the limit after SiLU, per layer (1.0 on the MoE layer: the tiny model reaches it).
    "bailing_hybrid": lambda **kw: transformers.AutoConfig.for_model(
        "bailing_hybrid", **{**COMMON, "num_key_value_heads": 4}, head_dim=16, num_hidden_layers=2, intermediate_size=128,
        moe_intermediate_size=32, num_experts=8, num_experts_per_token=2, num_shared_experts=1, n_group=2,
        topk_group=1, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, layer_group_size=2,
        first_k_dense_replace=1, share_expert_swiglu_limit_list=[0, 1.0], **{"expert_swiglu_limit_list": [0, 1.0], **kw}),
    # Gemma 4: GELU-tanh experts beside each layer's dense MLP (smaller weights: at 0.3 its greedy
    # tokens repeat one token).
    "gemma4_text": lambda **kw: transformers.AutoConfig.for_model(
        "gemma4_text", **{**COMMON, "initializer_range": 0.05}, head_dim=16, num_hidden_layers=2, intermediate_size=128,
        enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=32, hidden_size_per_layer_input=0,
        layer_types=["sliding_attention", "full_attention"], **kw),
    # Families surveyed in session 33 (transformers 5.25's standard experts module; the hybrids build their
    # Mamba-2 / short-conv / gated-DeltaNet mixers on torch's reference paths).
    "phimoe": lambda **kw: _auto("phimoe", kw, num_hidden_layers=2, intermediate_size=32, num_local_experts=8),
    "flex_olmo": lambda **kw: _auto("flex_olmo", kw, num_hidden_layers=3, intermediate_size=32, num_experts=8),
    "granitemoe": lambda **kw: _auto("granitemoe", kw, num_hidden_layers=2, intermediate_size=32, num_local_experts=8),
    "granitemoeshared": lambda **kw: _auto("granitemoeshared", kw, num_hidden_layers=2, intermediate_size=32,
                                           num_local_experts=8, shared_intermediate_size=32),
    "granitemoehybrid": lambda **kw: _auto(
        "granitemoehybrid", kw, num_hidden_layers=2, intermediate_size=32, num_local_experts=8, shared_intermediate_size=32,
        layer_types=["mamba", "attention"], mamba_n_heads=4, mamba_d_head=32, mamba_d_state=16,
        mamba_n_groups=1, mamba_chunk_size=8),
    "granitemoe_swa": lambda **kw: _auto("granitemoe_swa", kw, num_hidden_layers=2, intermediate_size=32, num_local_experts=8,
                                         sliding_window=4),
    "jamba": lambda **kw: _auto("jamba", kw, num_hidden_layers=4, intermediate_size=32, num_experts=8, expert_layer_period=2,
                                expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=0, mamba_d_state=8,
                                mamba_expand=2),
    "lfm2_moe": lambda **kw: _auto("lfm2_moe", kw, num_hidden_layers=3, intermediate_size=32, moe_intermediate_size=32,
                                   num_experts=8, num_dense_layers=1, layer_types=["conv", "full_attention", "conv"]),
    "mellum": lambda **kw: _auto("mellum", kw, num_hidden_layers=3, intermediate_size=32, moe_intermediate_size=32,
                                 num_experts=8, head_dim=16, mlp_layer_types=["dense", "sparse", "sparse"], sliding_window=4),
    "flint": lambda **kw: _auto("flint", kw, num_hidden_layers=3, intermediate_size=32, moe_intermediate_size=32,
                                shared_expert_intermediate_size=32, num_experts=8, head_dim=16, mlp_only_layers=[0],
                                sliding_window=4),
    "beam": lambda **kw: _auto("beam", kw, num_hidden_layers=3, intermediate_size=32, moe_intermediate_size=32, num_experts=8,
                               head_dim=16, mlp_layer_types=["dense", "sparse", "sparse"], n_group=2, topk_group=1,
                               sliding_window=4),
    "kolibri1": lambda **kw: _auto("kolibri1", kw, num_hidden_layers=3, moe_intermediate_size=32,
                                   shared_expert_intermediate_size=32, num_experts=8, head_dim=16, sliding_window=4),
    "inkling_text": lambda **kw: _auto(
        "inkling_text", kw, num_hidden_layers=2, intermediate_size=32, moe_intermediate_size=32, n_routed_experts=8,
        n_shared_experts=1, head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=16,
        sliding_window_size=4, rel_extent=16, d_rel=4, mlp_layer_types=["dense", "sparse"]),
    "dots3_note_text": lambda **kw: _auto(
        "dots3_note_text", kw, num_key_value_heads=4, num_hidden_layers=3, intermediate_size=32, moe_intermediate_size=32,
        shared_experts_intermediate_size=32, n_routed_experts=8, n_shared_experts=1, kv_lora_rank=16, q_lora_rank=32,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, head_dim=16, index_topk=4, index_head_dim=16,
        index_n_heads=2, mlp_layer_types=["dense", "sparse", "sparse"]),
    "aria_text": lambda **kw: _auto("aria_text", kw, num_hidden_layers=3, intermediate_size=32, moe_num_experts=8, moe_topk=2,
                                    moe_num_shared_experts=1),
    "zaya": lambda **kw: _auto("zaya", kw, num_hidden_layers=3, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=1,
                               head_dim=16, router_hidden_size=16),
    "lara_mini": lambda **kw: _auto(
        "lara_mini", kw, num_hidden_layers=4, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=8,
        head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        sliding_window=4),
    "glm4_moe": lambda **kw: transformers.Glm4MoeConfig(
        **COMMON, num_hidden_layers=3, head_dim=16, intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8,
        num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
        norm_topk_prob=True, **kw),
}
NEW_TOKENS = 32
GREEDY = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)


def experts_modules(model):   # fused experts (not dense MLPs whose projections are Linear modules named so)
    return [m for m in model.modules() if isinstance(getattr(m, "gate_up_proj", None), torch.Tensor)
            and isinstance(getattr(m, "down_proj", None), torch.Tensor)]


def tiny_model(model_type="qwen3_moe", seed=0, **config):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[model_type](**config)).eval()
    with torch.no_grad():
        for m in experts_modules(model):
            for p in (m.gate_up_proj, m.down_proj):
                p.copy_(p.bfloat16().float())
        for m in model.modules():   # DeepSeek-V3 / GLM: make the router's correction bias matter
            if hasattr(m, "e_score_correction_bias"):
                m.e_score_correction_bias.normal_(0, 0.1)
            if hasattr(m, "tid2eid"):   # DeepSeek-V4's hash routing: each token its own experts
                m.tid2eid.copy_(torch.stack([torch.randperm(m.num_experts)[:m.top_k] for _ in m.tid2eid]))
    return model


def copy_of(model):
    twin = transformers.AutoModelForCausalLM.from_config(model.config).eval()
    twin.load_state_dict(model.state_dict())
    return twin


def prompt(seed=0, batch=2, length=8):
    return torch.randint(3, 128, (batch, length), generator=torch.Generator().manual_seed(seed))


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def rel_max(actual, expected):
    return ((actual - expected).abs().max() / expected.abs().max()).item()


def rel_rms(actual, expected):
    return ((actual - expected).norm() / expected.norm()).item()


# -- every family ---------------------------------------------------------------------------

@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_bf16_generates_the_same_greedy_tokens_as_torch(model_type):
    model = tiny_model(model_type)
    ids = prompt()
    expected = model.generate(ids, **GREEDY)
    # ZAYA1's tiny model greedily repeats one token at every weight scale tried (0.02-0.3), though its
    # logits vary by position (std 2.0) and its experts move them by 0.92: its logits are checked below.
    if model_type != "zaya":
        assert len(set(expected[0, ids.shape[1]:].tolist())) >= 8, "the fixture model should not just repeat a token"
    expected_logits = logits(model, expected)
    n_moe = len(experts_modules(model))

    patch = patch_model(model, method="BF16")
    assert len(patch.layers) == n_moe and all(isinstance(m, KTExperts) for m in patch.layers.values())
    assert experts_modules(model) == []                      # torch's expert modules are gone from the model
    assert patch.freed_bytes == n_moe * 8 * 3 * 64 * 32 * 4    # experts x (gate, up, down) x H x I x f32

    got = model.generate(ids, **GREEDY)                      # batch of 2, KV cache
    assert torch.equal(got, expected)
    # measured <= 1.3e-5 over the families (kt keeps f32 activations; only the sum order differs);
    # Qwen4's indexed attention and hyper-connections amplify it to 1.3e-4
    assert rel_max(logits(model, expected), expected_logits) < (3e-4 if model_type == "qwen4_exp" else 1e-4)


@pytest.mark.parametrize("method", ["INT8", "INT4"])
@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_quantized_logits(model_type, method):
    """Against torch running the weights the format stores (dequantized by kt_core.testing):
    measured rel max error <= 4.3e-4 (activation quantization, two int8 passes), tolerance 2e-3.
    Against the float model it is the format's own error: measured rel RMS <= 0.048 (INT8) and <= 0.38
    (INT4, group 32, a random model with weights of std 0.3), tolerances 0.05 and 0.45 (below: two
    models more sensitive to their weights)."""
    group = 32 if method == "INT4" else 0
    model = tiny_model(model_type)
    ids = prompt(length=16)
    float_logits = logits(model, ids)
    stored = copy_of(model)
    with torch.no_grad():
        for m in experts_modules(stored):
            # [E, 2I, H] and [E, H, I]; Llama 4 stores them input first, [E, H, 2I] and [E, I, H]
            flip = (lambda w: w.transpose(1, 2)) if model_type in ("llama4_text", "aria_text") else (lambda w: w)
            gate_up, down = flip(m.gate_up_proj), flip(m.down_proj)
            i = down.shape[2]
            g, u, d = (torch.from_numpy(np.asarray(x)).float() for x in dequantized_weights(
                method, gate_up[:, :i].contiguous().numpy(), gate_up[:, i:].contiguous().numpy(),
                down.contiguous().numpy(), group_size=group))
            m.gate_up_proj.copy_(flip(torch.cat([g, u], dim=1)))
            m.down_proj.copy_(flip(d))
    stored_logits = logits(stored, ids)
    patch_model(model, method=method, group_size=group)
    got = logits(model, ids)
    assert rel_max(got, stored_logits) < 2e-3
    # Kimi-Linear's KDA layers and Qwen4's hyper-connections amplify the weights' rounding (torch on the
    # same stored weights is as far): measured 0.137 / 0.081 at INT8, 0.30 / 0.48 at INT4.
    # Granite's and Phi-MoE's (multipliers, sparsemixer routing) less so: INT8 0.058 / 0.067 (SWA) / 0.059,
    # torch on the stored weights 0.058 for Granite.
    sensitive = model_type in ("kimi_linear", "qwen4_exp")
    int8 = 0.2 if sensitive else 0.08 if model_type in ("granitemoe", "granitemoe_swa", "phimoe") else 0.05
    assert rel_rms(got, float_logits) < {"INT8": int8, "INT4": 0.6 if sensitive else 0.45}[method]


def test_llama4_with_two_experts_per_token():
    """Llama 4 scales each expert's input by its score: with top-2 kt runs one call per routing slot."""
    model = tiny_model("llama4_text", num_experts_per_tok=2)
    ids = prompt()
    want = logits(model, ids)
    patch_model(model, method="BF16")
    assert rel_max(logits(model, ids), want) < 1e-4


def test_mistral4_whose_causal_class_only_image_text_to_text_finds(tmp_path):
    """Mistral 4: Mistral4ForCausalLM is registered with AutoModelForImageTextToText, not
    AutoModelForCausalLM; patched, its logits are torch's, and load_model + weight_path of a saved
    folder (the experts fused) gives the whole model's."""
    from kt.integrations.transformers import load_model

    config = transformers.AutoConfig.for_model(
        "mistral4", **{**COMMON, "num_key_value_heads": 4}, num_hidden_layers=2, intermediate_size=128,
        moe_intermediate_size=32, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, kv_lora_rank=16,
        q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, first_k_dense_replace=1)
    torch.manual_seed(0)
    model = transformers.Mistral4ForCausalLM(config).eval()
    with torch.no_grad():
        for m in experts_modules(model):
            for p in (m.gate_up_proj, m.down_proj):
                p.copy_(p.bfloat16().float())
    ids = prompt()
    want = logits(model, ids)
    model.save_pretrained(tmp_path)
    assert len(patch_model(model, method="BF16").layers) == 1
    assert rel_max(logits(model, ids), want) < 1e-4
    lean = load_model(tmp_path, dtype=torch.float32)
    assert type(lean).__name__ == "Mistral4ForCausalLM"
    patch_model(lean, method="BF16", weight_path=tmp_path)
    assert torch.equal(logits(lean.eval(), ids), logits(model, ids))


def test_limit_after_silu_binds_and_matches_torch():
    """Ling-2.5's experts clamp SiLU(gate) (not gate) at each layer's limit: the tiny model's limit changes
    its logits, and kt's (kt-core applying the limit to the kernels' raw products) are torch's."""
    model, unclamped = tiny_model("bailing_hybrid"), tiny_model("bailing_hybrid", expert_swiglu_limit_list=[0, 0])
    ids = prompt()
    want = logits(model, ids)
    assert rel_max(logits(unclamped, ids), want) > 1e-2
    patch = patch_model(model, method="BF16")
    assert [m.moe.swiglu for m in patch.layers.values()] == [(1.0, 0.0, True, "silu")]
    assert rel_max(logits(model, ids), want) < 1e-4


def test_gelu_tanh_experts_are_computed_as_gemma4s():
    """Gemma 4's experts gate through GELU-tanh (kt-core's epilogue on the raw gate/up products):
    kt's logits are torch's, and torch's with SiLU experts are far from them."""
    model, silu = tiny_model("gemma4_text"), tiny_model("gemma4_text")
    for m in experts_modules(silu):
        m.act_fn = torch.nn.SiLU()
    ids = prompt(length=16)
    expected = logits(model, ids)
    assert rel_max(logits(silu, ids), expected) > 0.1   # measured 0.42
    patch = patch_model(model, method="BF16")
    assert {m.moe.gate_activation for m in patch.layers.values()} == {"gelu_tanh"}
    assert rel_max(logits(model, ids), expected) < 1e-4   # measured 1.1e-5


def test_picks_of_weight_zero_are_not_computed():
    """An expert picked with weight 0 (LongCat-Flash's zero-computation experts arrive so) is skipped,
    not computed and multiplied by 0: expert 3's weights overflow any product (1e30), and the output
    stays finite."""
    model = tiny_model()
    block = next(m for m in model.modules() if type(m).__name__ == "Qwen3MoeSparseMoeBlock")
    with torch.no_grad():
        block.experts.gate_up_proj[3] = 1e30
    patch_model(model, method="BF16")
    x = torch.randn(5, 64)
    ids = torch.tensor([[3, 1], [0, 3], [2, 4], [3, 5], [6, 7]])
    weights = torch.tensor([[0.0, 0.5], [0.7, 0.0], [0.4, 0.6], [0.0, 1.0], [0.3, 0.3]])
    out = block.experts(x, ids, weights)
    assert torch.isfinite(out).all()
    assert torch.allclose(out, block.experts(x, ids.masked_fill(weights == 0, -1), weights))


def test_sampled_generate_matches_torch_under_the_same_seed():
    model = tiny_model()
    ids = prompt()
    sample = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=True, top_k=0, temperature=1.0)

    def draw(m, seed):
        torch.manual_seed(seed)
        return m.generate(ids, **sample)

    expected = [draw(model, s) for s in (1, 2)]
    assert not torch.equal(expected[0], expected[1])         # it does sample
    patch_model(model)
    assert all(torch.equal(draw(model, s), e) for s, e in zip((1, 2), expected))


def test_forwards_longer_than_max_tokens_run_in_chunks():
    model = tiny_model()
    ids = prompt(batch=3, length=9)                          # a 27-token prefill, chunks of 5
    expected = model.generate(ids, **GREEDY)
    patch_model(model, max_tokens=5)
    assert torch.equal(model.generate(ids, **GREEDY), expected)


def test_bf16_model():
    """A model loaded in bf16 (the usual case): torch's experts round every intermediate to bf16,
    kt's do not. Measured against the f32 model: torch bf16 rel RMS 0.095, kt 0.090 (kt vs
    torch bf16: 0.030); kt must stay within 10% of torch's error."""
    f32 = tiny_model()
    ids = prompt(length=16)
    exact = logits(f32, ids)
    model = copy_of(f32).to(torch.bfloat16)
    torch_error = rel_rms(logits(model, ids).float(), exact)
    patch_model(model)
    got = logits(model, ids)
    assert got.dtype == torch.bfloat16
    assert rel_rms(got.float(), exact) < 1.1 * torch_error
    assert model.generate(ids, **GREEDY).shape == (2, 16 + NEW_TOKENS)


def test_originals_kept_on_request_compute_the_same():
    model = tiny_model()
    patch = patch_model(model, free_originals=False)
    assert patch.freed_bytes == 0
    kt = patch.layers[0]
    torch_experts = kt.original
    h = torch.randn(5, 64)
    ids = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7], [7, 0]])
    w = torch.rand(5, 2)
    with torch.no_grad():
        assert rel_max(kt(h, ids, w), torch_experts(h, ids, w)) < 1e-5
    assert not any(p is torch_experts.gate_up_proj for p in model.parameters())   # not part of the model


# -- bad input ------------------------------------------------------------------------------

def test_unknown_family_lists_the_supported_ones():
    torch.manual_seed(0)
    dense = transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON, num_hidden_layers=1, intermediate_size=64))
    with pytest.raises(KTError, match="'llama' is not an MoE family") as err:
        patch_model(dense)
    for model_type in ("qwen3_moe", "mixtral", "deepseek_v3", "olmoe", "qwen2_moe"):
        assert model_type in str(err.value) and model_type in supported_model_types()


def test_model_without_moe_layers():
    model = tiny_model(mlp_only_layers=[0, 1])
    with pytest.raises(KTError, match="has no MoE layers"):
        patch_model(model)


def tiny_gpt_oss(layers=2):
    """A tiny GPT-OSS (clamped SwiGLU, gate/up and down biases, interleaved gate/up) whose expert
    weights and biases are bf16 values, so kt's BF16 holds exactly the model's."""
    torch.manual_seed(0)
    config = transformers.GptOssConfig(**{**COMMON, "num_key_value_heads": 4}, num_hidden_layers=layers, head_dim=16,
                                       intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, sliding_window=8,
                                       layer_types=["sliding_attention", "full_attention"][:layers])
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".experts." in name:   # biases as large as the products, so they matter
                p.normal_(0.0, 0.3 if "bias" in name else 0.15)
                p.copy_(p.to(torch.bfloat16).float())
    return model


@pytest.mark.parametrize("method,backend,bound", [("FP32", "reference", 1e-5), ("BF16", None, 1e-4)])
def test_gpt_oss_experts_with_biases(method, backend, bound):
    """GPT-OSS's experts — biases on gate/up and down, its clamped SwiGLU (limit 7, alpha 1.702)
    — run on kt (kt_core.MoE(expert_bias=True)) with the logits of torch's own."""
    model = tiny_gpt_oss()
    ids = torch.arange(12).reshape(1, 12) % 128
    with torch.no_grad():
        ref = model(ids).logits
        p = patch_model(model, method=method, backend=backend)
        got = model(ids).logits
    assert all(m.moe.expert_bias and (m.moe.swiglu_limit, m.moe.swiglu_alpha) == (7.0, 1.702) for m in p.layers.values())
    err = ((got - ref).abs().max() / ref.abs().max()).item()
    assert err < bound, err


def test_gpt_oss_gpu_resident_experts():
    """num_gpu_experts on GPT-OSS: the resident experts (here on the CPU device) compute with their
    biases and the clamped SwiGLU as transformers' own experts do, kt the others: torch's logits."""
    model = tiny_gpt_oss()
    ids = torch.arange(12).reshape(1, 12) % 128
    with torch.no_grad():
        ref = model(ids).logits
        p = patch_model(model, method="FP32", backend="reference", num_gpu_experts=3, placement="random")
        got = model(ids).logits
    assert all(sum(m) == 3 for m in p.gpu_masks.values())
    assert all(m.resident_gate_up_bias.shape == (3, 64) and m.swiglu == (7.0, 1.702, False, "silu") for m in p.layers.values())
    err = ((got - ref).abs().max() / ref.abs().max()).item()
    assert err < 1e-5, err


def test_option_errors():
    model = tiny_model()
    with pytest.raises(KTError, match="unknown placement 'hottest'"):
        patch_model(model, num_gpu_experts=2, placement="hottest")
    with pytest.raises(KTError, match=r"num_gpu_experts must be an integer in \[0, 8\]"):
        patch_model(model, num_gpu_experts=9)
    with pytest.raises(KTError, match=r"max_deferred_experts_per_token must be an integer in \[0, 1\]"):
        patch_model(model, max_deferred_experts_per_token=2)
    with pytest.raises(KTError, match="'frequency' needs expert activation counts"):
        patch_model(model, num_gpu_experts=2, placement="frequency")
    assert experts_modules(model)                            # a refused patch changed nothing
    patch_model(model)
    with pytest.raises(KTError, match="already patched"):
        patch_model(model)


# -- hybrid placement -----------------------------------------------------------------------

def test_placement_strategies():
    layers, kw = [1, 2, 3], dict(num_experts=8, num_gpu_experts=3)
    assert gpu_expert_masks("uniform", layers=layers, **kw) == {L: (True,) * 3 + (False,) * 5 for L in layers}
    assert gpu_expert_masks("front-loading", layers=layers, **kw) == {1: (True,) * 8, 2: (True,) + (False,) * 7,
                                                                        3: (False,) * 8}
    rand = gpu_expert_masks("random", layers=layers, **kw)
    assert all(sum(m) == 3 for m in rand.values()) and len(set(rand.values())) > 1
    assert rand == gpu_expert_masks("random", layers=layers, **kw)
    assert rand != gpu_expert_masks("random", layers=layers, seed=7, **kw)
    counts = {1: [9, 0, 0, 0, 0, 0, 0, 8], 2: [1] * 8, 3: [0, 0, 7, 7, 7, 7, 0, 0]}
    freq = gpu_expert_masks("frequency", layers=layers, counts=counts, **kw)
    # the 9 hottest (layer, expert) pairs: 9, 8 in layer 1; the four 7s in layer 3; three 1s in layer 2
    assert [tuple(e for e in range(8) if freq[L][e]) for L in layers] == [(0, 7), (0, 1, 2), (2, 3, 4, 5)]


@pytest.mark.parametrize("placement", ["uniform", "front-loading", "random", "frequency"])
def test_hybrid_split_equals_all_cpu(placement, tmp_path):
    model = tiny_model(num_hidden_layers=3)
    ids = prompt()
    expected = model.generate(ids, **GREEDY)
    expected_logits = logits(model, expected)
    all_cpu = copy_of(model)
    patch_model(all_cpu)
    cpu_logits = logits(all_cpu, expected)

    stats_file = None
    if placement == "frequency":
        stats_file = tmp_path / "stats.json"
        recorder = copy_of(model)
        recording = patch_model(recorder, record_stats=stats_file)
        recorder.generate(prompt(seed=1), **GREEDY)
        recording.save_stats()
    patch = patch_model(model, num_gpu_experts=3, placement=placement, stats_file=stats_file)
    masks = patch.gpu_masks
    assert sum(sum(m) for m in masks.values()) == 9
    for layer, kt in patch.layers.items():
        assert kt.gpu_mask == masks[layer] and kt.resident_gate_up.shape[0] == sum(masks[layer])
        if kt.moe is None:
            assert all(masks[layer])                            # front-loading: layer 0 is all GPU-resident
            continue
        assert kt.moe.gpu_experts_mask == masks[layer]
        resident = [e for e in range(8) if masks[layer][e]]
        if resident:   # kt skips GPU-resident experts: their ids give nothing from kt
            h = torch.randn(4, 64)
            out = kt.moe.forward(h, torch.tensor(resident[:1] * 2).repeat(4, 1), torch.ones(4, 2))
            assert torch.count_nonzero(out) == 0
    # measured <= 2e-5 against both: the picks are the same, summed in a different order
    assert rel_max(logits(model, expected), cpu_logits) < 1e-4
    assert rel_max(logits(model, expected), expected_logits) < 1e-4
    assert torch.equal(model.generate(ids, **GREEDY), expected)


def test_kt_runs_while_torch_computes_the_resident_experts():
    """The order that makes the overlap: kt's forward submitted, torch's experts, then kt's sync."""
    model = tiny_model()
    patch = patch_model(model, num_gpu_experts=4)
    events = []

    class Recording:
        def __init__(self, moe):
            self.moe, self.max_tokens = moe, moe.max_tokens

        def submit(self, *args):
            events.append("kt submit")
            self.moe.submit(*args)

        def sync(self):
            events.append("kt sync")
            return self.moe.sync()

    for kt in patch.layers.values():
        kt.moe = Recording(kt.moe)
        resident = kt._resident
        kt._resident = lambda *a, resident=resident: events.append("torch") or resident(*a)
    model.generate(prompt(), max_new_tokens=2)
    assert events == ["kt submit", "torch", "kt sync"] * 2 * len(patch.layers)


def test_statistics_are_recorded_and_checked(tmp_path):
    model = tiny_model(num_hidden_layers=3)
    path = tmp_path / "sub" / "stats.json"
    patch = patch_model(model, record_stats=path)
    model.generate(prompt(), **GREEDY)
    assert patch.save_stats() == path
    data = json.loads(path.read_text())
    assert data["format"] == "kt-expert-stats" and data["model_type"] == "qwen3_moe" and data["top_k"] == 2
    tokens = 2 * 8 + 2 * (NEW_TOKENS - 1)                      # one prefill of 2 x 8, then 31 steps of 2
    assert sorted(data["layers"]) == ["0", "1", "2"]
    assert all(sum(c) == 2 * tokens and len(c) == 8 for c in data["layers"].values())

    other = tiny_model("mixtral")
    with pytest.raises(KTError, match="recorded on a qwen3_moe model"):
        patch_model(other, num_gpu_experts=2, placement="frequency", stats_file=path)
    path.write_text("{}")
    with pytest.raises(KTError, match="not a kt expert statistics file"):
        patch_model(tiny_model(), num_gpu_experts=2, placement="frequency", stats_file=path)
    with pytest.raises(KTError, match="no expert statistics to save"):
        patch_model(tiny_model()).save_stats()


# -- deferred experts -----------------------------------------------------------------------

def test_lowest_weight_picks():
    w = torch.tensor([[0.5, 0.1, 0.3, 0.1], [0.4, 0.3, 0.2, 0.1], [0.4, 0.3, 0.2, 0.1]])
    exclude = torch.tensor([[False, False, False, False], [False, False, False, True], [True, True, True, False]])
    assert lowest_weight_picks(w, exclude, 2).tolist() == [
        [False, True, False, True],      # the two 0.1s (tie: earlier slot first, both taken)
        [False, True, True, False],      # 0.1 is GPU-resident: never deferred
        [False, False, False, True],     # only one CPU pick left to defer
    ]


class HandDeferred(torch.nn.Module):
    """Deferral written out token by token: the `defer` lowest-weight CPU picks of each token go to
    the next MoE layer's output; GPU-resident experts and the last MoE layer never defer."""

    def __init__(self, experts, order, last, carry, defer, resident):
        super().__init__()
        self.experts, self.order, self.last, self.carry, self.defer, self.resident = (
            experts, order, last, carry, defer, resident)

    def forward(self, h, ids, w):
        out, later = torch.zeros_like(h), torch.zeros_like(h)
        i = self.experts.down_proj.shape[2]
        for t in range(h.shape[0]):
            cpu = [j for j in range(ids.shape[1]) if int(ids[t, j]) not in self.resident]
            lowest = [] if self.last else sorted(cpu, key=lambda j: (float(w[t, j]), j))[:self.defer]
            for j in range(ids.shape[1]):
                e = int(ids[t, j])
                gu = self.experts.gate_up_proj[e] @ h[t]
                y = self.experts.down_proj[e] @ (torch.nn.functional.silu(gu[:i]) * gu[i:])
                (later if j in lowest else out)[t] += w[t, j] * y
        previous = self.carry.pop(self.order - 1, None)
        if not self.last:
            self.carry[self.order] = later
        return out if previous is None else out + previous


def test_deferral_equals_hand_reference():
    model = tiny_model(num_hidden_layers=3, num_experts_per_tok=3)
    ids = prompt()
    plain = logits(model, ids)

    hand = copy_of(model)
    carry = {}
    blocks = [layer.mlp for layer in hand.model.layers]
    for order, block in enumerate(blocks):
        block.experts = HandDeferred(block.experts, order, order == len(blocks) - 1, carry, 1, resident={0, 1})
    expected = logits(hand, ids)
    expected_tokens = hand.generate(ids, **GREEDY)

    patch = patch_model(model, max_deferred_experts_per_token=1, num_gpu_experts=2)
    assert [kt.defer for kt in patch.layers.values()] == [1, 1, 0]
    got = logits(model, ids)
    assert rel_rms(got, expected) < 5e-5                   # measured 4.9e-6
    assert rel_rms(got, plain) > 0.1                       # deferral does change the output: measured 0.38
    assert torch.equal(model.generate(ids, **GREEDY), expected_tokens)


# -- memory ---------------------------------------------------------------------------------

def test_freeing_the_originals_drops_rss():
    """2 layers x 32 experts x (512 x 256 x 3) f32 = 96 MiB of torch expert weights; BF16 packs
    them into 48 MiB. Measured: RSS 492 -> 444 MiB (-47.7 MiB); INT4 (group 128) -82 MiB of an
    expected 82.5."""
    code = r"""
import gc, json, torch, transformers
from kt.integrations.transformers import patch_model
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) * 1024
torch.manual_seed(0)
c = transformers.Qwen3MoeConfig(hidden_size=512, intermediate_size=256, moe_intermediate_size=256, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=32, num_experts_per_tok=4, vocab_size=128)
m = transformers.Qwen3MoeForCausalLM(c).eval()
gc.collect()
before = rss()
patch = patch_model(m, method="BF16")
gc.collect()
after = rss()
packed = sum(kt.moe.packed_bytes for kt in patch.layers.values())
print(json.dumps(dict(before=before, after=after, freed=patch.freed_bytes, packed=packed)))
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    n = json.loads(r.stdout.strip().splitlines()[-1])
    assert n["freed"] == 96 * 2**20 and n["packed"] >= 48 * 2**20
    expected_drop = n["freed"] - n["packed"]
    assert n["before"] - n["after"] > 0.8 * expected_drop, n


def test_module_repr_names_the_kernel():
    model = tiny_model()
    patch_model(model, num_gpu_experts=2)
    text = repr(model.model.layers[0].mlp.experts)
    assert re.search(r"KTExperts\(layer=0, experts=8, gpu_resident=2, kt=BF16 on \S+, deferred_per_token=0\)", text)


# -- the built-in preset --------------------------------------------------------------------

def test_preset_is_written_once_then_loaded(tmp_path, monkeypatch):
    from kt.integrations.transformers import preset

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    torch.manual_seed(123)
    expected_draw = torch.rand(1)
    torch.manual_seed(123)
    folder = preset.ensure_preset()
    assert torch.equal(torch.rand(1), expected_draw)                       # the caller's RNG is left alone
    assert folder == tmp_path / "kt" / "presets" / f"tiny-qwen3-moe-v{preset.VERSION}"
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]       # no temporary folder left
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    model, tokenizer = preset.load_preset()
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp       # loaded, not written again
    assert model.config.model_type == "qwen3_moe" and model.config.num_experts == preset.CONFIG["num_experts"]
    ids = tokenizer("kt: MoE\n").input_ids
    assert len(ids) == 8 and tokenizer.decode(ids) == "kt: MoE\n"
    assert all(p.dtype == torch.float32 and torch.equal(p, p.bfloat16().float()) for p in model.parameters())
    assert len(patch_model(model).layers) == preset.CONFIG["num_hidden_layers"]


MOE_TEXT = dict(COMMON, num_hidden_layers=2, intermediate_size=128, moe_intermediate_size=32, num_experts_per_tok=2)
PIXTRAL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=56,
               patch_size=14)
MULTIMODAL = {   # model_type: (text config, vision config, extra settings); the class from AutoModelForImageTextToText
    "glm4v_moe": (dict(MOE_TEXT, n_routed_experts=8, n_shared_experts=1, first_k_dense_replace=1,
                       rope_parameters=dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=0.5,
                                            mrope_section=[2, 1, 1])),
                  dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64), {}),
    # GLM-5-Next: DeepSeek-V4's clamped SiLU (at a limit the tiny model reaches), hyper-connections.
    "glm5_next": (dict(MOE_TEXT, num_key_value_heads=4, num_hidden_layers=4, n_routed_experts=8, n_shared_experts=1,
                       kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=0, qk_nope_head_dim=16, v_head_dim=16,
                       index_topk=16, index_kpool=4, index_head_dim=16, index_n_heads=2, linear_head_dim=16,
                       linear_num_heads=4, hc_mult=2, swiglu_limit=1.0,
                       mlp_layer_types=["dense", "sparse", "sparse", "sparse"]),
                  dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64,
                       projection_intermediate_size=64, patch_size=14, image_size=56), {}),
    "mistral_large4": (dict(MOE_TEXT, num_key_value_heads=4, head_dim=8, n_routed_experts=8, n_shared_experts=1,
                            kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, index_topk=4,
                            index_head_dim=16, index_n_heads=2, first_k_dense_replace=1),
                       dict(PIXTRAL, head_dim=16), {}),
    # Step-3.7: the limit after SiLU on its MoE layer (1.0: the tiny model reaches it); experts stacked on disk.
    "step3p7": (dict(MOE_TEXT, share_expert_dim=32, n_routed_experts=8, mlp_layer_types=["dense", "sparse"],
                     swiglu_limits=[0, 1.0], sliding_window=8, pad_token_id=0), PIXTRAL, {}),
    # MiniMax-M3: GPT-OSS's clamped SwiGLU without biases (limit and alpha the tiny model reaches).
    "minimax_m3_vl": (dict(MOE_TEXT, intermediate_size=32, dense_intermediate_size=128, shared_intermediate_size=32,
                           rotary_dim=8, num_local_experts=8, mlp_layer_types=["dense", "sparse"], index_n_heads=2,
                           index_head_dim=16, index_block_size=4, index_topk_blocks=2, swiglu_limit=1.0),
                      PIXTRAL, dict(projector_hidden_size=64)),
    # Gemma 4 as released: GELU-tanh experts in its language model.
    "gemma4": (dict(COMMON, initializer_range=0.05, head_dim=16, num_hidden_layers=2, intermediate_size=128,
                    enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=32,
                    hidden_size_per_layer_input=0, layer_types=["sliding_attention", "full_attention"]),
               dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=2, head_dim=16, patch_size=14, position_embedding_size=64), {}),
}


def multimodal(model_type):
    """A tiny image-text-to-text MoE model (no causal-LM class): its language model's config under text_config."""
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64)
    if model_type in MULTIMODAL:
        text, vision, extra = MULTIMODAL[model_type]
        config = transformers.AutoConfig.for_model(model_type, text_config=text, vision_config=vision, **extra)
        return transformers.AutoModelForImageTextToText.from_config(config)
    if model_type == "qwen3_vl_moe":
        text = dict(COMMON, head_dim=16, num_hidden_layers=2, intermediate_size=64, moe_intermediate_size=32,
                    num_experts=8, num_experts_per_tok=2)
        return transformers.Qwen3VLMoeForConditionalGeneration(
            transformers.Qwen3VLMoeConfig(text_config=text, vision_config=vision))
    text = CONFIGS["deepseek_v3"]().to_dict()   # Kimi-K2.5: a DeepSeek-V3 language model
    return transformers.Kimi_K25ForConditionalGeneration(transformers.Kimi_K25Config(text_config=text, vision_config={}))


@pytest.mark.parametrize("model_type", ["qwen3_vl_moe", "kimi_k25", *MULTIMODAL])
def test_multimodal_models_language_model_experts(model_type):
    """Multimodal MoE models (the multimodal model is their only class): the language model's experts
    on kt in the model itself, a text-only forward against torch's."""
    torch.manual_seed(0)
    model = multimodal(model_type).eval()
    with torch.no_grad():
        for m in experts_modules(model):
            for p in (m.gate_up_proj, m.down_proj):
                p.copy_(p.bfloat16().float())
    ids = prompt()
    want = logits(model, ids)
    blocks = len(experts_modules(model))
    patch = patch_model(model, method="BF16")
    assert len(patch.layers) == blocks > 0 and experts_modules(model) == []
    assert rel_max(logits(model, ids), want) < 1e-4


@pytest.mark.parametrize("model_type", ["qwen3_vl_moe", *MULTIMODAL])
def test_multimodal_models_load_without_their_experts(tmp_path, model_type):
    """load_model takes a multimodal model through AutoModelForImageTextToText (no causal-LM class):
    its language model's experts unread, then read from the folder by patch_model — the logits of
    loading the whole model and patching it. (Kimi-K2.5 is not here: transformers 5.25 saves it with
    its vision renames applied to the language model's keys, `blocks.N`, and cannot load the folder.)"""
    from kt.integrations.transformers import load_model
    from kt.integrations.transformers.loading import experts_unloaded

    torch.manual_seed(0)
    multimodal(model_type).to(torch.bfloat16).save_pretrained(tmp_path)
    model = load_model(tmp_path, dtype=torch.float32)
    assert type(model).__name__.endswith("ForConditionalGeneration")
    whole = type(model).from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert sum(experts_unloaded(m) for m in model.modules()) == len(experts_modules(whole)) > 0
    patch_model(model, method="BF16", weight_path=tmp_path)
    patch_model(whole, method="BF16")
    ids = prompt()
    assert torch.equal(logits(model.eval(), ids), logits(whole, ids))


OMNI_TEXT = dict(COMMON, head_dim=16, num_hidden_layers=2, intermediate_size=32, moe_intermediate_size=32, num_experts=8,
                 num_experts_per_tok=2, mlp_only_layers=[0])
OMNI_TOWERS = dict(audio_config=dict(d_model=32, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64,
                                     num_mel_bins=16, output_dim=64, n_window=4, downsample_hidden_size=16),
                   vision_config=dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64,
                                      deepstack_visual_indexes=[0]))


def omni(model_type):
    """A tiny Qwen3-Omni (its talker off: enable_audio_output=False) or its thinker alone."""
    torch.manual_seed(0)
    if model_type == "qwen3_omni_moe":
        config = transformers.AutoConfig.for_model(model_type, thinker_config=dict(text_config=OMNI_TEXT, **OMNI_TOWERS),
                                                   enable_audio_output=False)
        return transformers.AutoModelForMultimodalLM.from_config(config).eval()
    config = transformers.AutoConfig.for_model(model_type, text_config=OMNI_TEXT, **OMNI_TOWERS)
    return transformers.AutoModelForImageTextToText.from_config(config).eval()


@pytest.mark.parametrize("model_type", ["qwen3_omni_moe", "qwen3_omni_moe_thinker"])
def test_qwen3_omni_thinker_experts(tmp_path, model_type):
    """Qwen3-Omni: the thinker's language model (a Qwen3-MoE under thinker_config.text_config) on kt,
    in the whole model and in the thinker alone — a text-only forward against torch's; and load_model
    (AutoModelForMultimodalLM / AutoModelForImageTextToText) of a saved folder, patched with
    weight_path: the logits of loading the whole model and patching it."""
    from kt.integrations.transformers import load_model

    def thinker(m):
        return m.thinker if model_type == "qwen3_omni_moe" else m

    model = omni(model_type)
    with torch.no_grad():
        for m in experts_modules(model):
            for p in (m.gate_up_proj, m.down_proj):
                p.copy_(p.bfloat16().float())
    ids = prompt()
    want = logits(thinker(model), ids)
    patch = patch_model(model, method="BF16")
    assert len(patch.layers) == 1 and experts_modules(model) == []   # layer 0 is dense (mlp_only_layers)
    assert rel_max(logits(thinker(model), ids), want) < 1e-4
    omni(model_type).to(torch.bfloat16).save_pretrained(tmp_path)
    loaded = load_model(tmp_path, dtype=torch.float32)
    whole = type(loaded).from_pretrained(tmp_path, dtype=torch.float32).eval()
    patch_model(loaded, method="BF16", weight_path=tmp_path)
    patch_model(whole, method="BF16")
    assert torch.equal(logits(thinker(loaded.eval()), ids), logits(thinker(whole), ids))
