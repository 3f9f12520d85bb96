// The gated activation of kt_moe_config (kt/plugin.h, ABI 1.2) for one (gate, up) pair, as every
// scalar path computes it: SiLU(g) * u; with swiglu_limit > 0, g = min(g, limit) and u in
// [-limit, limit] first; with swiglu_alpha > 0, g * sigmoid(alpha g) * (u + 1) instead (GPT-OSS).
// SIMD kernels compute the same formula on vectors (kt-backend-avx's gate_mul). Internal
// linkage on purpose, as quant_rules.h: it compiles into translation units of any ISA.
// gated_limit_after: the limit applied after SiLU instead (Step-3.5, Ling-2.5's experts), which no
// backend kernel computes: kt-core applies it to the raw gate / up products (moe_layer.cpp).
#pragma once
#include <cmath>

namespace kt::activation {
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

// min(SiLU(g), limit) * clamp(u, -limit, limit).
template <class T>
inline T gated_limit_after(T limit, T g, T u) {
    T s = g / (T(1) + std::exp(-g));
    s = s < limit ? s : limit;
    u = u < -limit ? -limit : u > limit ? limit : u;
    return s * u;
}

}  // namespace
}  // namespace kt::activation
