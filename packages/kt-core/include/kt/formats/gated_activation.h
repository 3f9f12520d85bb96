// The gated activation of kt_moe_config (kt/plugin.h, ABI 1.2) for one (gate, up) pair, as every
// scalar path computes it: SiLU(g) * u; with swiglu_limit > 0, g = min(g, limit) and u in
// [-limit, limit] first; with swiglu_alpha > 0, g * sigmoid(alpha g) * (u + 1) instead (GPT-OSS).
// SIMD kernels compute the same formula on vectors (kt-backend-avx's gate_mul). Internal
// linkage on purpose, as quant_rules.h: it compiles into translation units of any ISA.
// Two more forms no backend kernel computes, which kt-core applies itself to the kernels' raw
// gate / up products (moe_layer.cpp) and in training's row passes (training_rows.cpp, on vectors):
// the limit after SiLU, min(SiLU(g), limit) * clamp(u, -limit, limit) (Step-3.5, Ling-2.5), and
// GELU's tanh form in place of SiLU, GELU(g) * u (Gemma 4).
#pragma once
#include <cmath>

namespace kt::activation {

// Which gated activation the layer itself applies to raw gate / up products (moe_layer.cpp) and
// training's row passes compute (training_rows.cpp): the kernels' SiLU family (limit / alpha
// shape it), the limit after SiLU, or GELU-tanh. (Outside the internal namespace: MoeLayer holds one.)
enum class GatedForm : int { silu = 0, silu_limit_after = 1, gelu_tanh = 2 };

// GELU's tanh form 0.5 g (1 + tanh(c (g + 0.044715 g^3))), c = sqrt(2 / pi), is computed as
// g * sigmoid(2c (g + 0.044715 g^3)) (tanh z = 2 sigmoid(2z) - 1): SiLU's shape with another
// argument, so the vector paths reuse their sigmoid.
constexpr float kGeluTanhScale = 1.5957691216057308f;   // 2 sqrt(2 / pi)
constexpr float kGeluTanhCubic = 0.044715f;

namespace {

template <class T>
inline T gated(T limit, T alpha, T g, T u) {
    if (limit > 0) {
        g = g < limit ? g : limit;
        u = u < -limit ? -limit : u > limit ? limit : u;
    }
    if (alpha > 0) return g / (T(1) + std::exp(-alpha * g)) * (u + T(1));
    return g / (T(1) + std::exp(-g)) * u;
}

}  // namespace
}  // namespace kt::activation
