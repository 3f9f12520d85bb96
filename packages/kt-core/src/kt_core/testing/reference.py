"""Float64 NumPy MoE: the ground truth tests and `kt demo` compare kt against."""

from __future__ import annotations

import numpy as np


def bf16_round(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), returned as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, out).astype(np.float32)


def gated(a: np.ndarray, b: np.ndarray, swiglu_limit: float = 0.0, swiglu_alpha: float = 0.0,
          limit_after_act: bool = False, gate_activation: str = "silu") -> np.ndarray:
    """The expert MLP's activation of gate a and up b: SiLU(a) * b, or the clamped SwiGLU
    (kt/plugin.h): a = min(a, limit), b in [-limit, limit] when limit > 0; a * sigmoid(alpha a) *
    (b + 1) when alpha > 0 (GPT-OSS: limit 7, alpha 1.702). limit_after_act: min(SiLU(a), limit) *
    clamp(b, -limit, limit) instead (Step-3.5, Ling-2.5). gate_activation "gelu_tanh": GELU's tanh
    form of a, times b (Gemma 4), written with tanh as torch's gelu(approximate="tanh") is."""
    if gate_activation == "gelu_tanh":
        return 0.5 * a * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (a + 0.044715 * a ** 3))) * b
    if limit_after_act:
        silu = a / (1.0 + np.exp(-a))
        return np.minimum(silu, swiglu_limit) * np.clip(b, -swiglu_limit, swiglu_limit)
    if swiglu_limit > 0:
        a, b = np.minimum(a, swiglu_limit), np.clip(b, -swiglu_limit, swiglu_limit)
    if swiglu_alpha > 0:
        return a / (1.0 + np.exp(-swiglu_alpha * a)) * (b + 1.0)
    return a / (1.0 + np.exp(-a)) * b


def moe_reference(hidden, gate, up, down, topk_ids, topk_weights, gpu_experts_mask=None, *, swiglu_limit: float = 0.0,
                  swiglu_alpha: float = 0.0, biases=None, activations=None, limit_after_act: bool = False,
                  gate_activation: str = "silu") -> np.ndarray:
    """out[t] = sum_j w[t,j] * down_e(SiLU(gate_e x) * up_e x) (or the clamped SwiGLU: gated()),
    in float64; ids < 0 and GPU-resident experts contribute nothing. biases: (gate [E, I], up
    [E, I], down [E, H]) added to each product, before the activation for gate and up.
    activations: what the kernels carry of a product's input, applied to x (and to the f32
    intermediate) before each product, e.g. ggml_blocks.q8k_activations, or a pair (for x, for
    the intermediate) as ggml_blocks.llama_activations gives; None: exact."""
    carry, carry_down = activations if isinstance(activations, tuple) else (activations, activations)
    x = np.asarray(hidden, dtype=np.float64)
    g, u, d = (np.asarray(m, dtype=np.float64) for m in (gate, up, down))
    bg, bu, bd = (np.zeros((g.shape[0], g.shape[1])), np.zeros((g.shape[0], g.shape[1])), np.zeros((d.shape[0], d.shape[1]))) \
        if biases is None else (np.asarray(b, dtype=np.float64) for b in biases)
    ids = np.asarray(topk_ids)
    w = np.asarray(topk_weights, dtype=np.float64)
    out = np.zeros((x.shape[0], d.shape[1]), dtype=np.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e < 0 or (gpu_experts_mask is not None and gpu_experts_mask[e]):
                continue
            xt = x[t] if carry is None else carry(x[t])
            a = g[e] @ xt + bg[e]
            inter = gated(a, u[e] @ xt + bu[e], swiglu_limit, swiglu_alpha, limit_after_act, gate_activation)
            if carry_down is not None:   # the kernels hand down an f32 intermediate
                inter = carry_down(inter.astype(np.float32))
            out[t] += w[t, j] * (d[e] @ inter + bd[e])
    return out


def relative_error(actual, expected) -> float:
    """max |actual - expected| / RMS(expected): the error measure every tolerance uses."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    rms = float(np.sqrt(np.mean(expected**2))) or 1.0
    return float(np.max(np.abs(actual - expected))) / rms


def random_moe(rng: np.random.Generator, experts: int, hidden: int, intermediate: int, scale: float = 1.0):
    """Random expert weights scaled like trained ones (unit-variance outputs), float32."""
    gate = rng.standard_normal((experts, intermediate, hidden), dtype=np.float32) * np.float32(scale / np.sqrt(hidden))
    up = rng.standard_normal((experts, intermediate, hidden), dtype=np.float32) * np.float32(scale / np.sqrt(hidden))
    down = rng.standard_normal((experts, hidden, intermediate), dtype=np.float32) * np.float32(scale / np.sqrt(intermediate))
    return gate, up, down


def random_routing(rng: np.random.Generator, tokens: int, experts: int, top_k: int):
    """Distinct experts per token with softmax-normalised weights, like a real router."""
    ids = np.stack([rng.choice(experts, size=top_k, replace=False) for _ in range(tokens)]).astype(np.int64)
    logits = rng.standard_normal((tokens, top_k)).astype(np.float32)
    weights = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return ids.reshape(tokens, top_k), weights.astype(np.float32)
