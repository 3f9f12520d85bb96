"""kt's tiny remote-code DeepSeek-V3 / Kimi-K2 style model (see __init__.py). What matters to kt is
the MoE block: `experts` is an nn.ModuleList of per-expert MLPs (gate_proj, up_proj, down_proj, the
same class as the shared experts and the dense layers' MLPs), `gate` returns (top-k indices, top-k
weights) — with topk_method "noaux_tc" (DeepSeek-V3, Kimi-K2: no training branch) — or, DeepSeek-V2's
form, a third item, the balance loss it computes in training with aux_loss_alpha > 0; the block's
forward runs its own `moe_infer` loop in eval mode only. Attention is plain causal multi-head
attention without a cache (generate() runs the whole sequence at every step)."""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_outputs import CausalLMOutput

from .configuration_deepseek import DeepseekV3Config


class DeepseekV3RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class DeepseekV3MLP(nn.Module):
    def __init__(self, config, intermediate_size=None):
        super().__init__()
        inter = intermediate_size or config.intermediate_size
        self.gate_proj = nn.Linear(config.hidden_size, inter, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, inter, bias=False)
        self.down_proj = nn.Linear(inter, config.hidden_size, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class MoEGate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.topk_method, self.alpha = config.topk_method, config.aux_loss_alpha
        self.weight = nn.Parameter(torch.empty(config.n_routed_experts, config.hidden_size))
        if config.topk_method == "noaux_tc":
            self.e_score_correction_bias = nn.Parameter(torch.zeros(config.n_routed_experts))

    def forward(self, hidden_states):
        c = self.config
        h = hidden_states.reshape(-1, hidden_states.shape[-1])
        logits = F.linear(h.float(), self.weight.float())
        scores = logits.sigmoid() if c.scoring_func == "sigmoid" else logits.softmax(-1)
        if c.topk_method == "noaux_tc":
            assert not self.training, "this router has no training branch"
            choice = scores + self.e_score_correction_bias.float()
            groups = choice.view(h.shape[0], c.n_group, -1).topk(2, dim=-1).values.sum(-1)
            keep = torch.zeros_like(groups).scatter_(1, groups.topk(c.topk_group, dim=-1).indices, 1.0)
            mask = keep.repeat_interleave(c.n_routed_experts // c.n_group, dim=1).bool()
            topk_idx = choice.masked_fill(~mask, float("-inf")).topk(c.num_experts_per_tok, dim=-1).indices
            topk_weight = scores.gather(1, topk_idx)
        else:
            topk_weight, topk_idx = scores.topk(c.num_experts_per_tok, dim=-1)
        if c.num_experts_per_tok > 1 and c.norm_topk_prob:
            topk_weight = topk_weight / (topk_weight.sum(-1, keepdim=True) + 1e-20)
        topk_weight = topk_weight * c.routed_scaling_factor
        if c.topk_method == "noaux_tc":
            return topk_idx, topk_weight
        # DeepSeek-V2's form: a balance loss third, in training with aux_loss_alpha > 0 only.
        aux_loss = None
        if self.training and self.alpha > 0:
            routed = F.one_hot(topk_idx.reshape(-1), c.n_routed_experts).float().mean(0) * c.n_routed_experts
            aux_loss = (scores.mean(0) * routed).sum() * self.alpha
        return topk_idx, topk_weight, aux_loss


class DeepseekV3MoE(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.experts = nn.ModuleList(DeepseekV3MLP(config, config.moe_intermediate_size)
                                     for _ in range(config.n_routed_experts))
        self.gate = MoEGate(config)
        if config.n_shared_experts:
            self.shared_experts = DeepseekV3MLP(config, config.moe_intermediate_size * config.n_shared_experts)

    def forward(self, hidden_states):
        identity, shape = hidden_states, hidden_states.shape
        topk_idx, topk_weight, *_ = self.gate(hidden_states)
        if self.training:
            raise NotImplementedError("this MoE block runs in eval mode only")
        y = self.moe_infer(hidden_states.reshape(-1, shape[-1]), topk_idx, topk_weight).view(*shape)
        if self.config.n_shared_experts:
            y = y + self.shared_experts(identity)
        return y

    @torch.no_grad()
    def moe_infer(self, x, topk_ids, topk_weight):
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e, expert in enumerate(self.experts):
            token, pick = torch.where(topk_ids == e)
            if token.numel():
                out.index_add_(0, token, expert(x[token]).float() * topk_weight[token, pick, None])
        return out.to(x.dtype)


class DeepseekV3Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads = config.num_attention_heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            nn.Linear(config.hidden_size, config.hidden_size, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = (p(x).view(b, s, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        return self.o_proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h))


class DeepseekV3DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = DeepseekV3Attention(config)
        moe = layer_idx >= config.first_k_dense_replace and layer_idx % config.moe_layer_freq == 0
        self.mlp = DeepseekV3MoE(config) if moe else DeepseekV3MLP(config)
        self.input_layernorm = DeepseekV3RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = DeepseekV3RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class DeepseekV3PreTrainedModel(PreTrainedModel):
    config_class = DeepseekV3Config
    base_model_prefix = "model"
    _no_split_modules = ["DeepseekV3DecoderLayer"]

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear | nn.Embedding):
            module.weight.data.normal_(mean=0.0, std=std)
        elif isinstance(module, MoEGate):
            module.weight.data.normal_(mean=0.0, std=std)
            if hasattr(module, "e_score_correction_bias"):
                module.e_score_correction_bias.data.uniform_(-0.05, 0.05)


class DeepseekV3Model(DeepseekV3PreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DeepseekV3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = DeepseekV3RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class DeepseekV3ForCausalLM(DeepseekV3PreTrainedModel, GenerationMixin):
    def __init__(self, config):
        super().__init__(config)
        self.model = DeepseekV3Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids}   # no cache: every step runs the whole sequence

    def forward(self, input_ids, labels=None, **kwargs):
        logits = self.lm_head(self.model(input_ids)).float()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                   ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)
